//! Free loopback ports for the processes a local cluster or etcd server starts. A port is
//! found free by binding port 0 and letting go, and the process that will listen on it binds
//! it later: meanwhile another start in this process (a standby's metrics, a cluster of a
//! test running beside) could be handed the same port. So a port is never handed out twice
//! by one process.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::Mutex;

/// Ports handed out by this process, by protocol (`true`: TCP). Bounded by the port space:
/// at most 2 × 65,536 entries, a few per cluster in practice.
static HANDED_OUT: Mutex<Option<HashSet<(bool, u16)>>> = Mutex::new(None);
/// Binds tried before giving up on finding a port not handed out yet.
const TRIES: usize = 64;

/// A loopback TCP port free now and never handed out before by this process.
pub fn free_tcp_port() -> anyhow::Result<SocketAddr> {
    free_port(true, || Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?))
}

/// A loopback UDP port free now and never handed out before by this process.
pub fn free_udp_port() -> anyhow::Result<SocketAddr> {
    free_port(false, || Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?))
}

fn free_port(
    tcp: bool,
    bind: impl Fn() -> anyhow::Result<SocketAddr>,
) -> anyhow::Result<SocketAddr> {
    for _ in 0..TRIES {
        let address = bind()?;
        let mut handed_out = HANDED_OUT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if handed_out
            .get_or_insert_with(HashSet::new)
            .insert((tcp, address.port()))
        {
            return Ok(address);
        }
    }
    anyhow::bail!("no free loopback port not handed out already after {TRIES} tries")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A port the kernel offers again after it was handed out is skipped for the next one.
    /// (Ports 1 and 2 are below every ephemeral range: no real bind hands them out.)
    #[test]
    fn a_port_is_handed_out_once() {
        let offers = [1, 1, 1, 2];
        let next = Cell::new(0);
        let bind = || {
            let port = offers[next.get()];
            next.set(next.get() + 1);
            Ok(SocketAddr::from(([127, 0, 0, 1], port)))
        };
        assert_eq!(free_port(true, bind).unwrap().port(), 1);
        assert_eq!(free_port(true, bind).unwrap().port(), 2);
        assert_eq!(next.get(), 4);
        // The same port number over UDP is another port.
        assert_eq!(
            free_port(false, || Ok(SocketAddr::from(([127, 0, 0, 1], 1))))
                .unwrap()
                .port(),
            1
        );
        assert!(free_tcp_port().unwrap().port() > 2);
    }
}
