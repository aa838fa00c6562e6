//! Waiting for a reply on the calling thread of a blocking call: spin first, then sleep.
//!
//! A blocking call's reply is handed to its thread by a runtime thread (the connection's
//! reader). A thread that sleeps waits to be woken by it as well: a futex wake, and on a
//! virtual machine whose idle vCPUs halt, an interrupt to bring its CPU back, tens of
//! microseconds each time. A thread that spins for [`REPLY_SPIN`] first sees a reply that
//! comes within it at once; past it, it sleeps as before. The caller's thread is the one
//! that spins (it would wait anyway), never a runtime thread.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// How long a blocking call spins for its reply before it sleeps: a local hit's round trip
/// through the node is tens of microseconds; one through the directory, longer, sleeps.
pub const REPLY_SPIN: Duration = Duration::from_micros(100);

/// Wakes the thread that runs [`block_on`], and tells it a wake came.
struct Signal {
    woken: AtomicBool,
    thread: std::thread::Thread,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Runs `future` (a call of a [`Client`](super::Client) made on `runtime`) to its end on
/// the calling thread, as an engine's own thread calls the client: in `runtime`'s context
/// (its timers and sockets driven by the runtime's threads), spinning for up to
/// [`REPLY_SPIN`] for each wake before it sleeps (a wake is a reply or a timer: a call
/// spins at most that long per round trip). `Handle::block_on` does the same
/// but always sleeps. A thread already in a runtime's context gets `Handle::block_on`
/// itself, which refuses (panics) when called from a task, as it always did.
pub fn block_on<F: Future>(runtime: &Handle, future: F) -> F::Output {
    if Handle::try_current().is_ok() {
        return runtime.block_on(future);
    }
    let _context = runtime.enter();
    // Replies to calls sent from this thread may be read here while it spins.
    let _spinning = crate::wire::rpc::spinning();
    let signal = Arc::new(Signal {
        woken: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let waker = Waker::from(Arc::clone(&signal));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        // Each wait spins afresh: a call of several round trips spins for each reply.
        let started = Instant::now();
        while !signal.woken.swap(false, Ordering::Acquire) {
            if started.elapsed() < REPLY_SPIN {
                crate::wire::rpc::read_now();
                std::hint::spin_loop();
            } else {
                std::thread::park();
            }
        }
    }
}

/// Receives from `receiver` on the calling thread, spinning for up to [`REPLY_SPIN`]
/// before it sleeps; `None` when the sender was dropped. Must not be called from a task of a
/// runtime.
pub fn recv<T>(mut receiver: oneshot::Receiver<T>) -> Option<T> {
    let started = Instant::now();
    while started.elapsed() < REPLY_SPIN {
        match receiver.try_recv() {
            Ok(value) => return Some(value),
            Err(oneshot::error::TryRecvError::Empty) => std::hint::spin_loop(),
            // The receiver is spent: it must not be awaited again.
            Err(oneshot::error::TryRecvError::Closed) => return None,
        }
    }
    receiver.blocking_recv().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_future_that_waits_on_the_runtime_ends_and_a_reply_is_received() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // Past the spin: the thread must sleep and be woken by the runtime's timer.
        let slept = block_on(runtime.handle(), async {
            tokio::time::sleep(REPLY_SPIN * 20).await;
            7
        });
        assert_eq!(slept, 7);
        let (sender, receiver) = oneshot::channel();
        runtime.spawn(async move {
            tokio::time::sleep(REPLY_SPIN * 20).await;
            let _ = sender.send(9);
        });
        assert_eq!(recv(receiver), Some(9));
        // Dropped while spinning, and while asleep.
        let (sender, receiver) = oneshot::channel::<u8>();
        drop(sender);
        assert_eq!(recv(receiver), None, "a dropped sender ends the wait");
        let (sender, receiver) = oneshot::channel::<u8>();
        runtime.spawn(async move {
            tokio::time::sleep(REPLY_SPIN * 20).await;
            drop(sender);
        });
        assert_eq!(recv(receiver), None);
        // A thread already in the runtime's context gets the runtime's own block_on.
        let _inside = runtime.enter();
        assert_eq!(block_on(runtime.handle(), async { 5 }), 5);
    }
}
