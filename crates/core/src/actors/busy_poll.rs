//! Busy polling around requests: a task that keeps its runtime's thread polling its sockets,
//! without sleeping, for a short tail after each request the process sent and each reply it
//! received (a directory reply, then an engine's next request, usually come within it).
//!
//! Why: a thread that sleeps in `epoll_wait` and is woken by a packet pays the wake-up, which
//! on a virtual machine whose idle vCPUs halt (as the firecracker hosts this project is
//! measured on: no guest halt polling) costs tens of microseconds, several times per request
//! through a node. A node that polls while its directory round trip is under way finds the
//! reply at once, and an engine's next request too. The cost is CPU: the thread spins as
//! long as traffic comes at least once per `tail`, and at most `tail` after the last of it;
//! an idle node sleeps as before. It spins only while at most one request waits for its
//! reply: with more in flight the thread has work enough, and on a host with few cores its
//! spinning would take CPU from the processes doing that work (the engines' copies).
//! (A long wait the node keeps open at the directory is not marked.)
//!
//! The spinning decision is [`keeps_spinning`], a pure function of the clock; the task only
//! applies it.

use crate::limits::BUSY_POLL_TAIL_MAX;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The spinning state a [`BusyPoll`] shares with its task.
struct Shared {
    /// Requests awaiting their replies.
    in_flight: AtomicUsize,
    /// When the last request was sent or reply received, in nanoseconds since `epoch`.
    last_activity_nanos: AtomicU64,
    epoch: Instant,
    /// Wakes the task: traffic, or the last handle gone.
    wake: Arc<Notify>,
    tail: Duration,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The task holds only a weak handle: woken, it finds it dead and ends.
        self.wake.notify_one();
    }
}

impl Shared {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn last_activity(&self) -> Duration {
        Duration::from_nanos(self.last_activity_nanos.load(Ordering::Acquire))
    }

    fn note_activity(&self) {
        let now = self.now().as_nanos() as u64;
        self.last_activity_nanos.fetch_max(now, Ordering::AcqRel);
        self.wake.notify_one();
    }
}

/// Busy polling for one runtime (see the module documentation). Cloning shares it.
#[derive(Clone)]
pub struct BusyPoll {
    shared: Option<Arc<Shared>>,
}

/// One request awaiting its reply: traffic when made and when dropped (the reply, or the
/// request's end in any other way).
pub struct Awaiting<'a> {
    shared: Option<&'a Shared>,
}

impl BusyPoll {
    /// Busy polling with `tail` (at most [`BUSY_POLL_TAIL_MAX`]), its task spawned on the
    /// current runtime: a current-thread runtime's (the node's) thread is the one it keeps
    /// awake. A zero `tail` turns it off: nothing is spawned and nothing spins.
    pub fn spawn_local(tail: Duration) -> BusyPoll {
        if tail.is_zero() {
            return BusyPoll::off();
        }
        let shared = Arc::new(Shared {
            in_flight: AtomicUsize::new(0),
            last_activity_nanos: AtomicU64::new(0),
            epoch: Instant::now(),
            wake: Arc::new(Notify::new()),
            tail: tail.min(BUSY_POLL_TAIL_MAX),
        });
        tokio::spawn(spin(Arc::downgrade(&shared), shared.wake.clone()));
        BusyPoll {
            shared: Some(shared),
        }
    }

    /// Busy polling that never spins.
    pub fn off() -> BusyPoll {
        BusyPoll { shared: None }
    }

    /// Marks a request sent; its drop marks the reply.
    pub fn awaiting(&self) -> Awaiting<'_> {
        let shared = self.shared.as_deref();
        if let Some(shared) = shared {
            shared.in_flight.fetch_add(1, Ordering::AcqRel);
            shared.note_activity();
        }
        Awaiting { shared }
    }
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared {
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            shared.note_activity();
        }
    }
}

/// Whether the thread keeps spinning at `now`: while the last request or reply came less
/// than `tail` ago and at most one request waits for its reply.
pub fn keeps_spinning(
    now: Duration,
    last_activity: Duration,
    tail: Duration,
    in_flight: usize,
) -> bool {
    in_flight <= 1 && now.saturating_sub(last_activity) < tail
}

/// The spinning task: waits for traffic, then spins (the runtime polls its sockets without
/// blocking) while [`keeps_spinning`] says so. Ends with the last handle.
async fn spin(shared: std::sync::Weak<Shared>, wake: Arc<Notify>) {
    loop {
        wake.notified().await;
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let in_flight = || strong.in_flight.load(Ordering::Acquire);
        while keeps_spinning(
            strong.now(),
            strong.last_activity(),
            strong.tail,
            in_flight(),
        ) {
            spin_once().await;
        }
    }
}

/// Returns `Pending` once, having woken its own task: the runtime runs its other ready
/// tasks and, having a ready task, polls its sockets without blocking, then polls this
/// again.
async fn spin_once() {
    let mut pending = true;
    std::future::poll_fn(|context| {
        if std::mem::take(&mut pending) {
            context.waker().wake_by_ref();
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_thread_spins_for_a_tail_after_the_last_traffic_with_one_request_at_most() {
        let tail = 200 * US;
        // (now, last request or reply, requests in flight, spins)
        let cases = [
            (100 * US, Duration::ZERO, 1, true),
            (199 * US, Duration::ZERO, 0, true),
            (200 * US, Duration::ZERO, 1, false),
            (249 * US, 50 * US, 0, true),
            (250 * US, 50 * US, 0, false),
            (10 * US, 50 * US, 1, true),
            // More than one request in flight: work enough, no spinning.
            (100 * US, 90 * US, 2, false),
        ];
        for (now, last_activity, in_flight, spins) in cases {
            assert_eq!(
                keeps_spinning(now, last_activity, tail, in_flight),
                spins,
                "{now:?} {last_activity:?} {in_flight}"
            );
        }
    }

    #[test]
    fn a_request_and_its_reply_are_traffic_and_off_spins_nothing() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let busy = BusyPoll::spawn_local(100 * US);
            let shared = busy.shared.clone().unwrap();
            let request = busy.awaiting();
            let sent = shared.last_activity();
            assert!(sent > Duration::ZERO);
            std::thread::sleep(Duration::from_millis(1));
            drop(request);
            assert!(shared.last_activity() >= sent + Duration::from_millis(1));
            let off = BusyPoll::off();
            let _request = off.awaiting();
            assert!(off.shared.is_none());
            assert!(BusyPoll::spawn_local(Duration::ZERO).shared.is_none());
        });
    }
}
