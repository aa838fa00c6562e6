//! `kvtier node`: creates the host's CPU pool, opens a session with the directory (a new
//! epoch), registers the pool, and serves local engines on a Unix socket until a signal.
//! On exit it closes its session and removes its socket and instance lock (its CPU pool, a
//! memory file without a path, ends with the last process that maps it).

use super::actor::{NodeActor, NodeExit};
use super::client_session::ClientSessionActor;
use super::host_files::{InstanceLock, OwnedFile, Signalled, Stop};
use super::link::{DirectoryAddress, DirectoryLink};
use super::partitions::{HandedPool, Handoffs};
use super::pool::PoolActor;
use super::rejoin::Registration;
use super::reload::NodeReload;
use super::services::{lock_core, NodeServices};
use crate::actors::process::{bind_metrics, serve_metrics};
use crate::backends::probe::{self, ProbeRegion};
use crate::backends::{MemoryPool, PoolBackend};
use crate::config::{ClusterConfig, CpuPartition, NodeSection};
use crate::directory::ExtentGrant;
use crate::metrics::delegation::NodeDelegationMetrics;
use crate::metrics::Metrics;
use crate::model::extent_owner::{take_extent, Ownership, TakeFrom};
use crate::model::{Clock, Medium, PoolId, Scope};
use crate::node::accept::{AcceptBackoff, AcceptStep};
use crate::node::{
    ExtentAction, Liveness, NodeCore, NodeRefusal, PeerIdentity, TenantRefusal, Tenants,
    CLIENT_LIMITS,
};
use crate::policy::profiles::Measurement;
use crate::protocol::messages::{
    ClientReply, ClientRequest, DirectoryReply, DirectoryRequest, ProtocolError,
};
use crate::wire::uds::{self, SocketMode};
use crate::wire::{handoff, read_frame, write_frame};
use actix::prelude::*;
use anyhow::{bail, Context as _};
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a starting node keeps trying to reach the directory.
const DIRECTORY_WAIT: Duration = Duration::from_secs(30);
/// How often the node cleans up and, when no wait for tasks is at the directory, starts
/// one (the fallback poll: a wait answers at once when tasks are pending); the same as the
/// directory's default tick (`tick_interval_ms`).
pub const TASK_INTERVAL: Duration = Duration::from_millis(50);

/// A fresh 128-bit id for a pool incarnation (unique, not secret).
pub fn fresh_uuid() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |time| time.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    let high = hasher.finish();
    hasher.write_u64(high);
    (u128::from(high) << 64) | u128::from(hasher.finish())
}

/// Runs node `name` until SIGINT, SIGTERM, fencing or a drain; SIGHUP re-reads
/// `config_path` (the file `config` was loaded from, see [`super::reload`]). Must run
/// inside an actix `System`. A stop signal at any step (pre-fault, reaching the directory,
/// starting the pools, serving) ends it cleanly; whatever the way out, the files it
/// created (socket, instance lock) go with it.
pub async fn run(config: ClusterConfig, config_path: &Path, name: &str) -> anyhow::Result<()> {
    let section = config.node(name)?.clone();
    let (passwd, group) = (user_database("/etc/passwd")?, user_database("/etc/group")?);
    // SAFETY: getuid has no preconditions and cannot fail.
    let owner_uid = unsafe { libc::getuid() };
    let tenants = config.tenants(&section, owner_uid, &passwd, &group)?;
    let socket_gid = section.socket_gid(&group)?;
    let target = directory_address(&config, &section);
    let mut stop = Stop::install()?;
    let _instance = InstanceLock::acquire(&section.socket)?;
    let metrics_listener = bind_metrics(section.metrics)?;
    log_copy_routines();
    let partitions = super::partitions::create_cpu_partitions(&config, &section)?;
    let host = HostParts {
        partitions,
        metrics_listener,
    };
    if stop.requested() {
        tracing::info!("stopped during the pool's pre-fault");
        return Ok(());
    }
    let core = Arc::new(Mutex::new(NodeCore::new(CLIENT_LIMITS)));
    let clock = Clock::start();
    let link = tokio::select! {
        () = stop.wait() => {
            tracing::info!("stopped before reaching the directory");
            return Ok(());
        }
        link = open_link(target, &section, core.clone()) => Arc::new(link?),
    };
    let binding = link.binding();
    let opened_at = clock.now() - binding.opened.elapsed();
    lock_core(&core).liveness = Liveness::new(opened_at, binding.fence_after);
    tracing::info!(node = %binding.node, epoch = %binding.epoch, session = %binding.session, "session open");
    let (tenants_in_force, tenants) = tokio::sync::watch::channel(tenants);
    let clients = ClientPolicy {
        socket_gid,
        tenants,
    };
    let started = tokio::select! {
        () = stop.wait() => None,
        started = start(&config, &section, &link, core, clock, host, clients) => Some(started?),
    };
    let Some((mut exit, _socket_file)) = started else {
        tracing::info!("stopped while starting");
        let _ = link.call(DirectoryRequest::Close).await;
        return Ok(());
    };
    let reloads = Reloads {
        config_path,
        section: &section,
        owner_uid,
        tenants: tenants_in_force,
    };
    match serve_until_stopped(&mut stop, &mut exit, reloads).await {
        Some(NodeExit::RejoinFailed(reason)) => {
            bail!("this node could not rejoin the directory with its cache: {reason}")
        }
        Some(NodeExit::Drained) => {
            tracing::info!("the directory drained this node; exiting");
            Ok(())
        }
        None => {
            let _ = link.call(DirectoryRequest::Close).await;
            Ok(())
        }
    }
}

/// Where and as whom node `section` reaches the directory.
fn directory_address(config: &ClusterConfig, section: &NodeSection) -> DirectoryAddress {
    DirectoryAddress {
        addresses: std::iter::once(section.directory_address.unwrap_or(config.directory.listen))
            .chain(config.directory.standbys.iter().copied())
            .collect(),
        server_name: config.directory.name.clone(),
        certs: config.directory.certs.clone(),
        node_name: section.name.clone(),
        bind: section.bind,
        busy_poll_tail: Duration::from_micros(section.busy_poll_us),
    }
}

/// What the node made on its host before reaching the directory: its CPU partitions and
/// its metrics endpoint's socket.
struct HostParts {
    partitions: Vec<(CpuPartition, MemoryPool)>,
    metrics_listener: Option<std::net::TcpListener>,
}

/// Who may connect to the node's socket: its group, and the tenant rules in force.
struct ClientPolicy {
    socket_gid: Option<u32>,
    tenants: tokio::sync::watch::Receiver<Tenants>,
}

/// What a SIGHUP re-reads, and where the tenant rules it changes go.
struct Reloads<'a> {
    config_path: &'a Path,
    section: &'a NodeSection,
    owner_uid: u32,
    tenants: tokio::sync::watch::Sender<Tenants>,
}

/// Serves until a stop signal (`None`) or the node actor's fatal exit, answering each
/// SIGHUP with a reload.
async fn serve_until_stopped(
    stop: &mut Stop,
    exit: &mut tokio::sync::mpsc::Receiver<NodeExit>,
    reloads: Reloads<'_>,
) -> Option<NodeExit> {
    loop {
        let signalled = tokio::select! {
            signalled = stop.next() => signalled,
            reason = exit.recv() => return reason,
        };
        if signalled == Signalled::Stop {
            tracing::info!(
                "stop signal received; closing the session and removing this node's files"
            );
            return None;
        }
        let databases = user_database("/etc/passwd")
            .and_then(|passwd| user_database("/etc/group").map(|group| (passwd, group)));
        let outcome = databases.and_then(|(passwd, group)| {
            super::reload::read(
                reloads.config_path,
                reloads.section,
                &reloads.tenants.borrow(),
                reloads.owner_uid,
                (&passwd, &group),
            )
        });
        super::reload::log(reloads.config_path, &outcome);
        if let Ok(NodeReload {
            tenants: Some(tenants),
            ..
        }) = outcome
        {
            reloads.tenants.send_replace(tenants);
        }
    }
}

/// Maps the CXL pools, registers and probes every pool, starts the node's actors and
/// serves clients. Returns the channel on which the node actor reports a fatal exit, and
/// the socket file.
/// Chooses this process's copy routines now (a measurement of about 0.1 s), not on the
/// first copy, and says which.
fn log_copy_routines() {
    let routines = crate::backends::copy::routines();
    match &routines.calibration {
        Some(measured) => tracing::info!(
            store = routines.store.name(),
            load = routines.load.name(),
            store_memcpy_gbps = measured.store.memcpy_gbps,
            store_streaming_gbps = measured.store.streaming_gbps,
            "copy routines measured"
        ),
        None => tracing::info!(
            store = routines.store.name(),
            load = routines.load.name(),
            "copy routines set by {}",
            crate::backends::copy::COPY_ROUTINE_VARIABLE
        ),
    }
}

async fn start(
    config: &ClusterConfig,
    section: &NodeSection,
    link: &Arc<DirectoryLink>,
    core: Arc<Mutex<NodeCore>>,
    clock: Clock,
    host: HostParts,
    clients: ClientPolicy,
) -> anyhow::Result<(tokio::sync::mpsc::Receiver<NodeExit>, OwnedFile)> {
    let HostParts {
        partitions,
        metrics_listener,
    } = host;
    // The directory formats the CXL pools before it accepts nodes: map them now.
    let cxl_pools = map_cxl_pools(config, section)?;
    let metrics = Arc::new(Metrics::new()?);
    let (pools, handoffs, mut registration) =
        start_pools(link, &metrics, section, partitions, cxl_pools).await?;
    let ssd_spec = section.ssd_pool_spec(registration.node);
    let ssd = super::ssd::open(section.ssd.as_ref(), ssd_spec, link, &metrics).await?;
    registration.ssd = ssd.as_ref().map(|ssd| ssd.registration.clone());
    serve_metrics(metrics_listener, metrics.clone())?;
    let (exit_sender, exit) = tokio::sync::mpsc::channel(1);
    let shared_pools = registration
        .shared_pools
        .iter()
        .map(|(_, pool)| (*pool, Arc::default()))
        .collect();
    let peer = super::peer::PeerTransport::bind(config, section, &metrics)?;
    let delegation_metrics = Arc::new(NodeDelegationMetrics::register(&metrics)?);
    let link_metrics = Arc::new(crate::metrics::link::NodeLinkMetrics::register(&metrics)?);
    let services = NodeServices {
        delegation_metrics,
        link_metrics,
        shared_pools,
        link: link.clone(),
        pools,
        handoffs,
        metrics,
        core,
        clock,
        ssd,
        peer: peer.clone(),
        copier: super::copy_engine::CopyEngine::start(section.copy_threads)
            .context("starting the node's copy threads")?,
        reserves_answered: Arc::default(),
    };
    if let Some(peer) = &peer {
        peer.serve(services.clone());
    }
    if let Some(ssd) = &services.ssd {
        super::ssd::report_stored(&services, ssd).await;
    }
    NodeActor::new(services.clone(), registration, TASK_INTERVAL, exit_sender).start();
    let socket_file = serve_clients(section, clients, services).await?;
    Ok((exit, socket_file))
}

/// The pool actors, what each tenant's clients are handed, and what a rejoin registers
/// again.
type StartedPools = (
    HashMap<PoolId, Addr<PoolActor>>,
    Arc<Handoffs>,
    Registration,
);

/// Registers the CPU partitions, probes every pool and reports what it measured, and
/// starts a pool actor per pool.
async fn start_pools(
    link: &DirectoryLink,
    metrics: &Metrics,
    section: &NodeSection,
    partitions: Vec<(CpuPartition, MemoryPool)>,
    cxl_pools: Vec<(String, MemoryPool)>,
) -> anyhow::Result<StartedPools> {
    let node = link.binding().node;
    let mut registration = Registration {
        node,
        cpu_pools: Vec::new(),
        shared_pools: Vec::new(),
        profiles: Vec::new(),
        ssd: None,
    };
    let cpu = register_partitions(link, metrics, section, partitions, &mut registration).await?;
    let mut cxl = Vec::new();
    for (name, pool_id, pool) in locate_cxl_pools(link, cxl_pools).await? {
        metrics.set_pool_capacity(pool_id, Medium::Cxl, pool.memory().data_bytes());
        let probed = probe_shared_pool(link, pool_id, &pool).await;
        registration
            .profiles
            .extend(report_probe(link, metrics, pool_id, probed).await);
        registration.shared_pools.push((name, pool_id));
        cxl.push((pool_id, pool));
    }
    let handoffs = Handoffs::new(
        &cpu.iter()
            .map(|(group, pool_id, pool)| (*group, handed(*pool_id, Medium::Cpu, pool)))
            .collect::<Vec<_>>(),
        &cxl.iter()
            .map(|(pool_id, pool)| handed(*pool_id, Medium::Cxl, pool))
            .collect::<Vec<_>>(),
        &section.write_order,
    )?;
    let mut pools = HashMap::new();
    for (pool_id, pool) in cpu
        .into_iter()
        .map(|(_, pool_id, pool)| (pool_id, pool))
        .chain(cxl)
    {
        pools.insert(pool_id, PoolActor::new(Box::new(pool)).start());
    }
    Ok((pools, Arc::new(handoffs), registration))
}

/// Registers the CPU partitions (one probe of the CPU memory, on the largest partition,
/// fresh: the probe may write anywhere, reported for every partition); each partition's
/// salt group, pool id and pool.
async fn register_partitions(
    link: &DirectoryLink,
    metrics: &Metrics,
    section: &NodeSection,
    partitions: Vec<(CpuPartition, MemoryPool)>,
    registration: &mut Registration,
) -> anyhow::Result<Vec<(crate::model::SaltGroup, PoolId, MemoryPool)>> {
    let node = registration.node;
    // One probe of the CPU memory (the largest partition, fresh: the probe may write
    // anywhere), reported for every partition.
    let probed = partitions
        .iter()
        .max_by_key(|(partition, _)| partition.capacity_bytes)
        .map(|(_, pool)| {
            let region = ProbeRegion {
                offset: 0,
                length: pool.memory().data_bytes(),
            };
            probe::probe_memory(pool.memory(), region)
        });
    let mut cpu = Vec::new();
    for (partition, pool) in partitions {
        let spec = partition.spec(node, section.cpu_pool.page_bytes);
        let pool_id = match link
            .send(DirectoryRequest::RegisterPool(spec.clone()))
            .await?
        {
            DirectoryReply::Pool(pool_id) => pool_id,
            other => bail!(
                "registering CPU partition `{}` answered {other:?}",
                spec.name
            ),
        };
        metrics.set_pool_capacity(pool_id, Medium::Cpu, partition.capacity_bytes);
        if let Some(Ok(measured)) = &probed {
            registration
                .profiles
                .extend(report_probe(link, metrics, pool_id, Ok(*measured)).await);
        }
        registration.cpu_pools.push((spec, pool_id));
        cpu.push((partition.group, pool_id, pool));
    }
    if let Some(Err(error)) = probed {
        tracing::warn!(%error, "probing the CPU memory failed; its partitions keep default figures");
    }
    Ok(cpu)
}

/// The text of a user database (`/etc/passwd`, `/etc/group`); empty where there is none.
fn user_database(path: &str) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(error) => Err(error).with_context(|| format!("reading {path}")),
    }
}

/// Binds the node's Unix socket (mode 0660, group `socket_gid` when set) and serves each
/// client its tenant rules admit, by its peer credentials, with a session actor.
/// Connections are bounded by the core's client bound ([`crate::node::CLIENTS_MAX`]); out
/// of descriptors, accepting pauses (see [`crate::node::accept`]), logged and counted in
/// `kvtier_accept_backoffs_total`.
/// Returns the socket file, removed when it is dropped.
async fn serve_clients(
    section: &NodeSection,
    clients: ClientPolicy,
    services: NodeServices,
) -> anyhow::Result<OwnedFile> {
    let ClientPolicy {
        socket_gid,
        tenants,
    } = clients;
    if let Some(parent) = section.socket.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let listener = uds::bind(&section.socket, SocketMode::OwnerAndGroup, socket_gid).await?;
    let socket_file = OwnedFile::record(&section.socket)?;
    tracing::info!(socket = %section.socket.display(), "serving local clients");
    let refusals = Arc::new(tokio::sync::Semaphore::new(REFUSED_HANDSHAKES_MAX));
    actix_rt::spawn(async move {
        let mut backoff = AcceptBackoff::default();
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    backoff.accepted();
                    admit_client(&services, &tenants.borrow(), &refusals, stream);
                }
                Err(error) => match backoff.failed(&error) {
                    AcceptStep::Continue => tracing::warn!(%error, "accepting a client failed"),
                    AcceptStep::Pause(pause) => {
                        services.metrics.add_accept_backoff();
                        tracing::warn!(%error, ?pause, "out of descriptors: pausing accepts");
                        tokio::time::sleep(pause).await;
                    }
                },
            }
        }
    });
    Ok(socket_file)
}

/// Refused connections answered at once (their hello gets the refusal); past this, one
/// is closed unanswered.
const REFUSED_HANDSHAKES_MAX: usize = 64;
/// How long a refused connection has to send its hello.
const REFUSED_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// The supplementary groups of `stream`'s peer (`SO_PEERGROUPS`, Linux 4.13 and later), at
/// most [`PEER_GROUPS_MAX`](crate::node::tenants::PEER_GROUPS_MAX); none where the kernel
/// does not say (the peer is then matched on its uid and effective gid).
fn peer_groups(stream: &tokio::net::UnixStream) -> Vec<u32> {
    use std::os::fd::AsRawFd;
    /// `SO_PEERGROUPS` of asm-generic (x86-64, arm64).
    const SO_PEERGROUPS: libc::c_int = 59;
    let mut groups = vec![0 as libc::gid_t; crate::node::tenants::PEER_GROUPS_MAX];
    let mut length = libc::socklen_t::try_from(std::mem::size_of_val(groups.as_slice()))
        .unwrap_or(libc::socklen_t::MAX);
    // SAFETY: `groups` is valid for `length` bytes of writes, `length` for one write, and
    // the descriptor is open for the call's duration.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut length,
        )
    };
    if result != 0 {
        return Vec::new();
    }
    groups.truncate(length as usize / std::mem::size_of::<libc::gid_t>());
    groups
}

/// Serves `stream` as the tenant its peer credentials are, or refuses it with a typed
/// error at the handshake (counted by reason).
fn admit_client(
    services: &NodeServices,
    tenants: &Tenants,
    refusals: &Arc<tokio::sync::Semaphore>,
    stream: tokio::net::UnixStream,
) {
    let peer = match stream.peer_cred() {
        Ok(credentials) => PeerIdentity {
            uid: credentials.uid(),
            gid: credentials.gid(),
            groups: peer_groups(&stream),
            pid: credentials.pid(),
        },
        Err(error) => {
            tracing::warn!(%error, "a client's peer credentials are unreadable; closing it");
            services.metrics.refuse_client("no_credentials");
            return;
        }
    };
    let admitted =
        tenants
            .admit(&peer)
            .and_then(|tenant| match services.handoffs.of(tenant.group()) {
                Some(handoff) => Ok((tenant, handoff)),
                None => Err(TenantRefusal::NoPartition {
                    tenant: tenant.name.clone(),
                }),
            });
    let refusal = match admitted {
        Ok((tenant, handoff)) => match services.core().connect_client(peer.uid) {
            Ok(client) => {
                let files: Vec<_> = handoff.files.iter().map(|file| file.as_fd()).collect();
                if let Err(error) = handoff::send(&stream, &files) {
                    tracing::debug!(%error, ?peer, "a client left before its handoff");
                    // Just connected: it holds nothing to give back.
                    let _nothing = services
                        .core()
                        .disconnect_client(client, services.clock.now());
                    return;
                }
                tracing::debug!(?peer, tenant = %tenant.name, "client admitted");
                ClientSessionActor::new(services.clone(), stream, client, tenant).start();
                return;
            }
            Err(refusal) => {
                services.metrics.refuse_client(match refusal {
                    NodeRefusal::TooManyClients => "too_many_clients",
                    NodeRefusal::TooManyClientsOfUser => "too_many_clients_of_user",
                });
                tracing::warn!(?refusal, ?peer, "refusing a client connection");
                ProtocolError::Busy
            }
        },
        Err(refusal) => {
            services.metrics.refuse_client(match refusal {
                TenantRefusal::NotInCxlPool { .. } => "tenant_not_in_cxl_pool",
                TenantRefusal::NoPartition { .. } => "tenant_without_partition",
                _ => "unknown_peer",
            });
            tracing::warn!(?peer, %refusal, "refusing a client its tenant rules do not admit here");
            ProtocolError::Tenant(refusal)
        }
    };
    answer_refused(refusals, stream, refusal);
}

/// Tells a refused client why at its hello (within [`REFUSED_HANDSHAKE_TIMEOUT`]), handing
/// it no memory file; at most as many at once as `refusals` has permits (past them the
/// connection is closed unanswered).
fn answer_refused(
    refusals: &Arc<tokio::sync::Semaphore>,
    stream: tokio::net::UnixStream,
    refusal: ProtocolError,
) {
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return;
    };
    // A refused client is handed no memory file; it hears why at hello.
    if handoff::send(&stream, &[]).is_err() {
        return;
    }
    actix_rt::spawn(async move {
        let mut stream = stream;
        let answered = tokio::time::timeout(REFUSED_HANDSHAKE_TIMEOUT, async {
            if let Ok(Some((request_id, _))) = read_frame::<_, ClientRequest>(&mut stream).await {
                let reply = ClientReply::Error(refusal);
                let _ = write_frame(&mut stream, request_id, &reply).await;
            }
        });
        let _ = answered.await;
        drop(permit);
    });
}

/// Probes a shared pool through an extent granted for the probe (unused, so the probe may
/// overwrite it), then gives the extent back. With no free extent the pool is not probed:
/// reading bytes other nodes own would measure their caches, not the device. An extent the
/// directory did not take back is handed to the pool's allocator, whose empty extents the
/// node returns on its task timer.
async fn probe_shared_pool(
    link: &DirectoryLink,
    pool: PoolId,
    cxl: &MemoryPool,
) -> Result<Measurement, probe::ProbeError> {
    let extent = match link.grant_extent(pool).await {
        Ok(ExtentGrant::Granted(extent)) => extent,
        Ok(ExtentGrant::Full) => return Err(probe::ProbeError::NoRoom),
        Err(error) => return Err(probe::ProbeError::Directory(error.to_string())),
    };
    // The probe writes: it takes the extent in the owner words first, as every writer does.
    let index = extent.offset_bytes / extent.length_bytes.max(1);
    let from = extent.owner_word.map_or(TakeFrom::Unknown, TakeFrom::Known);
    let word = match take_extent(cxl.memory(), index, link.binding().node, from) {
        Ownership::Taken(word) => Some(word),
        Ownership::Untracked => None,
        Ownership::Refused(found) => {
            let _ = link
                .give_back_extent(pool, extent.offset_bytes, extent.length_bytes, Some(found))
                .await;
            return Err(probe::ProbeError::NoRoom);
        }
    };
    let region = ProbeRegion {
        offset: extent.offset_bytes,
        length: extent.length_bytes,
    };
    let measured = probe::probe_memory(cxl.memory(), region);
    let action = link
        .give_back_extent(pool, extent.offset_bytes, extent.length_bytes, word)
        .await;
    if let ExtentAction::AddBack {
        offset_bytes,
        length_bytes,
        ..
    } = action
    {
        // Still this node's: the allocator gives it back when idle.
        if let Err(error) = cxl.add_extent(offset_bytes, length_bytes) {
            tracing::warn!(%error, ?pool, "the probe's extent stays with this session");
        }
    }
    measured
}

/// Reports what a probe measured to the directory and the node's metrics, and returns it
/// for later sessions. A failed probe or report leaves the pool priced by the directory's
/// defaults: the node serves either way.
async fn report_probe(
    link: &DirectoryLink,
    metrics: &Metrics,
    pool: PoolId,
    probed: Result<Measurement, probe::ProbeError>,
) -> Option<(PoolId, Measurement)> {
    let measured = match probed {
        Ok(measured) => measured,
        // Every extent held (a full pool, or this node's own extents kept over a restart):
        // a normal case, not a fault.
        Err(probe::ProbeError::NoRoom) => {
            tracing::debug!(
                ?pool,
                "no free extent to probe the pool in; it keeps the directory's figures"
            );
            return None;
        }
        Err(error) => {
            tracing::warn!(%error, ?pool, "probing the pool failed; it keeps default figures");
            return None;
        }
    };
    tracing::info!(
        ?pool,
        read_gb_per_s = measured.read_bandwidth_bytes_per_s as f64 / 1e9,
        write_gb_per_s = measured
            .write_bandwidth_bytes_per_s
            .map(|value| value as f64 / 1e9),
        read_latency_ns = measured.read_latency_ns,
        "pool probed"
    );
    metrics.set_pool_profile(pool, &measured);
    match link
        .send(DirectoryRequest::ReportProfile { pool, measured })
        .await
    {
        Ok(DirectoryReply::Profile(_)) => {}
        Ok(other) => tracing::warn!(?other, ?pool, "profile report refused"),
        Err(error) => tracing::warn!(%error, ?pool, "profile report failed"),
    }
    Some((pool, measured))
}

/// Maps every CXL pool of the node's domains and verifies each header: a node that sees
/// the wrong device or an incompatible layout refuses to start.
fn map_cxl_pools(
    config: &ClusterConfig,
    section: &NodeSection,
) -> anyhow::Result<Vec<(String, MemoryPool)>> {
    config
        .cxl_pools_of(section)
        .into_iter()
        .map(|(pool, path)| {
            let uuid = pool.uuid()?;
            let mapped = MemoryPool::open_cxl(&path, uuid, super::partitions::ALLOCATIONS_MAX)
                .with_context(|| {
                    format!(
                    "node `{}`: CXL pool `{}` at {} is not the configured pool; refusing to start",
                    section.name,
                    pool.name,
                    path.display()
                )
                })?;
            crate::actors::directory::process::check_geometry(&pool, mapped.memory())?;
            Ok((pool.name, mapped))
        })
        .collect()
}

/// `memory`, pool `pool` of `medium`, as the node hands it to clients.
fn handed(pool: PoolId, medium: Medium, memory: &MemoryPool) -> HandedPool<'_> {
    HandedPool {
        pool,
        medium,
        memory: memory.memory(),
    }
}

/// Finds the directory's id of each mapped CXL pool by its name.
async fn locate_cxl_pools(
    link: &DirectoryLink,
    pools: Vec<(String, MemoryPool)>,
) -> anyhow::Result<Vec<(String, PoolId, MemoryPool)>> {
    if pools.is_empty() {
        return Ok(Vec::new());
    }
    let DirectoryReply::Usage(registered) = link.send(DirectoryRequest::Usage).await? else {
        bail!("the directory did not list its pools");
    };
    pools
        .into_iter()
        .map(|(name, pool)| {
            let found = registered.iter().find(|report| {
                report.spec.name == name && matches!(report.spec.scope, Scope::Domain(_))
            });
            let report =
                found.with_context(|| format!("the directory does not know CXL pool `{name}`"))?;
            Ok((name, report.pool, pool))
        })
        .collect()
}

/// Opens the session, retrying while the directory is not up yet.
async fn open_link(
    target: DirectoryAddress,
    section: &NodeSection,
    core: Arc<Mutex<NodeCore>>,
) -> anyhow::Result<DirectoryLink> {
    let deadline = Instant::now() + DIRECTORY_WAIT;
    loop {
        match DirectoryLink::open(
            target.clone(),
            section.write_order.clone(),
            section.read_order.clone(),
            core.clone(),
        )
        .await
        {
            Ok(link) => return Ok(link),
            Err(error) if Instant::now() < deadline => {
                tracing::info!(%error, "directory not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(error).context("opening a session with the directory"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The groups the kernel reports for a peer are this process's supplementary groups.
    #[test]
    fn a_peers_supplementary_groups_are_read_from_the_kernel() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (ours, _theirs) = runtime.block_on(async { tokio::net::UnixStream::pair().unwrap() });
        let mut expected = vec![0 as libc::gid_t; 4096];
        // SAFETY: `expected` is valid for its length of writes.
        let count =
            unsafe { libc::getgroups(expected.len() as libc::c_int, expected.as_mut_ptr()) };
        assert!(count >= 0);
        expected.truncate(count as usize);
        let mut read = peer_groups(&ours);
        read.sort_unstable();
        expected.sort_unstable();
        assert_eq!(read, expected);
    }
}
