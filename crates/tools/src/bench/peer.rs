//! Node-to-node transfer speed: 4 MiB objects sent over the peer QUIC endpoint
//! ([`kvtier_core::wire::peer`]: mutual TLS, the transfer header and verdicts) between two
//! endpoints on loopback, against the same exchange over TLS 1.3 on TCP (rustls, the same
//! cluster certificates, the same object size and number of objects in flight) in the same
//! run. QUIC runs twice: with the datagram size asked for (loopback carries large ones) and
//! with [`DATAGRAM_BYTES_SAFE`], what a 1500-byte MTU network allows.
//!
//! Both receivers copy each object into a buffer allocated and written before the clock
//! starts, one per object in flight (a TLS connection's, a QUIC stream slot's), as a node
//! copies into its pre-faulted pool; both senders write from one source buffer. The rounds
//! interleave the transports and each figure is the median of its rounds.

use anyhow::{bail, Context};
use kvtier_core::wire::certs::init_cluster_certs;
use kvtier_core::wire::peer::{
    self, read_verdict, write_verdict, TransferHeader, Verdict, DATAGRAM_BYTES_SAFE, HEADER_BYTES,
};
use kvtier_core::wire::{quic, tls};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Options of the transfer measurement.
#[derive(Clone, Debug, clap::Args)]
pub struct PeerBenchArgs {
    /// Size of each object, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub object_bytes: usize,
    /// Objects sent per round and transport.
    #[arg(long, default_value_t = 128)]
    pub objects: usize,
    /// Objects in flight at once (QUIC streams on one connection; TLS connections).
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// UDP payload size of the tuned QUIC run, in bytes.
    #[arg(long, default_value_t = 32_768)]
    pub datagram_bytes: u16,
    /// Rounds; each figure is the median over them.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The measurement's figures, in GB/s (10^9 bytes per second) of object bytes delivered.
#[derive(Clone, Debug, Serialize)]
pub struct PeerReport {
    /// QUIC with `datagram_bytes` datagrams.
    pub quic_gbps: f64,
    /// The datagram size the tuned connection reached (MTU discovery), in bytes.
    pub quic_datagram_bytes_reached: u16,
    /// QUIC with 1452-byte datagrams (a 1500-byte MTU path).
    pub quic_1500_mtu_gbps: f64,
    /// TLS 1.3 over TCP, the baseline.
    pub tls_tcp_gbps: f64,
    /// `quic_gbps / tls_tcp_gbps` (target at least 0.5).
    pub quic_ratio: f64,
    /// `quic_1500_mtu_gbps / tls_tcp_gbps`.
    pub quic_1500_mtu_ratio: f64,
    pub object_bytes: usize,
    pub objects: usize,
    pub concurrency: usize,
    pub datagram_bytes: u16,
}

/// Runs the measurement and prints it (text, or one JSON object).
pub fn run(args: &PeerBenchArgs) -> anyhow::Result<()> {
    let report = measure(args)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "peer transfer of {} objects of {} bytes, {} in flight:",
            report.objects, report.object_bytes, report.concurrency
        );
        println!(
            "  QUIC, {} B datagrams ({} reached)  {:.2} GB/s  ratio {:.2} of TLS over TCP",
            report.datagram_bytes,
            report.quic_datagram_bytes_reached,
            report.quic_gbps,
            report.quic_ratio
        );
        println!(
            "  QUIC, {DATAGRAM_BYTES_SAFE} B datagrams  {:.2} GB/s  ratio {:.2}",
            report.quic_1500_mtu_gbps, report.quic_1500_mtu_ratio
        );
        println!("  TLS 1.3 over TCP      {:.2} GB/s", report.tls_tcp_gbps);
    }
    Ok(())
}

/// Measures QUIC (tuned and 1500-MTU) and TLS over TCP, interleaved over the rounds.
pub fn measure(args: &PeerBenchArgs) -> anyhow::Result<PeerReport> {
    if args.object_bytes == 0 || args.objects == 0 || args.concurrency == 0 || args.rounds == 0 {
        bail!("object size, objects, concurrency and rounds must be positive");
    }
    let certs = CertsFolder::create()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rng = kvtier_core::rng::SplitMix64::new(7);
    let source: Arc<Vec<u8>> = Arc::new(
        (0..args.object_bytes)
            .map(|_| rng.next_u64() as u8)
            .collect(),
    );
    let mut quic = Vec::new();
    let mut reached = 0;
    let mut quic_safe = Vec::new();
    let mut tls_tcp = Vec::new();
    for _ in 0..args.rounds {
        let (round_gbps, round_reached) =
            runtime.block_on(quic_round(&certs.path, args, args.datagram_bytes, &source))?;
        quic.push(round_gbps);
        reached = round_reached;
        tls_tcp.push(tls_round(&certs.path, args, &source)?);
        let (safe_gbps, _) =
            runtime.block_on(quic_round(&certs.path, args, DATAGRAM_BYTES_SAFE, &source))?;
        quic_safe.push(safe_gbps);
    }
    let (quic_gbps, quic_1500_mtu_gbps, tls_tcp_gbps) =
        (median(quic), median(quic_safe), median(tls_tcp));
    Ok(PeerReport {
        quic_gbps,
        quic_datagram_bytes_reached: reached,
        quic_1500_mtu_gbps,
        tls_tcp_gbps,
        quic_ratio: quic_gbps / tls_tcp_gbps,
        quic_1500_mtu_ratio: quic_1500_mtu_gbps / tls_tcp_gbps,
        object_bytes: args.object_bytes,
        objects: args.objects,
        concurrency: args.concurrency,
        datagram_bytes: args.datagram_bytes,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A fresh cluster CA with two node certificates, removed when dropped.
struct CertsFolder {
    path: PathBuf,
}

impl CertsFolder {
    fn create() -> anyhow::Result<CertsFolder> {
        let path = std::env::temp_dir().join(format!("kvtier-bench-peer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        init_cluster_certs(&path, &["node-a".into(), "node-b".into()], false)?;
        Ok(CertsFolder { path })
    }
}

impl Drop for CertsFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

const LOOPBACK: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// One QUIC round: node-b serves, node-a sends `objects` over one connection with
/// `concurrency` streams at a time. Returns GB/s from the first header to the last verdict,
/// and the datagram size the connection reached.
async fn quic_round(
    certs: &Path,
    args: &PeerBenchArgs,
    datagram_bytes: u16,
    source: &Arc<Vec<u8>>,
) -> anyhow::Result<(f64, u16)> {
    let server_config = peer::server_config(certs, "node-b", datagram_bytes)?;
    let server = peer::endpoint(LOOPBACK, Some(server_config), datagram_bytes)?;
    let address = server.local_addr()?;
    let object_bytes = args.object_bytes;
    // One target per stream slot, every page written once (a fresh allocation per stream
    // would fault its pages in inside the clock, which a node's pre-faulted pool never does).
    let targets: Targets = Arc::new(std::sync::Mutex::new(
        (0..args.concurrency)
            .map(|_| vec![1u8; object_bytes])
            .collect(),
    ));
    let serving = tokio::spawn(async move {
        let incoming = server.accept().await.context("no connection")?;
        let connection = incoming.await?;
        let mut streams = Vec::new();
        while let Ok((send, receive)) = connection.accept_bi().await {
            let targets = targets.clone();
            streams.push(tokio::spawn(quic_receive(
                send,
                receive,
                object_bytes,
                targets,
            )));
        }
        for stream in streams {
            stream.await??;
        }
        anyhow::Ok(())
    });
    let client = peer::endpoint(LOOPBACK, None, datagram_bytes)?;
    let client_config = peer::client_config(certs, "node-a", datagram_bytes)?;
    let connection = quic::connect(&client, address, "node-b", client_config).await?;
    // Warm-up: one object per stream slot, outside the clock.
    send_quic_objects(&connection, args.concurrency, args.concurrency, source).await?;
    let started = Instant::now();
    send_quic_objects(&connection, args.objects, args.concurrency, source).await?;
    let elapsed = started.elapsed();
    let reached = connection.stats().path.current_mtu;
    connection.close(0u32.into(), b"done");
    serving.await??;
    Ok((gbps(args.objects * args.object_bytes, elapsed), reached))
}

fn gbps(bytes: usize, elapsed: std::time::Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e9
}

/// Sends `objects` objects, `concurrency` streams at a time, each to its verdict.
async fn send_quic_objects(
    connection: &quinn::Connection,
    objects: usize,
    concurrency: usize,
    source: &Arc<Vec<u8>>,
) -> anyhow::Result<()> {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    stream::iter(0..objects)
        .map(|index| async move {
            let (mut send, mut receive) = connection.open_bi().await?;
            let header = TransferHeader {
                task: index as u64,
                target_replica: index as u64,
                token: index as u64,
                length_bytes: source.len() as u64,
            };
            send.write_all(&header.encode()).await?;
            if read_verdict(&mut receive).await? != Verdict::Accepted {
                bail!("transfer {index} refused");
            }
            send.write_all(source).await?;
            send.finish()?;
            match read_verdict(&mut receive).await? {
                Verdict::Committed => Ok(()),
                other => bail!("transfer {index} ended {other:?}"),
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await
}

/// The receivers' buffers not in use (one per stream slot).
type Targets = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// The receiving side of one QUIC transfer: header, verdict, the bytes into a buffer
/// taken from `targets` (a fresh one only if every one is in use), verdict.
async fn quic_receive(
    mut send: quinn::SendStream,
    mut receive: quinn::RecvStream,
    object_bytes: usize,
    targets: Targets,
) -> anyhow::Result<()> {
    let mut header = [0; HEADER_BYTES];
    receive.read_exact(&mut header).await?;
    let header = TransferHeader::decode(&header)?;
    if header.length_bytes != object_bytes as u64 {
        write_verdict(&mut send, Verdict::Failed).await?;
        bail!("unexpected length {}", header.length_bytes);
    }
    write_verdict(&mut send, Verdict::Accepted).await?;
    let taken = targets
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .pop();
    let mut target = taken.unwrap_or_else(|| vec![0u8; object_bytes]);
    let mut done = 0;
    while let Some(chunk) = receive.read_chunk(object_bytes - done, true).await? {
        target[done..done + chunk.bytes.len()].copy_from_slice(&chunk.bytes);
        done += chunk.bytes.len();
        if done == object_bytes {
            break;
        }
    }
    let verdict = if done == object_bytes {
        Verdict::Committed
    } else {
        Verdict::Failed
    };
    std::hint::black_box(&target);
    // Back before the verdict: the sender opens its next stream once it reads it, and that
    // stream must find a buffer, not allocate one inside the clock.
    targets
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(target);
    write_verdict(&mut send, verdict).await?;
    send.finish()?;
    Ok(())
}

/// One TLS-over-TCP round: `concurrency` connections, each on its own sender and receiver
/// thread, sending their share of the objects with the same header and verdicts.
fn tls_round(certs: &Path, args: &PeerBenchArgs, source: &Arc<Vec<u8>>) -> anyhow::Result<f64> {
    let server_config = Arc::new(tls::rustls_server_config(certs, "node-b")?);
    let client_config = Arc::new(tls::rustls_client_config(certs, "node-a")?);
    let listener = TcpListener::bind(LOOPBACK)?;
    let address = listener.local_addr()?;
    let object_bytes = args.object_bytes;
    let connections = args.concurrency;
    let receivers = std::thread::spawn(move || -> anyhow::Result<()> {
        let mut threads = Vec::new();
        for _ in 0..connections {
            let (stream, _) = listener.accept()?;
            let config = server_config.clone();
            threads.push(std::thread::spawn(move || {
                tls_receive(stream, config, object_bytes)
            }));
        }
        for thread in threads {
            thread
                .join()
                .map_err(|_| anyhow::anyhow!("a TLS receiver panicked"))??;
        }
        Ok(())
    });
    let mut senders = Vec::new();
    let barrier = Arc::new(std::sync::Barrier::new(connections + 1));
    for connection in 0..connections {
        let share =
            args.objects / connections + usize::from(connection < args.objects % connections);
        let (config, source, barrier) = (client_config.clone(), source.clone(), barrier.clone());
        senders.push(std::thread::spawn(move || {
            tls_send(address, config, &source, share, &barrier)
        }));
    }
    barrier.wait();
    let started = Instant::now();
    for sender in senders {
        sender
            .join()
            .map_err(|_| anyhow::anyhow!("a TLS sender panicked"))??;
    }
    let elapsed = started.elapsed();
    receivers
        .join()
        .map_err(|_| anyhow::anyhow!("the TLS receivers panicked"))??;
    Ok(gbps(args.objects * args.object_bytes, elapsed))
}

/// One TLS sender: connects, sends one warm-up object, waits at `barrier`, then sends
/// `objects` objects one after another, each to its final verdict.
fn tls_send(
    address: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    source: &[u8],
    objects: usize,
    barrier: &std::sync::Barrier,
) -> anyhow::Result<()> {
    let stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from("node-b")?.to_owned();
    let connection = rustls::ClientConnection::new(config, name)?;
    let mut tls = rustls::StreamOwned::new(connection, stream);
    let mut send_one = |index: usize| -> anyhow::Result<()> {
        let header = TransferHeader {
            task: index as u64,
            target_replica: index as u64,
            token: index as u64,
            length_bytes: source.len() as u64,
        };
        tls.write_all(&header.encode())?;
        tls.flush()?;
        if read_tls_verdict(&mut tls)? != Verdict::Accepted {
            bail!("transfer {index} refused");
        }
        tls.write_all(source)?;
        tls.flush()?;
        match read_tls_verdict(&mut tls)? {
            Verdict::Committed => Ok(()),
            other => bail!("transfer {index} ended {other:?}"),
        }
    };
    let warmed = send_one(usize::MAX);
    barrier.wait();
    warmed?;
    for index in 0..objects {
        send_one(index)?;
    }
    tls.conn.send_close_notify();
    tls.flush()?;
    Ok(())
}

fn read_tls_verdict(stream: &mut impl Read) -> anyhow::Result<Verdict> {
    let mut byte = [0; 1];
    stream.read_exact(&mut byte)?;
    Verdict::from_byte(byte[0]).context("unknown verdict byte")
}

/// One TLS receiver: serves transfers on `stream` until the sender closes.
fn tls_receive(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    object_bytes: usize,
) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let connection = rustls::ServerConnection::new(config)?;
    let mut tls = rustls::StreamOwned::new(connection, stream);
    let mut target = vec![0u8; object_bytes];
    loop {
        let mut header = [0; HEADER_BYTES];
        match tls.read_exact(&mut header) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error.into()),
        }
        let header = TransferHeader::decode(&header)?;
        if header.length_bytes != object_bytes as u64 {
            bail!("unexpected length {}", header.length_bytes);
        }
        tls.write_all(&[Verdict::Accepted.to_byte()])?;
        tls.flush()?;
        tls.read_exact(&mut target)?;
        std::hint::black_box(&target);
        tls.write_all(&[Verdict::Committed.to_byte()])?;
        tls.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_transports_deliver_and_report_positive_figures() {
        let args = PeerBenchArgs {
            object_bytes: 256 << 10,
            objects: 8,
            concurrency: 2,
            datagram_bytes: 9000,
            rounds: 1,
            json: true,
        };
        let report = measure(&args).unwrap();
        assert!(
            report.quic_gbps > 0.0 && report.tls_tcp_gbps > 0.0,
            "{report:?}"
        );
        assert!(report.quic_1500_mtu_gbps > 0.0, "{report:?}");
        assert!((report.quic_ratio - report.quic_gbps / report.tls_tcp_gbps).abs() < 1e-9);
    }
}
