//! The directory's election through etcd: campaign until this process holds the leader key,
//! then renew its lease until the process stops or the lease is lost. The serving gate
//! ([`ServingGate`]) says whether requests may be answered now; the accept loop and the
//! directory actor check it, and a leader whose gate closed exits
//! ([`EXIT_DEPOSED`]) without answering another request. The arithmetic of the lease is
//! the sans-I/O [`Leadership`]; this module only makes the calls.

use crate::directory::leadership::Leadership;
use crate::model::{Clock, Timestamp};
use crate::wire::etcd::{Campaign, EtcdClient, EtcdError, EtcdLease};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The exit status of a leader that lost its lease: a supervisor restarts it, and it
/// campaigns again as a standby, under a new term if it wins.
pub const EXIT_DEPOSED: i32 = 75;
/// How often a standby reads the leader key while another process holds it: a failover
/// takes up to this long more than the lease's expiry (20 reads a second per standby).
pub const STANDBY_POLL: Duration = Duration::from_millis(50);
/// How long a failed etcd call waits before the next.
const RETRY_AFTER: Duration = Duration::from_millis(200);
/// At most one warning about etcd per this long, however often calls fail.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Whether this process may answer requests now: until the time the election last granted
/// (no election: always). Shared by the accept loop, the directory actor and the renewals.
#[derive(Debug)]
pub struct ServingGate {
    clock: Clock,
    valid_until: AtomicU64,
}

impl ServingGate {
    /// A gate open for good: a directory without an election.
    pub fn open() -> Arc<ServingGate> {
        Arc::new(ServingGate {
            clock: Clock::start(),
            valid_until: AtomicU64::new(u64::MAX),
        })
    }

    /// A closed gate: a standby's, until it wins.
    pub fn closed() -> Arc<ServingGate> {
        Arc::new(ServingGate {
            clock: Clock::start(),
            valid_until: AtomicU64::new(0),
        })
    }

    /// The gate's clock's time.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Whether requests may be answered now.
    pub fn serving(&self) -> bool {
        self.clock.now().0 < self.valid_until.load(Ordering::Acquire)
    }

    fn follow(&self, leadership: &Leadership) {
        self.valid_until
            .store(leadership.valid_until().0, Ordering::Release);
    }

    /// Exits the process with [`EXIT_DEPOSED`] when the gate is closed: called before any
    /// request is answered, so a leader past its lease never answers one.
    pub fn exit_unless_serving(&self) {
        if !self.serving() {
            tracing::error!("the directory's leader lease lapsed: it stops serving and exits, never to serve again under this term");
            std::process::exit(EXIT_DEPOSED);
        }
    }
}

/// What a directory campaigns with.
#[derive(Clone, Debug)]
pub struct ElectionSettings {
    /// The etcd client.
    pub etcd: EtcdClient,
    /// The leader key.
    pub key: String,
    /// This process's address, the key's value while it leads.
    pub address: String,
    /// The lease's time to live.
    pub ttl: Duration,
}

/// Campaigns until this process leads: grants a lease, puts the key under it if absent,
/// and while another holds it waits for the key to go ([`STANDBY_POLL`]). Returns the
/// lease and the leadership, the gate opened.
pub async fn campaign(settings: &ElectionSettings, gate: &ServingGate) -> (EtcdLease, Leadership) {
    let mut warned: Option<Timestamp> = None;
    let mut last_holder = String::new();
    loop {
        let granted_at = gate.now();
        let attempt = async {
            let (lease, ttl) = settings.etcd.grant(settings.ttl).await?;
            let outcome = settings
                .etcd
                .campaign(&settings.key, &settings.address, lease)
                .await;
            if !matches!(outcome, Ok(Campaign::Won { .. })) {
                // Best effort: an unused lease expires by itself anyway.
                let _ = settings.etcd.revoke(lease).await;
            }
            Ok::<_, EtcdError>((lease, ttl, outcome?))
        };
        match attempt.await {
            Ok((lease, ttl, Campaign::Won { term })) => {
                if ttl > settings.ttl {
                    tracing::warn!(
                        asked = ?settings.ttl,
                        granted = ?ttl,
                        "etcd raised the leader lease to its minimum (1.5 × its election timeout, in whole seconds): failovers take that long"
                    );
                }
                let leadership = Leadership::won(term, granted_at, ttl);
                gate.follow(&leadership);
                tracing::info!(term, key = %settings.key, "elected: this directory leads");
                return (lease, leadership);
            }
            Ok((_, _, Campaign::Held { holder })) => {
                if holder != last_holder {
                    tracing::info!(%holder, "standing by: another directory leads");
                    last_holder = holder;
                }
                wait_for_vacancy(settings, gate, &mut warned).await;
            }
            Err(error) => {
                warn_rarely(gate, &mut warned, &error);
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

/// Reads the leader key until it is gone (its holder's lease expired or was revoked).
async fn wait_for_vacancy(
    settings: &ElectionSettings,
    gate: &ServingGate,
    warned: &mut Option<Timestamp>,
) {
    loop {
        tokio::time::sleep(STANDBY_POLL).await;
        match settings.etcd.get(&settings.key).await {
            Ok(None) => return,
            Ok(Some(_)) => {}
            Err(error) => warn_rarely(gate, warned, &error),
        }
    }
}

/// Renews the lease every [`Leadership::renew_interval`] while the leadership lasts, the
/// gate following it. Returns when it is lost (etcd no longer knows the lease, or no
/// renewal succeeded in time): the caller exits.
pub async fn hold(
    settings: &ElectionSettings,
    lease: EtcdLease,
    mut leadership: Leadership,
    gate: &ServingGate,
) -> &'static str {
    let mut warned = None;
    loop {
        tokio::time::sleep(leadership.renew_interval()).await;
        let sent_at = gate.now();
        match settings.etcd.keep_alive(lease).await {
            Ok(Some(ttl)) => leadership.renewed(sent_at, ttl),
            Ok(None) => leadership.lose(),
            Err(error) => warn_rarely(gate, &mut warned, &error),
        }
        gate.follow(&leadership);
        if !leadership.serving(gate.now()) {
            return "the leader lease lapsed";
        }
    }
}

/// Gives the leadership up at once (a clean stop): a standby takes over without waiting
/// for the lease to expire.
pub async fn resign(settings: &ElectionSettings, lease: EtcdLease, gate: &ServingGate) {
    gate.valid_until.store(0, Ordering::Release);
    if let Err(error) = settings.etcd.revoke(lease).await {
        tracing::warn!(%error, "could not revoke the leader lease: a standby takes over when it expires");
    }
}

fn warn_rarely(gate: &ServingGate, warned: &mut Option<Timestamp>, error: &EtcdError) {
    let now = gate.now();
    if warned.is_none_or(|at| now.saturating_since(at) >= WARN_EVERY) {
        tracing::warn!(%error, "etcd did not answer the election (logged at most every 10 s)");
        *warned = Some(now);
    }
}
