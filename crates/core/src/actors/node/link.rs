//! A node's link to the directory: the QUIC connection, the session it is bound to, and
//! the operation ids of its stores. Reserve and commit carry an operation id; when a reply
//! is lost (timeout, connection loss) the link asks the directory to `resolve` it instead
//! of assuming either outcome. The link acknowledges, with each heartbeat, every operation
//! id below the oldest one still waiting for a reply, so the directory's ledger stays small.

use super::services::lock_core;
use crate::actors::busy_poll::BusyPoll;
use crate::actors::frames::INFLIGHT_REQUESTS_MAX;
use crate::directory::{
    CommitOutcome, DirectoryError, ExtentGrant, ExtentReturn, OpenReply, ReserveItem,
    ReserveOutcome, ResolveOutcome, StoreSkip,
};
use crate::model::{
    Epoch, Location, Medium, NodeId, OperationId, OwnerWord, PoolId, ReplicaId, SessionId,
};
use crate::node::{ExtentAction, NodeCore};
use crate::protocol::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use crate::wire::{quic, RpcClient, WireError};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use thiserror::Error;

/// How long one request to the directory may take before the link resolves or retries it.
pub const DIRECTORY_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests a node keeps in flight to the directory: what one directory session accepts.
pub const DIRECTORY_INFLIGHT_MAX: usize = INFLIGHT_REQUESTS_MAX;
/// Attempts to resolve an operation whose reply was lost before giving up with `Unknown`.
const RESOLVE_ATTEMPTS_MAX: u32 = 3;

tokio::task_local! {
    /// Set around requests whose replies nobody waits for on an engine's path (the
    /// reserve of grants already handed out, answered while the engine copies): the node
    /// does not busy-poll for them, so its spinning takes no CPU from that copy or from a
    /// directory on the same host.
    static UNWATCHED: ();
}

/// Runs `requests` (calls on the link) as requests no engine waits for: the node does not
/// busy-poll for their replies, so its spinning takes no CPU from an engine's copy or from
/// a directory on the same host.
pub async fn unwatched<F: std::future::Future>(requests: F) -> F::Output {
    UNWATCHED.scope((), requests).await
}

/// Why a request through the link failed.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The directory refused it (typed; nothing changed).
    #[error("{0}")]
    Refused(ProtocolError),
    /// The directory could not be reached; the outcome of a non-idempotent request was
    /// resolved before this error is returned.
    #[error("directory unreachable: {0}")]
    Wire(#[from] WireError),
    /// The directory answered with a reply of the wrong kind (a bug on one side).
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    /// The outcome of a store could not be resolved; its storage must not be reused.
    #[error("outcome of operation {0:?} is unknown")]
    Unresolved(OperationId),
    /// The node has as many operations outstanding as the directory keeps for it.
    #[error("too many operations outstanding")]
    Busy,
    /// The node lost its session and is rejoining: it serves misses and skips until the
    /// directory has what it holds again.
    #[error("the node is rejoining the directory")]
    Rejoining,
    /// The operation belongs to a session the node no longer has (it rejoined since): it
    /// was never applied in the current one and never will be.
    #[error("the session of this operation ended")]
    SessionEnded,
    /// The directory did not answer the node's last requests or heartbeats: the request
    /// was not sent (so it changed nothing), and the node answers misses and skipped
    /// stores at once until a heartbeat is answered again.
    #[error("the directory is out of reach")]
    Unreachable,
}

impl LinkError {
    /// Whether the directory is out of reach or the session is being replaced (an outcome
    /// that could not be resolved included): a cache answers such a request with a miss or
    /// a skipped store, not an error.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            LinkError::Wire(_)
                | LinkError::Unresolved(_)
                | LinkError::Rejoining
                | LinkError::SessionEnded
                | LinkError::Unreachable
                // A namespace the node checked for its client but the directory does not
                // know (yet): it restarted, or the node registered it while out of reach.
                | LinkError::Refused(ProtocolError::Directory(
                    DirectoryError::UnknownSession
                        | DirectoryError::Fenced { .. }
                        | DirectoryError::UnknownNamespace
                ))
        )
    }
}

/// How to reach the directory.
#[derive(Clone, Debug)]
pub struct DirectoryAddress {
    /// Every directory process's address (the first is `[directory] listen`, the others
    /// its standbys): a connection is tried to all at once and the leader's is kept.
    pub addresses: Vec<SocketAddr>,
    pub server_name: String,
    pub certs: PathBuf,
    pub node_name: String,
    pub bind: SocketAddr,
    /// How long the node keeps polling after its last directory reply (see
    /// [`BusyPoll`]); zero never polls.
    pub busy_poll_tail: Duration,
}

type Rpc = RpcClient<DirectoryRequest, DirectoryReply>;

/// The session a link is bound to now, and what the directory asked of it.
#[derive(Clone, Debug)]
pub struct Binding {
    pub session: SessionId,
    pub epoch: Epoch,
    pub node: NodeId,
    /// The heartbeat period the directory asked for.
    pub heartbeat_interval: Duration,
    /// The silence after which the directory fences this session.
    pub fence_after: Duration,
    /// Items one batched request may carry at the directory.
    pub batch_items_max: usize,
    /// The directory's recovery window: how long after a session is lost an engine may
    /// still read under one of its leases.
    pub recovery_window: Duration,
    /// Just before the `Open` that opened the session was sent.
    pub opened: std::time::Instant,
    /// How long a lease the directory grants lasts: the length of a local lease on a
    /// replica the node owns.
    pub lease_duration: Duration,
}

impl Binding {
    fn of(opened: &OpenReply, sent: std::time::Instant) -> Binding {
        Binding {
            session: opened.session,
            epoch: opened.epoch,
            node: opened.node,
            heartbeat_interval: Duration::from_millis(opened.heartbeat_interval_ms.max(10)),
            fence_after: Duration::from_millis(opened.fence_after_ms),
            batch_items_max: opened.batch_items_max as usize,
            recovery_window: Duration::from_millis(opened.recovery_window_ms),
            opened: sent,
            lease_duration: Duration::from_millis(opened.lease_duration_ms),
        }
    }
}

/// A node's session with the directory, which it replaces when the session is lost (a
/// directory restart, a fence). Shared by the node's actors.
pub struct DirectoryLink {
    /// The current connection and how many times it was replaced.
    rpc: RwLock<(Rpc, u64)>,
    /// A second connection bound to the same session, for heartbeats only: they never wait
    /// behind client traffic for a slot of the main connection.
    heartbeats: tokio::sync::Mutex<Option<Rpc>>,
    /// One reconnect at a time; the others wait and reuse its result. Holds the connection
    /// generation whose reconnect last failed, and when.
    reconnecting: tokio::sync::Mutex<Option<(u64, std::time::Instant)>>,
    /// One UDP endpoint for every connection of this link (a fixed `bind` port stays usable).
    endpoint: quinn::Endpoint,
    target: DirectoryAddress,
    write_order: Vec<Medium>,
    read_order: Vec<Medium>,
    binding: RwLock<Binding>,
    /// False from the loss of a session until the new one has what the node holds.
    serving: AtomicBool,
    /// False while the directory does not answer (see [`DirectoryLink::is_reachable`]).
    reachable: AtomicBool,
    /// Times `reachable` went false.
    outages: std::sync::atomic::AtomicU64,
    /// The node's books: operation ids and extents being given back live there.
    core: Arc<Mutex<NodeCore>>,
    /// Keeps the node's thread polling while a directory reply is due.
    busy_poll: BusyPoll,
}

/// Removes an operation id from the outstanding set when the operation ends, however it
/// ends (a dropped future included), so acknowledgements never stall.
struct Outstanding<'a> {
    link: &'a DirectoryLink,
    operation: OperationId,
    /// The session the operation is sent in; a lost reply is resolved there.
    session: SessionId,
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.link.core().operations.end(self.operation);
    }
}

impl DirectoryLink {
    /// Connects and opens a new session (a new epoch: any earlier session of this node is
    /// fenced).
    pub async fn open(
        target: DirectoryAddress,
        write_order: Vec<Medium>,
        read_order: Vec<Medium>,
        core: Arc<Mutex<NodeCore>>,
    ) -> Result<DirectoryLink, LinkError> {
        let endpoint = quic::client_endpoint(target.bind)?;
        let target_busy_poll = target.busy_poll_tail;
        let rpc = connect(&endpoint, &target).await?;
        let binding = open_session(&rpc, &write_order, &read_order).await?;
        Ok(DirectoryLink {
            rpc: RwLock::new((rpc, 0)),
            heartbeats: tokio::sync::Mutex::new(None),
            reconnecting: tokio::sync::Mutex::new(None),
            endpoint,
            target,
            write_order,
            read_order,
            binding: RwLock::new(binding),
            serving: AtomicBool::new(true),
            reachable: AtomicBool::new(true),
            outages: std::sync::atomic::AtomicU64::new(0),
            core,
            busy_poll: BusyPoll::spawn_local(target_busy_poll),
        })
    }

    /// The session bound now.
    pub fn binding(&self) -> Binding {
        match self.binding.read() {
            Ok(binding) => binding.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The current session.
    pub fn session(&self) -> SessionId {
        self.binding().session
    }

    /// Items one batched request may carry at the directory.
    pub fn batch_items_max(&self) -> usize {
        self.binding().batch_items_max
    }

    /// Whether client requests are served (false while rejoining).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Whether the directory answered the node's latest requests or heartbeat: while it
    /// does not, [`DirectoryLink::call`] fails at once with `Unreachable`, without sending.
    pub fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Acquire)
    }

    /// How many times the directory went out of reach since the node started.
    pub fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// The directory answered: requests go to it again.
    fn mark_reachable(&self) {
        if !self.reachable.swap(true, Ordering::AcqRel) {
            tracing::info!("the directory answers again");
        }
    }

    /// The directory did not answer on connection `generation`: requests fail at once until
    /// a heartbeat is answered (logged once per outage, not once per request). A failure on
    /// a connection already replaced (a late timeout of a request sent to a dead leader,
    /// after the node rejoined its successor) says nothing of the current one.
    fn mark_unreachable_in(&self, generation: u64, error: &WireError) {
        let Ok(current) = self.rpc.read() else {
            return;
        };
        if generation != current.1 {
            return;
        }
        if self.reachable.swap(false, Ordering::AcqRel) {
            // Requests still waiting on this connection would wait out their timeouts for a
            // directory that does not answer: they fail now, and those whose outcome matters
            // are resolved once it answers again.
            current
                .0
                .abandon("the directory stopped answering: given up until it answers again");
            self.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, "the directory is out of reach: engines get misses and skipped stores until it answers");
        }
    }

    /// Stops serving clients: the session was lost and a rejoin begins.
    pub fn stop_serving(&self) {
        self.serving.store(false, Ordering::Release);
    }

    /// Serves clients again: the rejoin reported what the node holds.
    pub fn resume_serving(&self) {
        self.serving.store(true, Ordering::Release);
    }

    /// Opens a new session on a new connection after the old one was lost: a new epoch,
    /// the new binding returned. The caller re-registers and reports what the node holds,
    /// then calls [`DirectoryLink::resume_serving`].
    pub async fn reopen(&self) -> Result<Binding, LinkError> {
        let _single_flight = self.reconnecting.lock().await;
        let rpc = connect(&self.endpoint, &self.target).await?;
        let binding = open_session(&rpc, &self.write_order, &self.read_order).await?;
        if let Ok(mut current) = self.rpc.write() {
            let generation = current.1 + 1;
            let old = std::mem::replace(&mut *current, (rpc, generation));
            // Requests of the old session wait for nothing more: each fails at once and
            // resolves as not applied (its session ended).
            old.0.abandon("the session was replaced");
        }
        if let Ok(mut bound) = self.binding.write() {
            *bound = binding.clone();
        }
        *self.heartbeats.lock().await = None;
        self.mark_reachable();
        Ok(binding)
    }

    fn core(&self) -> std::sync::MutexGuard<'_, NodeCore> {
        lock_core(&self.core)
    }

    /// How many times the connection was replaced (`u64::MAX` if a writer panicked).
    fn generation(&self) -> u64 {
        self.rpc.read().map_or(u64::MAX, |current| current.1)
    }

    fn current(&self) -> Result<(Rpc, u64), LinkError> {
        self.rpc
            .read()
            .map(|current| current.clone())
            .map_err(|_| LinkError::Unexpected("poisoned link".into()))
    }

    /// Replaces the connection that was current as `seen` (a generation from a failed
    /// call) and binds the new one to the same session; a no-op when another task already
    /// did. Fails with `Refused(Directory(Fenced))` when the session ended meanwhile.
    async fn reconnect_after(&self, seen: u64) -> Result<(), LinkError> {
        let mut last_failure = self.reconnecting.lock().await;
        if self.current()?.1 != seen {
            return Ok(());
        }
        if !self.is_serving() {
            return Err(LinkError::Rejoining);
        }
        // Callers queued behind a reconnect that just failed share its failure rather than
        // each waiting out a handshake of their own.
        if last_failure.is_some_and(|(generation, at): (u64, std::time::Instant)| {
            generation == seen && at.elapsed() < DIRECTORY_REQUEST_TIMEOUT
        }) {
            return Err(LinkError::Wire(WireError::ConnectionLost {
                reason: "the directory is not reachable".into(),
            }));
        }
        let rpc = match connect(&self.endpoint, &self.target).await {
            Ok(rpc) => rpc,
            Err(error) => {
                *last_failure = Some((seen, std::time::Instant::now()));
                return Err(error);
            }
        };
        match rpc
            .call(DirectoryRequest::Resume {
                session: self.session(),
            })
            .await?
        {
            DirectoryReply::Resumed(_) => {}
            DirectoryReply::Error(error) => return Err(LinkError::Refused(error)),
            other => return Err(LinkError::Unexpected(format!("{other:?}"))),
        }
        if let Ok(mut current) = self.rpc.write() {
            *current = (rpc, seen + 1);
        }
        self.mark_reachable();
        Ok(())
    }

    /// Sends one request of a client or a task; `Rejoining` while the node rejoins,
    /// `Unreachable` (at once, nothing sent) while the directory does not answer.
    pub async fn call(&self, request: DirectoryRequest) -> Result<DirectoryReply, LinkError> {
        if !self.is_serving() {
            return Err(LinkError::Rejoining);
        }
        if !self.is_reachable() {
            return Err(LinkError::Unreachable);
        }
        self.send(request).await
    }

    /// Sends one request in `session` only: `SessionEnded` once the node has another.
    pub async fn call_in(
        &self,
        session: SessionId,
        request: DirectoryRequest,
    ) -> Result<DirectoryReply, LinkError> {
        if self.session() != session {
            return Err(LinkError::SessionEnded);
        }
        self.call(request).await
    }

    /// Sends one heartbeat on the heartbeat connection (opened, and bound to the session
    /// with `Resume`, on first use and after a loss). A heartbeat that gets no answer
    /// within `wait` (what the directory's round trips say, `node::ReplyTimer`) is sent
    /// once more at once on a new connection to every directory address, given the
    /// heartbeat period (at most [`DIRECTORY_REQUEST_TIMEOUT`], connecting included): a
    /// restarted or newly elected directory is found about one round-trip wait after its
    /// predecessor went silent rather than after QUIC's idle timeout.
    pub async fn heartbeat(
        &self,
        acknowledged_through: Option<OperationId>,
        wait: Duration,
    ) -> Result<DirectoryReply, LinkError> {
        let generation = self.generation();
        let period = self
            .binding()
            .heartbeat_interval
            .min(DIRECTORY_REQUEST_TIMEOUT);
        let mut answer = Err(LinkError::Wire(WireError::Timeout { timeout: period }));
        for timeout in [wait.min(period), period] {
            let beat = self.heartbeat_unbounded(acknowledged_through);
            answer = tokio::time::timeout(timeout, beat)
                .await
                .unwrap_or(Err(LinkError::Wire(WireError::Timeout { timeout })));
            if !matches!(answer, Err(LinkError::Wire(_))) {
                break;
            }
            *self.heartbeats.lock().await = None;
        }
        match &answer {
            Err(LinkError::Wire(error)) => self.mark_unreachable_in(generation, error),
            // Any answer, a refusal included, is the directory's.
            _ => self.mark_reachable(),
        }
        answer
    }

    async fn heartbeat_unbounded(
        &self,
        acknowledged_through: Option<OperationId>,
    ) -> Result<DirectoryReply, LinkError> {
        let mut channel = self.heartbeats.lock().await;
        let rpc = match channel.as_ref() {
            Some(rpc) => rpc.clone(),
            None => {
                let rpc = connect(&self.endpoint, &self.target).await?;
                let session = self.session();
                match rpc.call(DirectoryRequest::Resume { session }).await? {
                    DirectoryReply::Resumed(_) => {}
                    DirectoryReply::Error(error) => return Err(LinkError::Refused(error)),
                    other => return Err(LinkError::Unexpected(format!("{other:?}"))),
                }
                channel.insert(rpc).clone()
            }
        };
        drop(channel);
        match rpc
            .call(DirectoryRequest::Heartbeat {
                acknowledged_through,
            })
            .await
        {
            Ok(DirectoryReply::Error(error)) => Err(LinkError::Refused(error)),
            Ok(reply) => Ok(reply),
            Err(error) => {
                *self.heartbeats.lock().await = None;
                Err(LinkError::Wire(error))
            }
        }
    }

    /// Sends one request whatever the node's state (the rejoin's own requests); a refusal
    /// becomes `LinkError::Refused`. A lost connection is replaced (once, for every caller
    /// that saw it fail) before the error is returned.
    pub async fn send(&self, request: DirectoryRequest) -> Result<DirectoryReply, LinkError> {
        let (rpc, generation) = self.current()?;
        // A long wait for tasks is no request whose reply is due, nor is one nobody waits for.
        let watched = !matches!(request, DirectoryRequest::AwaitTasks { .. })
            && UNWATCHED.try_with(|_| ()).is_err();
        let awaiting = watched.then(|| self.busy_poll.awaiting());
        let reply = rpc.call(request).await;
        drop(awaiting);
        match reply {
            Ok(DirectoryReply::Error(error)) => Err(LinkError::Refused(error)),
            Ok(reply) => Ok(reply),
            // Given up while the directory does not answer: the heartbeats look for it.
            Err(error @ WireError::ConnectionLost { .. }) if !self.is_reachable() => {
                Err(LinkError::Wire(error))
            }
            Err(error @ WireError::ConnectionLost { .. }) => {
                match self.reconnect_after(generation).await {
                    // The session ended while disconnected (fenced): that is the answer.
                    Err(LinkError::Refused(refusal)) => Err(LinkError::Refused(refusal)),
                    Err(reconnect) => {
                        tracing::debug!(error = %reconnect, "reconnecting to the directory failed");
                        self.mark_unreachable_in(generation, &error);
                        Err(LinkError::Wire(error))
                    }
                    Ok(()) => Err(LinkError::Wire(error)),
                }
            }
            Err(error @ WireError::Timeout { .. }) => {
                self.mark_unreachable_in(generation, &error);
                Err(LinkError::Wire(error))
            }
            Err(error) => Err(LinkError::Wire(error)),
        }
    }

    /// The highest operation id below every one still waiting for its reply.
    pub fn acknowledged_through(&self) -> Option<OperationId> {
        self.core().operations.acknowledged_through()
    }

    fn begin(&self) -> Result<Outstanding<'_>, LinkError> {
        let operation = self.core().operations.begin().ok_or(LinkError::Busy)?;
        Ok(Outstanding {
            link: self,
            operation,
            session: self.session(),
        })
    }

    /// Reserves room for a store, in the session bound now, which is returned with the
    /// outcome (the reservation belongs to it). A lost reply is resolved: a reservation
    /// that was not applied reads as `Skip`.
    pub async fn reserve(
        &self,
        item: ReserveItem,
    ) -> (SessionId, Result<ReserveOutcome, LinkError>) {
        let guard = match self.begin() {
            Ok(guard) => guard,
            Err(error) => return (self.session(), Err(error)),
        };
        let (operation, session) = (guard.operation, guard.session);
        let outcome = match self
            .call_in(session, DirectoryRequest::Reserve { operation, item })
            .await
        {
            Ok(DirectoryReply::Reserved(outcome)) => Ok(outcome),
            Ok(other) => Err(LinkError::Unexpected(format!("{other:?}"))),
            Err(LinkError::Wire(_)) => self.resolve_reserve(session, operation).await,
            Err(error) => Err(error),
        };
        (session, outcome)
    }

    /// What became of a reserve whose reply was lost: one that was not applied reads as
    /// `Skip`; `Unresolved` when the directory could not say.
    async fn resolve_reserve(
        &self,
        session: SessionId,
        operation: OperationId,
    ) -> Result<ReserveOutcome, LinkError> {
        match self.resolve(session, operation).await {
            Ok(ResolveOutcome::Reserved(outcome)) => Ok(outcome),
            Ok(ResolveOutcome::NotApplied) => {
                Ok(ReserveOutcome::Skip(StoreSkip::DirectoryUnavailable))
            }
            Ok(_) | Err(_) => Err(LinkError::Unresolved(operation)),
        }
    }

    /// What became of a commit whose reply was lost: `Ok(None)` when it was not applied;
    /// `Unresolved` when the directory could not say.
    async fn resolve_commit(
        &self,
        session: SessionId,
        operation: OperationId,
    ) -> Result<Option<CommitOutcome>, LinkError> {
        match self.resolve(session, operation).await {
            Ok(ResolveOutcome::Committed(outcome)) => Ok(Some(outcome)),
            Ok(ResolveOutcome::NotApplied) => Ok(None),
            Ok(_) | Err(_) => Err(LinkError::Unresolved(operation)),
        }
    }

    /// Publishes a written replica reserved in `session`. A lost reply is resolved;
    /// `Err(Unresolved)` means the storage must stay allocated, `Ok(None)` that the commit
    /// was not applied (the reservation's session ended: it never will be).
    pub async fn commit(
        &self,
        session: SessionId,
        replica: ReplicaId,
        location: Location,
    ) -> Result<Option<CommitOutcome>, LinkError> {
        if self.session() != session {
            return Ok(None);
        }
        let guard = self.begin()?;
        let operation = guard.operation;
        let request = DirectoryRequest::Commit {
            operation,
            replica,
            location,
        };
        match self.call_in(session, request).await {
            Ok(DirectoryReply::Committed(outcome)) => Ok(Some(outcome)),
            Ok(other) => Err(LinkError::Unexpected(format!("{other:?}"))),
            Err(LinkError::SessionEnded) => Ok(None),
            Err(LinkError::Wire(_)) => self.resolve_commit(session, operation).await,
            Err(error) => Err(error),
        }
    }

    /// Asks for an extent of a shared pool. A lost reply is resolved: a grant that was not
    /// applied reads as `Full`.
    pub async fn grant_extent(&self, pool: PoolId) -> Result<ExtentGrant, LinkError> {
        let guard = self.begin()?;
        let operation = guard.operation;
        match self
            .call_in(
                guard.session,
                DirectoryRequest::GrantExtent { operation, pool },
            )
            .await
        {
            Ok(DirectoryReply::Extent(grant)) => Ok(grant),
            Ok(other) => Err(LinkError::Unexpected(format!("{other:?}"))),
            Err(LinkError::Wire(_)) => match self.resolve(guard.session, operation).await {
                Ok(ResolveOutcome::ExtentGranted(grant)) => Ok(grant),
                Ok(ResolveOutcome::NotApplied) => Ok(ExtentGrant::Full),
                Ok(_) | Err(_) => Err(LinkError::Unresolved(operation)),
            },
            Err(error) => Err(error),
        }
    }

    /// Gives an unwritten reservation of `session` back (best effort: it expires
    /// otherwise, and ended with its session).
    pub async fn abort(&self, session: SessionId, replica: ReplicaId) {
        let request = DirectoryRequest::Abort { replica };
        if let Err(error) = self.call_in(session, request).await {
            tracing::debug!(%error, ?replica, "abort failed; the reservation will expire");
        }
    }

    /// Gives back an extent that left its pool's allocator empty, and says what to do with
    /// it: `AddBack` an extent still this node's into the allocator; `Forget` one the
    /// directory took (or that is not this node's); one whose answer is unknown stays out
    /// of the allocator (`Resolve`), quarantined in the node core until
    /// [`DirectoryLink::resolve_returns`] learns what became of it. The caller applies the
    /// action; it never lets an extent have two writers.
    pub async fn give_back_extent(
        &self,
        pool: PoolId,
        offset_bytes: u64,
        length_bytes: u64,
        owner_word: Option<OwnerWord>,
    ) -> ExtentAction {
        let begun = self.core().begin_return(pool, offset_bytes, length_bytes);
        let Some(operation) = begun else {
            return ExtentAction::AddBack {
                pool,
                offset_bytes,
                length_bytes,
            };
        };
        let request = DirectoryRequest::ReturnExtent {
            operation,
            pool,
            offset_bytes,
            owner_word,
        };
        let answer = match self.call(request).await {
            Ok(DirectoryReply::ExtentReturned(answer)) => Some(answer),
            // A refusal (a fenced session, a full ledger) proves nothing about who may
            // write there next: never allocate in it again.
            Err(LinkError::Refused(_)) => Some(ExtentReturn::NotOwner),
            _ => None,
        };
        self.core()
            .return_answered(pool, offset_bytes, operation, answer)
    }

    /// Resolves the extent returns whose replies were lost: what to do with each extent
    /// (those still unknown stay quarantined and are not listed).
    pub async fn resolve_returns(&self) -> Vec<ExtentAction> {
        let unresolved = self.core().returns.unresolved();
        let mut actions = Vec::with_capacity(unresolved.len());
        for (pool, offset_bytes, operation) in unresolved {
            let Ok(outcome) = self.resolve(self.session(), operation).await else {
                continue;
            };
            let action = self
                .core()
                .return_resolved(pool, offset_bytes, operation, outcome);
            actions.push(action);
        }
        actions
    }

    /// What became of `operation`, sent in `session`. A session of an earlier directory
    /// incarnation that the directory does not know any more applied nothing that lasts:
    /// `NotApplied`.
    async fn resolve(
        &self,
        session: SessionId,
        operation: OperationId,
    ) -> Result<ResolveOutcome, LinkError> {
        let mut last_error = None;
        for _ in 0..RESOLVE_ATTEMPTS_MAX {
            let request = DirectoryRequest::Resolve {
                target: session,
                operation,
            };
            match self.send(request).await {
                Ok(DirectoryReply::Resolved(outcome)) => return Ok(outcome),
                Ok(other) => return Err(LinkError::Unexpected(format!("{other:?}"))),
                Err(LinkError::Refused(ProtocolError::Directory(
                    DirectoryError::UnknownSession,
                ))) if session.incarnation() != self.session().incarnation() => {
                    return Ok(ResolveOutcome::NotApplied)
                }
                Err(LinkError::Wire(error)) => last_error = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(last_error.map_or(LinkError::Unresolved(operation), LinkError::Wire))
    }
}

/// Opens a session on a negotiated connection.
async fn open_session(
    rpc: &Rpc,
    write_order: &[Medium],
    read_order: &[Medium],
) -> Result<Binding, LinkError> {
    let sent = std::time::Instant::now();
    let request = DirectoryRequest::Open {
        write_order: write_order.to_vec(),
        read_order: read_order.to_vec(),
    };
    match rpc.call(request).await? {
        DirectoryReply::Opened(opened) => Ok(Binding::of(&opened, sent)),
        DirectoryReply::Error(error) => Err(LinkError::Refused(error)),
        other => Err(LinkError::Unexpected(format!("{other:?}"))),
    }
}

mod batch;
mod connect;

pub use batch::CommitRequest;
use connect::connect;
pub use connect::STANDBY_CONNECT_TIMEOUT;
