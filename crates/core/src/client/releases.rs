//! Leases the client gives back in the background: those of dropped views and of finished
//! copies, sent in batches a short linger after the first arrived, and flushed before any
//! request whose answer depends on them (a retire must not see this client's own dropped
//! lease as a reader).

use super::{release, ClientError, ClientReply, ClientRequest};
use crate::model::LeaseId;
use crate::wire::RpcClient;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Leases waiting for the background releaser (dropped views, finished copies); past this
/// a dropped view's lease expires at the directory and a copy releases inline.
pub const DROPPED_LEASES_QUEUED_MAX: usize = 4096;
/// How long the background releaser waits for more leases before it sends a release: an
/// engine loading one prefix after another sends one release for many loads instead of one
/// per load, so a load costs the node and the directory one round trip, not two. A lease is
/// held at most this much longer than its copy (its replica's eviction waits as long),
/// against lease durations of seconds.
const RELEASE_LINGER: Duration = Duration::from_millis(2);

/// The queue of leases to give back, shared by a client's clones and its views. Cheap to
/// clone. The releaser task ends once every clone is gone, after releasing what is left.
#[derive(Clone)]
pub(super) struct DroppedLeases {
    /// Leases not yet taken by a release, at most [`DROPPED_LEASES_QUEUED_MAX`].
    pending: Arc<Mutex<Vec<LeaseId>>>,
    /// One token wakes the releaser when `pending` stops being empty (capacity 1: leases
    /// queued meanwhile wake nobody; a wake-up per load costs a thread switch).
    wake: mpsc::Sender<()>,
    /// Held while a batch taken from `pending` is on its way: a flush that takes it next
    /// knows every lease queued before it has reached the node.
    sending: Arc<tokio::sync::Mutex<()>>,
}

impl DroppedLeases {
    /// The queue, and its releaser spawned on the current runtime.
    pub(super) fn spawn(
        rpc: RpcClient<ClientRequest, ClientReply>,
        batch_items_max: Arc<AtomicUsize>,
    ) -> DroppedLeases {
        let (wake, woken) = mpsc::channel(1);
        let queue = DroppedLeases {
            pending: Arc::new(Mutex::new(Vec::new())),
            wake,
            sending: Arc::new(tokio::sync::Mutex::new(())),
        };
        let releaser = Releaser {
            pending: queue.pending.clone(),
            sending: queue.sending.clone(),
            rpc,
            batch_items_max,
        };
        tokio::spawn(releaser.run(woken));
        queue
    }

    /// Queues `lease`; false when the queue is full (the caller releases it itself, or lets
    /// it expire). Never blocks on the network.
    pub(super) fn push(&self, lease: LeaseId) -> bool {
        let Ok(mut pending) = self.pending.lock() else {
            return false;
        };
        if pending.len() >= DROPPED_LEASES_QUEUED_MAX {
            return false;
        }
        pending.push(lease);
        if pending.len() == 1 {
            // Full: a token is already waiting, and it will take this lease too.
            let _ = self.wake.try_send(());
        }
        true
    }

    /// Releases every lease queued before this call, waiting for a batch already on its way:
    /// when it returns, the node has seen them all (best effort: a lease not released
    /// expires).
    pub(super) async fn flush(
        &self,
        rpc: &RpcClient<ClientRequest, ClientReply>,
        batch_items_max: &AtomicUsize,
    ) -> Result<(), ClientError> {
        let _sending = self.sending.lock().await;
        let leases = take(&self.pending);
        release(rpc, batch_items_max, &leases).await
    }
}

/// The background task behind a [`DroppedLeases`].
struct Releaser {
    pending: Arc<Mutex<Vec<LeaseId>>>,
    sending: Arc<tokio::sync::Mutex<()>>,
    rpc: RpcClient<ClientRequest, ClientReply>,
    batch_items_max: Arc<AtomicUsize>,
}

impl Releaser {
    /// Sleeps through the linger after each wake-up, then releases everything queued; ends
    /// when every [`DroppedLeases`] clone is gone, releasing what they left.
    async fn run(self, mut woken: mpsc::Receiver<()>) {
        while woken.recv().await.is_some() {
            tokio::time::sleep(RELEASE_LINGER).await;
            self.release_pending().await;
        }
        self.release_pending().await;
    }

    async fn release_pending(&self) {
        let _sending = self.sending.lock().await;
        let leases = take(&self.pending);
        // Best effort: a lease not released expires.
        let _ = release(&self.rpc, &self.batch_items_max, &leases).await;
    }
}

/// Empties `pending` (nothing when its lock was poisoned: those leases expire).
fn take(pending: &Mutex<Vec<LeaseId>>) -> Vec<LeaseId> {
    pending
        .lock()
        .map(|mut pending| std::mem::take(&mut *pending))
        .unwrap_or_default()
}
