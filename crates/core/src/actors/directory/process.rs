//! `kvtier directory`: the directory actor, a QUIC endpoint with mutual TLS, a session
//! actor per node connection, and the metrics exporter.

use super::actor::{DirectoryActor, OpenSessions, Reload};
use super::election::{self, ElectionSettings, ServingGate};
use super::session::SessionActor;
use crate::actors::node::host_files::OwnedFile;
use crate::actors::process::{bind_metrics, serve_metrics, shutdown_signal};
use crate::backends::{PoolError, SharedMemory};
use crate::config::{ClusterConfig, CxlPoolSection};
use crate::metrics::delegation::DirectoryRecallMetrics;
use crate::metrics::election::ElectionMetrics;
use crate::metrics::replication::ReplicationMetrics;
use crate::metrics::Metrics;
use crate::model::{DomainId, Medium, PoolSpec, Scope};
use crate::protocol::shards::Shards;
use crate::wire::admission::ConnectionCounts;
use crate::wire::certs::{RetiredCertificates, CERTIFICATE_RETIRED};
use crate::wire::etcd::EtcdClient;
use crate::wire::{quic, tls};
use actix::prelude::*;
use anyhow::Context as _;
use std::path::Path;
use std::sync::Arc;

/// Where one directory process listens: `[directory] listen` and `metrics`, or, for a
/// standby, the addresses `kvtier directory --listen --metrics` gave it.
#[derive(Clone, Copy, Debug)]
pub struct Addresses {
    /// The QUIC address nodes connect to.
    pub listen: std::net::SocketAddr,
    /// The Prometheus exporter's, if any.
    pub metrics: Option<std::net::SocketAddr>,
}

impl Addresses {
    /// The configuration's addresses, each replaced by its override when given.
    pub fn of(
        config: &ClusterConfig,
        listen: Option<std::net::SocketAddr>,
        metrics: Option<std::net::SocketAddr>,
    ) -> Addresses {
        Addresses {
            listen: listen.unwrap_or(config.directory.listen),
            metrics: metrics.or(config.directory.metrics),
        }
    }
}

/// Runs the directory until SIGINT or SIGTERM; SIGHUP re-reads `config_path` (the file
/// `config` was loaded from). With `[directory] etcd` it first stands by until elected
/// ([`super::election`]), refusing every connection, and serves only while it leads: a
/// leader whose lease lapses exits with [`super::election::EXIT_DEPOSED`]. Must run inside
/// an actix `System`.
pub async fn run(
    config: ClusterConfig,
    config_path: &Path,
    addresses: Addresses,
) -> anyhow::Result<()> {
    let section = &config.directory;
    let metrics_listener = bind_metrics(addresses.metrics)?;
    let server_config = tls::server_config(&section.certs, &section.name).with_context(|| {
        format!(
            "loading the directory certificate from {}",
            section.certs.display()
        )
    })?;
    let endpoint = quic::server_endpoint(addresses.listen, server_config)
        .context("binding the QUIC endpoint")?;
    let metrics = Arc::new(Metrics::new()?);
    let election_metrics = ElectionMetrics::register(&metrics)?;
    serve_metrics(metrics_listener, metrics.clone())?;
    let serving: ServingSlot = Arc::new(std::sync::RwLock::new(None));
    let counts = ConnectionCounts::default();
    actix_rt::spawn(accept_loop(
        endpoint.clone(),
        serving.clone(),
        counts,
        Arc::from(section.certs.as_path()),
    ));
    let Some((gate, leadership)) =
        stand_for_election(section, &addresses, &endpoint, &election_metrics).await?
    else {
        return Ok(());
    };
    // Pools are formatted and registered before the endpoint accepts any node.
    let (core, created) = prepared_core(&config)?;
    let replication_metrics = ReplicationMetrics::register(&metrics)?;
    let recall_metrics = DirectoryRecallMetrics::register(&metrics)?;
    let tick_interval = section.tick_interval();
    let directory = DirectoryActor::new(
        core,
        config,
        config_path.to_path_buf(),
        metrics,
        (replication_metrics, recall_metrics),
        tick_interval,
        gate.clone(),
    )
    .start();
    if let Ok(mut slot) = serving.write() {
        *slot = Some((directory.clone(), gate.clone()));
    }
    tracing::info!(address = %endpoint.local_addr()?, "directory listening");
    actix_rt::spawn(reload_on_hangup(directory.clone()));
    let stopped_by = serve_until_stopped(leadership.as_ref(), &gate).await?;
    let open_sessions = directory.send(OpenSessions).await.unwrap_or(u64::MAX);
    tracing::info!(open_sessions, "{stopped_by} received: the directory stops");
    endpoint.close(quinn::VarInt::from_u32(0), b"directory shutting down");
    remove_created_pools(created, open_sessions);
    Ok(())
}

/// What an elected leader holds: the election's settings, its etcd lease and leadership.
type Held = (
    ElectionSettings,
    (
        crate::wire::etcd::EtcdLease,
        crate::directory::leadership::Leadership,
    ),
);

/// Without etcd, an open gate at once; with it, stands by until this process wins the
/// election (its gate then following the leadership). `None` when a stop signal came while
/// standing by (the endpoint is closed).
async fn stand_for_election(
    section: &crate::config::DirectorySection,
    addresses: &Addresses,
    endpoint: &quinn::Endpoint,
    election_metrics: &ElectionMetrics,
) -> anyhow::Result<Option<(Arc<ServingGate>, Option<Held>)>> {
    if section.etcd.is_empty() {
        election_metrics.leading(0, false);
        return Ok(Some((ServingGate::open(), None)));
    }
    election_metrics.standing_by();
    let settings = ElectionSettings {
        etcd: EtcdClient::new(section.etcd.clone()),
        key: section.election_key(),
        address: addresses.listen.to_string(),
        ttl: section.lease_ttl(),
    };
    let gate = ServingGate::closed();
    tracing::info!(address = %addresses.listen, key = %settings.key, "standing by for the directory's election");
    let won = tokio::select! {
        won = election::campaign(&settings, &gate) => won,
        signal = shutdown_signal() => {
            tracing::info!("{} received while standing by: the directory stops", signal?);
            endpoint.close(quinn::VarInt::from_u32(0), b"directory shutting down");
            return Ok(None);
        }
    };
    election_metrics.leading(won.1.term(), true);
    Ok(Some((gate, Some((settings, won)))))
}

/// The directory core of a new incarnation: the configured CXL pools formatted or adopted
/// (with the files this process created), then the nodes and their pools declared in
/// configuration order, so each gets the id it had in the previous incarnation.
fn prepared_core(config: &ClusterConfig) -> anyhow::Result<(Shards, Vec<OwnedFile>)> {
    let mut limits = config.directory.limits.clone();
    limits.incarnation = fresh_incarnation();
    let mut core = Shards::new(limits, usize::from(config.directory.shards));
    let mut created = Vec::new();
    for pool in &config.cxl_pools {
        if add_cxl_pool(&mut core, pool)? == Prepared::Created {
            created.push(OwnedFile::record(&pool.path)?);
        }
    }
    for node in &config.nodes {
        let specs = config.host_pool_specs(node, crate::model::NodeId(0))?;
        core.declare_node(&node.name, specs)
            .with_context(|| format!("declaring node `{}`", node.name))?;
        core.set_peer_endpoint(&node.name, node.peer_listen.and(node.peer_reachable_at()));
    }
    let until = crate::model::Timestamp::ZERO + core.recovery_window();
    core.recover_until(until);
    Ok((core, created))
}

/// Serves until a stop signal (its name returned), resigning an elected leadership; a
/// leadership lost meanwhile exits the process ([`election::EXIT_DEPOSED`]).
async fn serve_until_stopped(
    leadership: Option<&Held>,
    gate: &ServingGate,
) -> anyhow::Result<&'static str> {
    Ok(match leadership {
        None => shutdown_signal().await?,
        Some((settings, (lease, held))) => tokio::select! {
            reason = election::hold(settings, *lease, *held, gate) => {
                tracing::error!(reason, "deposed: the directory stops serving and exits");
                std::process::exit(election::EXIT_DEPOSED);
            }
            signal = shutdown_signal() => {
                election::resign(settings, *lease, gate).await;
                signal?
            }
        },
    })
}

/// The directory actor connections go to once this process serves, and its gate.
type ServingSlot = Arc<std::sync::RwLock<Option<(Addr<DirectoryActor>, Arc<ServingGate>)>>>;

/// Accepts connections while this process serves, and refuses them at once (no handshake)
/// while it stands by or once its gate closed: a node trying every directory address
/// learns within a round trip which one leads.
async fn accept_loop(
    endpoint: quinn::Endpoint,
    serving: ServingSlot,
    counts: ConnectionCounts,
    certs: Arc<Path>,
) {
    while let Some(incoming) = endpoint.accept().await {
        let directory = serving
            .read()
            .ok()
            .and_then(|slot| slot.clone())
            .filter(|(_, gate)| gate.serving())
            .map(|(directory, _)| directory);
        let Some(directory) = directory else {
            incoming.refuse();
            continue;
        };
        let (counts, certs) = (counts.clone(), certs.clone());
        actix_rt::spawn(async move {
            if let Err(error) = accept(incoming, directory, counts, &certs).await {
                tracing::warn!(%error, "refused a connection");
            }
        });
    }
}

/// Removes the CXL pool files this process created (dropping them), unless a node session
/// is still open: its node maps the pool, and a restarted directory must find what it wrote.
fn remove_created_pools(created: Vec<OwnedFile>, open_sessions: u64) {
    if open_sessions == 0 {
        for file in &created {
            tracing::info!(path = %file.path().display(), "removing the CXL pool file this directory created");
        }
        drop(created);
    } else {
        for file in created {
            tracing::info!(path = %file.path().display(), open_sessions, "keeping the CXL pool file: nodes still map it");
            // Kept on purpose: dropping it would remove the file.
            std::mem::forget(file);
        }
    }
}

/// Re-reads the configuration on every SIGHUP, as `kvtier ctl reload` does.
async fn reload_on_hangup(directory: Addr<DirectoryActor>) {
    let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGHUP; reload with `kvtier ctl reload`");
            return;
        }
    };
    while hangups.recv().await.is_some() {
        // The actor logs the outcome.
        let _ = directory.send(Reload).await;
    }
}

/// Formats (when new) and registers a CXL pool of the configuration: at start, and when a
/// reload adds it. A pool that already held data reuses nothing before the recovery window.
/// Says what it found at the pool's path.
pub(super) fn add_cxl_pool(core: &mut Shards, pool: &CxlPoolSection) -> anyhow::Result<Prepared> {
    let prepared = prepare_cxl_pool(pool)?;
    let spec = PoolSpec {
        name: pool.name.clone(),
        medium: Medium::Cxl,
        scope: Scope::Domain(DomainId(pool.domain)),
        capacity_bytes: pool.capacity_bytes,
        page_bytes: pool.page_bytes,
        extent_bytes: Some(pool.extent_bytes),
        tenancy: crate::model::PoolTenancy::Shared,
    };
    let id = core
        .register_shared_pool(spec)
        .with_context(|| format!("registering CXL pool `{}`", pool.name))?;
    if prepared == Prepared::Existing {
        // A previous incarnation may have granted extents and leases here: reuse nothing
        // until they have all run out. The actor's clock starts after this at the earliest,
        // so its zero is no later than now and the hold errs on the long side.
        let until = core.cores()[0].latest_time() + core.recovery_window();
        core.hold_extents_until(id, until)?;
        tracing::info!(pool = %pool.name, window = ?core.recovery_window(), "CXL pool held data: no extent is granted during the recovery window");
    }
    Ok(prepared)
}

/// What the directory found at a CXL pool's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Prepared {
    /// Nothing was there: created and formatted now.
    Created,
    /// A blank device, formatted now (`format = true`): it holds nothing.
    Formatted,
    /// Already this pool: it may hold what a previous incarnation let nodes write.
    Existing,
}

/// Writes a CXL pool's header once: a path where nothing exists is created and formatted;
/// one with the header of this pool is kept as it is; anything else there — another pool, an
/// incompatible layout, or a file or device without a kvtier header, which may hold someone
/// else's data — is refused, never overwritten, unless the pool says `format = true`; then a
/// path without a header (a fresh DAX device) is formatted, and still never another pool.
fn prepare_cxl_pool(pool: &CxlPoolSection) -> anyhow::Result<Prepared> {
    let uuid = pool.uuid()?;
    match SharedMemory::adopt(&pool.path, Some(uuid)) {
        Ok(mapping) => check_geometry(pool, &mapping).map(|()| Prepared::Existing),
        Err(PoolError::Io { .. }) if !pool.path.exists() => {
            format_cxl_pool(pool, uuid).map(|()| Prepared::Created)
        }
        Err(PoolError::WrongMagic { .. }) if pool.format => {
            SharedMemory::format_existing(&pool.path, pool.capacity_bytes, uuid, pool.page_bytes)
                .with_context(|| {
                format!(
                    "formatting CXL pool `{}` at {}",
                    pool.name,
                    pool.path.display()
                )
            })?;
            tracing::info!(pool = %pool.name, path = %pool.path.display(), "formatted a blank device as a CXL pool (format = true)");
            Ok(Prepared::Formatted)
        }
        Err(error) => Err(error).with_context(|| {
            format!(
                "CXL pool `{}` at {} is not this pool; refusing to touch it",
                pool.name,
                pool.path.display()
            )
        }),
    }
}

/// Refuses a pool whose header disagrees with the configuration on its size or page size
/// (the directory would grant extents past the device's end, or account pages wrongly).
pub fn check_geometry(pool: &CxlPoolSection, mapping: &SharedMemory) -> anyhow::Result<()> {
    if mapping.data_bytes() != pool.capacity_bytes || mapping.page_bytes() != pool.page_bytes {
        anyhow::bail!(
            "CXL pool `{}` at {} holds {} bytes in {}-byte pages, but the configuration says {} bytes in {}-byte pages",
            pool.name,
            pool.path.display(),
            mapping.data_bytes(),
            mapping.page_bytes(),
            pool.capacity_bytes,
            pool.page_bytes
        );
    }
    Ok(())
}

fn format_cxl_pool(pool: &CxlPoolSection, uuid: u128) -> anyhow::Result<()> {
    SharedMemory::create(&pool.path, pool.capacity_bytes, uuid, pool.page_bytes).with_context(
        || {
            format!(
                "formatting CXL pool `{}` at {}",
                pool.name,
                pool.path.display()
            )
        },
    )?;
    tracing::info!(pool = %pool.name, path = %pool.path.display(), "formatted CXL pool header");
    Ok(())
}

/// How long a connection may take from its first packet to its session stream.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Completes a connection's handshake within [`HANDSHAKE_TIMEOUT`], refuses a retired
/// certificate (the `retired` list of `certs` is read for each connection, so
/// `kvtier certs retire` takes effect without a restart), admits the connection under its
/// peer's bound ([`crate::wire::admission`]) and gives it a session actor.
async fn accept(
    incoming: quinn::Incoming,
    directory: Addr<DirectoryActor>,
    counts: ConnectionCounts,
    certs: &Path,
) -> anyhow::Result<()> {
    let handshake = async {
        let connection = incoming.await?;
        let retired = match RetiredCertificates::load(certs) {
            Ok(retired) => retired,
            Err(error) => {
                connection.close(quinn::VarInt::from_u32(3), b"retired list unreadable");
                return Err(error).context("cannot read the retired certificates; refusing");
            }
        };
        if retired.refuses(&connection) {
            connection.close(quinn::VarInt::from_u32(3), CERTIFICATE_RETIRED.as_bytes());
            anyhow::bail!(
                "peer `{}` presented a retired certificate",
                tls::peer_name(&connection).unwrap_or_default()
            );
        }
        let peer = tls::peer_name(&connection).context("peer certificate names nobody")?;
        let Some(slot) = counts.admit(&peer) else {
            connection.close(quinn::VarInt::from_u32(2), b"too many connections");
            anyhow::bail!("peer `{peer}` holds as many connections as it may");
        };
        let streams = quic::accept_session(&connection).await?;
        anyhow::Ok((connection, slot, peer, streams))
    };
    let (connection, slot, peer, streams) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .context("the handshake took too long")??;
    SessionActor::new(directory, connection, slot, peer, streams).start();
    Ok(())
}

/// A fresh, non-zero directory incarnation: distinct from the previous one's with
/// probability 1 - 2^-16, and sessions of an equal one are refused by node name anyway.
fn fresh_incarnation() -> u16 {
    let id = crate::actors::node::process::fresh_uuid();
    (id as u16).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_without_a_header_is_formatted_only_when_told() {
        let path = std::env::temp_dir().join(format!("kvtier-format-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let mut pool = CxlPoolSection {
            name: "cxl".into(),
            domain: 0,
            path: path.clone(),
            capacity_bytes: 1 << 20,
            page_bytes: 64 << 10,
            extent_bytes: 256 << 10,
            uuid: format!("{:032x}", 0x5eed_u128),
            format: false,
            tenants: None,
        };
        let refused = prepare_cxl_pool(&pool);
        assert!(refused.is_err(), "a headerless path was formatted");
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 4096], "touched");
        pool.format = true;
        assert_eq!(prepare_cxl_pool(&pool).unwrap(), Prepared::Formatted);
        assert_eq!(prepare_cxl_pool(&pool).unwrap(), Prepared::Existing);
        pool.uuid = format!("{:032x}", 0x5eef_u128);
        assert!(
            prepare_cxl_pool(&pool).is_err(),
            "another pool was formatted away"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
