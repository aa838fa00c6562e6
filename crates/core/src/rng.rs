//! SplitMix64: the small seeded generator of workloads, benchmarks and simulations. The same
//! seed gives the same sequence on every machine and build, so a run prints its seed and
//! replays exactly; it is not for anything secret.

/// The golden-ratio increment of SplitMix64's state.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function: a bijection on `u64` (distinct inputs give distinct
/// outputs) that mixes every input bit into every output bit.
pub fn mix64(value: u64) -> u64 {
    let mut mixed = value;
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    mixed ^ (mixed >> 31)
}

/// A SplitMix64 generator. Promises: the sequence is a pure function of the seed, its period
/// is 2^64, and two generators whose seeds differ differ in their first output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose sequence is determined by `seed` alone.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A value in `0..bound`; the caller guarantees `bound > 0` (a zero bound panics).
    /// Slightly biased towards small values when `bound` does not divide 2^64, which no
    /// workload of this crate can measure.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    /// True with a probability of `percent` in 100 (always for 100 and above).
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_splitmix64() {
        // The reference outputs of SplitMix64 seeded with 1234567 (Vigna's splitmix64.c).
        let mut rng = SplitMix64::new(1_234_567);
        let expected = [
            6_457_827_717_110_365_317,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
        ];
        for value in expected {
            assert_eq!(rng.next_u64(), value);
        }
        let mut bounded = SplitMix64::new(9);
        assert!((0..1000).all(|_| bounded.below(7) < 7));
        assert!((0..1000).all(|_| bounded.chance(100)));
        assert!((0..1000).all(|_| !bounded.chance(0)));
    }
}
