//! The writing half of an [`super::RpcClient`]: the caller writes its own frame.
//!
//! A call writes its encoded frame to the stream from its own task when nothing is queued
//! before it and the stream takes the whole frame at once (a QUIC stream with room in its
//! send window, a Unix socket with room in its buffer), so a request crosses no task before
//! the transport: no channel send, no wake-up of a writer task on another thread. Whatever
//! the stream does not take at once is queued, in order, for the driver task, which writes
//! it as the stream becomes writable. The write is synchronous under a lock, so a call
//! dropped at any point never leaves half a frame behind.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use tokio::io::AsyncWrite;
use tokio::sync::Notify;

use crate::wire::WireError;

/// The stream of a session, type-erased so the client stays generic over messages only.
type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// The writing half shared by a client's callers and its driver task.
pub(super) struct Outgoing {
    state: Mutex<State>,
    /// Wakes the driver: something was queued, a flush is owed, or the stream failed.
    work: Notify,
    /// Wakes callers waiting for room in the queue.
    room: Notify,
    /// Frames the queue holds at most: the client's in-flight calls (a call whose frame is
    /// queued may have been dropped since, so the bound is kept here, not by the slots).
    queued_max: usize,
}

struct State {
    writer: Writer,
    /// Frames not yet written, oldest first; at most `queued_max`.
    queued: VecDeque<Vec<u8>>,
    /// Bytes of the oldest queued frame already written.
    written: usize,
    /// Bytes were written since the last completed flush.
    unflushed: bool,
    /// Why the stream failed; set once, then every send fails.
    failed: Option<String>,
}

/// What a caller's attempt to hand over its frame came to.
enum Handed {
    /// Written or queued: the frame will go out in order.
    Done,
    /// The queue is full: wait for room and try again.
    Full(Vec<u8>),
}

impl Outgoing {
    /// The writing half over `writer`, queueing at most `queued_max` frames.
    pub(super) fn new<W>(writer: W, queued_max: usize) -> Outgoing
    where
        W: AsyncWrite + Send + 'static,
    {
        Outgoing {
            state: Mutex::new(State {
                writer: Box::pin(writer),
                queued: VecDeque::with_capacity(queued_max),
                written: 0,
                unflushed: false,
                failed: None,
            }),
            work: Notify::new(),
            room: Notify::new(),
            queued_max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The lock is never held across a panic-prone call; recover the data regardless.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `frame` over: written now, or queued behind earlier frames. Waits only while
    /// the queue is full. Errors with [`WireError::ConnectionLost`] once the stream failed.
    /// Cancel-safe: a frame is either handed over whole or not at all.
    pub(super) async fn send(&self, mut frame: Vec<u8>) -> Result<(), WireError> {
        loop {
            let room = self.room.notified();
            match self.try_send(frame)? {
                Handed::Done => return Ok(()),
                Handed::Full(back) => frame = back,
            }
            room.await;
        }
    }

    fn try_send(&self, frame: Vec<u8>) -> Result<Handed, WireError> {
        let mut state = self.lock();
        if let Some(reason) = &state.failed {
            return Err(WireError::ConnectionLost {
                reason: reason.clone(),
            });
        }
        // Write directly only when the driver owes nothing: then it is not waiting on the
        // stream either, and a poll here cannot take its wake-up away.
        if state.queued.is_empty() && !state.unflushed {
            let mut context = Context::from_waker(Waker::noop());
            let written = match state.write_some(&mut context, &frame) {
                Ok(written) => written,
                Err(error) => {
                    let reason = error.to_string();
                    state.failed = Some(reason.clone());
                    drop(state);
                    self.work.notify_one();
                    return Err(WireError::ConnectionLost { reason });
                }
            };
            if written == frame.len() {
                match state.writer.as_mut().poll_flush(&mut context) {
                    Poll::Ready(Ok(())) => return Ok(Handed::Done),
                    // The driver flushes (and learns of an error) in its own task.
                    Poll::Ready(Err(_)) | Poll::Pending => state.unflushed = true,
                }
            } else {
                state.queued.push_back(frame);
                state.written = written;
            }
            drop(state);
            self.work.notify_one();
            return Ok(Handed::Done);
        }
        if state.queued.len() >= self.queued_max {
            return Ok(Handed::Full(frame));
        }
        state.queued.push_back(frame);
        drop(state);
        self.work.notify_one();
        Ok(Handed::Done)
    }

    /// The driver's half: writes and flushes whatever callers left, until the stream fails
    /// (its reason returned) or `closing` resolves (every client dropped: the stream is
    /// drained and shut down).
    pub(super) async fn drive(&self, closing: impl std::future::Future<Output = ()>) -> String {
        let mut closing = std::pin::pin!(closing);
        loop {
            let closed = tokio::select! {
                () = self.work.notified() => false,
                () = &mut closing => true,
            };
            if let Err(error) = poll_fn(|context| self.poll_drain(context)).await {
                return error.to_string();
            }
            if let Some(reason) = self.lock().failed.clone() {
                return reason;
            }
            if closed {
                let shutdown =
                    poll_fn(|context| self.lock().writer.as_mut().poll_shutdown(context));
                return match shutdown.await {
                    Ok(()) => "every client dropped".to_string(),
                    Err(error) => error.to_string(),
                };
            }
        }
    }

    /// Writes the queued frames, then flushes; ready once nothing is owed.
    fn poll_drain(&self, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        while let Some(frame) = state.queued.pop_front() {
            let from = state.written;
            match state.writer.as_mut().poll_write(context, &frame[from..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(written)) if from + written < frame.len() => {
                    state.written = from + written;
                    state.queued.push_front(frame);
                }
                Poll::Ready(Ok(_)) => {
                    state.written = 0;
                    state.unflushed = true;
                    self.room.notify_waiters();
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {
                    state.queued.push_front(frame);
                    return Poll::Pending;
                }
            }
        }
        if state.unflushed {
            match state.writer.as_mut().poll_flush(context) {
                Poll::Ready(Ok(())) => state.unflushed = false,
                other => return other,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Fails every later send with `reason` (the session ended).
    pub(super) fn fail(&self, reason: &str) {
        let mut state = self.lock();
        if state.failed.is_none() {
            state.failed = Some(reason.to_string());
        }
        drop(state);
        self.room.notify_waiters();
    }
}

impl State {
    /// Writes as much of `frame` as the stream takes now, without waiting; the count
    /// written.
    fn write_some(&mut self, context: &mut Context<'_>, frame: &[u8]) -> io::Result<usize> {
        let mut written = 0;
        while written < frame.len() {
            match self.writer.as_mut().poll_write(context, &frame[written..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(more)) => written += more,
                Poll::Ready(Err(error)) => return Err(error),
                Poll::Pending => break,
            }
        }
        Ok(written)
    }
}
