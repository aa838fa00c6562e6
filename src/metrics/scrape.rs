//! Reading a running process's `/metrics` from outside it: what tests, benchmarks and
//! `kvtier top`-style readers use to see what the cluster exports.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Fetches `/metrics` from an exporter (a plain HTTP/1.1 GET on loopback).
pub fn scrape_metrics(address: SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: kvtier\r\n\r\n")?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
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
