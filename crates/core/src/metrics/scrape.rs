//! Reading a running process's `/metrics` from outside it: what tests, benchmarks and
//! `kvtier top` use to see what the cluster exports, and the parser of the text format
//! they share.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long connecting to an exporter, and then each read, may take: an exporter answers
/// at once, and a reader refreshing every second must not hang on a host that is gone.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest response read: a process exports a few hundred series (pool labels are bounded
/// by `POOL_LABELS_MAX`), far below this; a larger answer is cut here, never buffered whole.
pub const SCRAPE_BYTES_MAX: u64 = 16 << 20;
/// Labels kept per sample: kvtier's families have at most three; more are ignored.
const SAMPLE_LABELS_MAX: usize = 8;

/// Fetches `/metrics` from an exporter (a plain HTTP/1.1 GET), at most
/// [`SCRAPE_BYTES_MAX`] bytes of it.
pub fn scrape_metrics(address: SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, SCRAPE_TIMEOUT)?;
    stream.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: kvtier\r\n\r\n")?;
    let mut body = String::new();
    stream.take(SCRAPE_BYTES_MAX).read_to_string(&mut body)?;
    Ok(body)
}

/// One sample of a Prometheus text body: series name, labels in their order, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(label, _)| label == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Every sample of a Prometheus text body (format 0.0.4), HTTP headers before it skipped.
/// Comments and lines that do not parse are skipped: a reader shows what it understands.
pub fn parse_samples(body: &str) -> Vec<Sample> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(parse_sample)
        .collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return None;
    }
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(inside) => parse_labels(inside)?,
        None => (Vec::new(), &line[name_end..]),
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `a="x",b="y"}` and returns the labels and what follows the `}`.
fn parse_labels(mut text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (label, after) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (index, '"') => break index,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, other) => value.push(other),
            }
        };
        if labels.len() < SAMPLE_LABELS_MAX {
            labels.push((label.trim().to_owned(), value));
        }
        text = &after[end + 1..];
    }
}

/// Scrapes `address` until `holds` is true of the body, for at most `timeout`: metrics are
/// exported on timers, so a reader waits for them rather than racing them. `false` on
/// timeout.
pub fn wait_for_metrics(
    address: SocketAddr,
    timeout: Duration,
    holds: impl Fn(&str) -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if scrape_metrics(address).is_ok_and(|body| holds(&body)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of an unlabelled counter or gauge in a Prometheus text body.
pub fn metric_value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse_with_labels_escapes_and_infinities() {
        let body = "HTTP/1.1 200 OK\r\n\r\n# HELP x y\n\
            kvtier_leases 3\n\
            kvtier_pool_bytes{pool=\"1\",state=\"ready\"} 4096\n\
            kvtier_request_duration_seconds_bucket{op=\"acquire\",le=\"+Inf\"} 7\n\
            odd{name=\"a\\\"b\\\\c\"} 1e3\n\
            broken{pool=\"1\" 5\n";
        let samples = parse_samples(body);
        assert_eq!(samples.len(), 4, "{samples:?}");
        assert_eq!(samples[0].name, "kvtier_leases");
        assert_eq!(samples[0].value, 3.0);
        assert_eq!(samples[1].label("state"), Some("ready"));
        assert_eq!(samples[1].label("pool"), Some("1"));
        assert_eq!(samples[2].label("le"), Some("+Inf"));
        assert_eq!(samples[3].label("name"), Some("a\"b\\c"));
        assert_eq!(samples[3].value, 1000.0);
        assert_eq!(metric_value(body, "kvtier_leases"), Some(3.0));
    }
}
