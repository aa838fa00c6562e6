//! A fixed-size log-linear latency histogram: 64 power-of-two ranges of nanoseconds, each
//! split into 16 linear buckets, so any percentile is within 1/16 (6%) of the true value
//! and memory is constant whatever the sample count.

use std::time::Duration;

const SUB_BUCKETS: usize = 16;
const RANGES: usize = 64;

/// Latency samples in constant memory.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max_nanos: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; SUB_BUCKETS * RANGES],
            total: 0,
            max_nanos: 0,
        }
    }
}

fn bucket(nanos: u64) -> usize {
    if nanos < SUB_BUCKETS as u64 {
        return nanos as usize;
    }
    let range = 63 - nanos.leading_zeros() as usize;
    let shift = range - 4;
    let sub = ((nanos >> shift) as usize) & (SUB_BUCKETS - 1);
    (range - 3) * SUB_BUCKETS + sub
}

fn bucket_floor(index: usize) -> u64 {
    if index < SUB_BUCKETS {
        return index as u64;
    }
    let range = index / SUB_BUCKETS + 3;
    let sub = (index % SUB_BUCKETS) as u64;
    (1u64 << range) | (sub << (range - 4))
}

impl Histogram {
    /// Records one sample.
    pub fn record(&mut self, sample: Duration) {
        let nanos = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX);
        let last = self.counts.len() - 1;
        self.counts[bucket(nanos).min(last)] += 1;
        self.total += 1;
        self.max_nanos = self.max_nanos.max(nanos);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `quantile` (0..=1) as a lower bucket bound; zero when empty.
    pub fn quantile(&self, quantile: f64) -> Duration {
        let rank = ((self.total as f64) * quantile).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Duration::from_nanos(bucket_floor(index).min(self.max_nanos));
            }
        }
        Duration::from_nanos(self.max_nanos)
    }

    /// The largest sample.
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_one_sub_bucket() {
        let mut histogram = Histogram::default();
        for micros in 1..=1000u64 {
            histogram.record(Duration::from_micros(micros));
        }
        let p50 = histogram.quantile(0.5).as_micros() as f64;
        let p99 = histogram.quantile(0.99).as_micros() as f64;
        assert!((p50 - 500.0).abs() / 500.0 < 0.07, "{p50}");
        assert!((p99 - 990.0).abs() / 990.0 < 0.07, "{p99}");
        assert_eq!(histogram.max(), Duration::from_micros(1000));
        assert_eq!(Histogram::default().quantile(0.5), Duration::ZERO);
        for nanos in [0u64, 1, 15, 16, 17, 1000, 1 << 40, u64::MAX] {
            assert!(bucket_floor(bucket(nanos)) <= nanos, "{nanos}");
        }
    }
}
