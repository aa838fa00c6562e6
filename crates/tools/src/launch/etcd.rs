//! A real etcd server on loopback for local clusters with standby directories: Debian's
//! `etcd` (package `etcd-server`), one member, its data in a folder the caller owns.

use super::ports::free_tcp_port;
use anyhow::{bail, Context as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long etcd may take to answer after it starts.
const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running single-member etcd, killed when dropped.
#[derive(Debug)]
pub struct EtcdServer {
    child: Child,
    client: SocketAddr,
    data: PathBuf,
}

/// The `etcd` program: `$KVTIER_ETCD`, else `etcd` on the `PATH`.
pub fn etcd_program() -> PathBuf {
    std::env::var_os("KVTIER_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

impl EtcdServer {
    /// Starts etcd with its data under `folder` (created, mode 0700) on free loopback
    /// ports, and waits until it answers.
    pub fn start(folder: &Path) -> anyhow::Result<EtcdServer> {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(folder)
            .with_context(|| format!("creating {}", folder.display()))?;
        let (client, peer) = (free_tcp_port()?, free_tcp_port()?);
        let log = std::fs::File::create(folder.join("etcd.log"))?;
        let data = folder.join("data");
        let child = Command::new(etcd_program())
            .arg("--name")
            .arg("kvtier-test")
            .arg("--data-dir")
            .arg(&data)
            .arg("--listen-client-urls")
            .arg(format!("http://{client}"))
            .arg("--advertise-client-urls")
            .arg(format!("http://{client}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://{peer}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://{peer}"))
            .arg("--initial-cluster")
            .arg(format!("kvtier-test=http://{peer}"))
            // Raft timing for loopback (etcd's defaults, 100 ms and 1 s, suit a WAN): its
            // minimum lease is then 1 s (1.5 × the election timeout, rounded up), so a lease
            // of `lease_ttl_s = 1` is granted as asked.
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (Debian package etcd-server; or set KVTIER_ETCD)",
                    etcd_program().display()
                )
            })?;
        let mut server = EtcdServer {
            child,
            client,
            data,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let etcd = kvtier_core::wire::etcd::EtcdClient::new(vec![self.client]);
        let deadline = Instant::now() + ETCD_READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "etcd exited during start-up ({status}); see {}",
                    self.data.display()
                );
            }
            if runtime.block_on(etcd.get("kvtier/ready")).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("etcd did not answer within {ETCD_READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its client address (the JSON gateway's too).
    pub fn client_address(&self) -> SocketAddr {
        self.client
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
