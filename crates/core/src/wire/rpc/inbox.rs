//! The reading half of an [`super::RpcClient`] over a Unix socket: replies read by the
//! driver task, or by the thread of a blocking call that spins for its reply.
//!
//! A reply the driver task reads reaches a blocking call's thread through a wake-up of the
//! runtime thread the driver runs on (an interrupt to bring its CPU back, on a virtual
//! machine whose idle vCPUs halt) and then a hand-off. A thread that spins for its reply
//! anyway ([`crate::client::spin`]) can read the socket itself: it takes the inbox when
//! nobody else reads it, reads what the socket holds without waiting, and hands every
//! complete reply to its call, its own among them. The driver and the spinning threads
//! share one buffer under a lock, so every byte is read once and frames stay whole.
//!
//! Bounds: the buffer holds at most one partial frame ([`FRAME_HEADER_BYTES`] +
//! [`FRAME_PAYLOAD_BYTES_MAX`]) plus one read of [`READ_CHUNK_BYTES`]; a partial frame must
//! complete within [`FRAME_COMPLETION_TIMEOUT`] of its first byte, as with
//! [`read_frame`](crate::wire::frame::read_frame).

use std::cell::RefCell;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use tokio::time::Instant;

use serde::de::DeserializeOwned;
use tokio::net::unix::OwnedReadHalf;

use super::{Shared, CLOSED_REASON};
use crate::wire::codec::{self, FRAME_PAYLOAD_BYTES_MAX};
use crate::wire::frame::PROTOCOL_VERSION;
use crate::wire::frame::{FrameHeader, FRAME_COMPLETION_TIMEOUT, FRAME_HEADER_BYTES};
use crate::wire::WireError;

/// Bytes one read asks the socket for at most: a batch's reply of grants or leases fits.
pub(super) const READ_CHUNK_BYTES: usize = 64 << 10;

/// Replies of one connection, read from its socket by whoever gets there first.
pub(super) struct Inbox<Rep> {
    socket: OwnedReadHalf,
    buffered: Mutex<Buffered>,
    shared: Arc<Shared<Rep>>,
}

/// Bytes read and not yet parsed (`bytes[start..end]`): a partial frame at most, once the
/// complete ones are handed out. `bytes` keeps its length between reads (no zeroing per
/// read) and grows only for a frame longer than it.
#[derive(Default)]
struct Buffered {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
    /// When the first byte of the partial frame in `bytes` arrived.
    partial_since: Option<Instant>,
    /// Why the stream ended, once it did: every later read says the same.
    ended: Option<String>,
}

/// Who reads the socket.
#[derive(Clone, Copy)]
enum Reader {
    /// The driver task, woken by the runtime's reactor.
    Driver,
    /// A thread spinning for its reply, outside the runtime.
    Spinning,
}

/// What a read of the socket came to.
pub(super) enum Drained {
    /// Read what there was; the stream goes on.
    Open,
    /// The stream ended (or failed, or lost sync): why.
    Ended(String),
}

impl<Rep: DeserializeOwned> Inbox<Rep> {
    pub(super) fn new(socket: OwnedReadHalf, shared: Arc<Shared<Rep>>) -> Inbox<Rep> {
        Inbox {
            socket,
            buffered: Mutex::new(Buffered::default()),
            shared,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffered> {
        // The lock is never held across a panic-prone call; recover the data regardless.
        self.buffered.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The driver's loop: waits for the socket to be readable and reads it, until the
    /// stream ends; returns why.
    pub(super) async fn drive(&self) -> String {
        loop {
            let partial_since = self.lock().partial_since;
            let readable = self.socket.readable();
            let ready = match partial_since {
                None => readable.await,
                Some(since) => {
                    match tokio::time::timeout_at(since + FRAME_COMPLETION_TIMEOUT, readable).await
                    {
                        Ok(ready) => ready,
                        Err(_elapsed) => {
                            // A spinning caller may have completed the frame meanwhile.
                            if self.lock().partial_since == Some(since) {
                                return WireError::FrameTimeout {
                                    timeout: FRAME_COMPLETION_TIMEOUT,
                                }
                                .to_string();
                            }
                            continue;
                        }
                    }
                }
            };
            if let Err(error) = ready {
                return error.to_string();
            }
            if let Drained::Ended(reason) = self.read_locked(&mut self.lock(), Reader::Driver) {
                return reason;
            }
        }
    }

    /// Reads what the socket holds now, unless another thread is reading it: for a
    /// thread that spins for its reply. A stream that ended fails every waiting call.
    pub(super) fn try_read(&self) {
        let Ok(mut buffered) = self.buffered.try_lock() else {
            return;
        };
        if buffered.ended.is_some() {
            return;
        }
        if let Drained::Ended(reason) = self.read_locked(&mut buffered, Reader::Spinning) {
            drop(buffered);
            self.shared.fail_all(reason);
        }
    }

    /// Reads until the socket would block, handing out each complete reply.
    fn read_locked(&self, buffered: &mut Buffered, reader: Reader) -> Drained {
        if let Some(reason) = &buffered.ended {
            return Drained::Ended(reason.clone());
        }
        let drained = loop {
            let filled = buffered.end - buffered.start;
            buffered.make_room();
            let end = buffered.end;
            let spare = &mut buffered.bytes[end..];
            let read = match reader {
                // Through the reactor, which forgets the readiness it reported once the
                // socket would block (else the driver would wake again at once, forever).
                Reader::Driver => self.socket.try_read(spare),
                Reader::Spinning => read_without_waiting(&self.socket, spare),
            };
            buffered.end += *read.as_ref().unwrap_or(&0);
            match read {
                Ok(0) if filled == 0 => break Drained::Ended(CLOSED_REASON.to_string()),
                Ok(0) => break Drained::Ended(WireError::Truncated.to_string()),
                Ok(_) => {
                    if let Err(error) = self.hand_out(buffered) {
                        break Drained::Ended(error.to_string());
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break Drained::Open,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => break Drained::Ended(WireError::from(error).to_string()),
            }
        };
        if let Drained::Ended(reason) = &drained {
            buffered.ended = Some(reason.clone());
        }
        drained
    }

    /// Hands every complete frame in `buffered` to its call and keeps the rest (a partial
    /// frame). Errors when the stream lost sync (a bad magic, an oversized frame).
    fn hand_out(&self, buffered: &mut Buffered) -> Result<(), WireError> {
        let mut at = buffered.start;
        let first = at;
        while let Some(frame) = complete_frame(&buffered.bytes[at..buffered.end])? {
            let (header, payload) = frame;
            let request_id = header.request_id;
            let reply = if header.version != PROTOCOL_VERSION {
                Err(WireError::UnknownVersion {
                    version: header.version,
                    request_id,
                })
            } else {
                codec::decode::<Rep>(payload).map_err(|error| WireError::Malformed {
                    request_id,
                    reason: error.to_string(),
                })
            };
            at += FRAME_HEADER_BYTES + payload.len();
            self.shared.complete(request_id, reply);
        }
        buffered.start = at;
        let empty = buffered.start == buffered.end;
        if empty {
            (buffered.start, buffered.end) = (0, 0);
        }
        buffered.partial_since = match (empty, buffered.partial_since) {
            (true, _) => None,
            // The partial frame goes on: its clock keeps running.
            (false, Some(since)) if at == first => Some(since),
            // A frame after the ones handed out began in this read.
            (false, _) => Some(Instant::now()),
        };
        Ok(())
    }
}

impl Buffered {
    /// Makes room for a read of [`READ_CHUNK_BYTES`] after `end`: moves the partial frame
    /// to the front, and grows the buffer only when that is not enough (once, to its
    /// longest frame plus a read).
    fn make_room(&mut self) {
        if self.bytes.len() - self.end >= READ_CHUNK_BYTES {
            return;
        }
        self.bytes.copy_within(self.start..self.end, 0);
        (self.start, self.end) = (0, self.end - self.start);
        if self.bytes.len() - self.end < READ_CHUNK_BYTES {
            self.bytes.resize(self.end + READ_CHUNK_BYTES, 0);
        }
    }
}

/// Reads what `socket` holds into `buffer` without waiting (`WouldBlock` when nothing):
/// straight from the socket, so a thread outside the runtime reads a reply the moment it
/// lands, before the runtime's reactor has seen it (tokio's `try_read` answers from the
/// reactor's readiness). The reactor's readiness of a socket read here is only spurious
/// later: the driver's read then finds nothing and waits again.
fn read_without_waiting(socket: &OwnedReadHalf, buffer: &mut [u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let fd = socket.as_ref().as_raw_fd();
    // SAFETY: `buffer` is valid for writes of its length; `fd` is the socket this half owns
    // (open while `socket` lives).
    let read = unsafe {
        libc::recv(
            fd,
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(read).map_err(|_| io::Error::last_os_error())
}

/// The first frame of `bytes` when it is whole: its header and payload.
fn complete_frame(bytes: &[u8]) -> Result<Option<(FrameHeader, &[u8])>, WireError> {
    let Some(header) = bytes.first_chunk::<FRAME_HEADER_BYTES>() else {
        return Ok(None);
    };
    let header = FrameHeader::decode(header)?;
    let length = usize::try_from(header.payload_bytes).unwrap_or(usize::MAX);
    debug_assert!(
        length <= FRAME_PAYLOAD_BYTES_MAX,
        "decode checks the length"
    );
    Ok(bytes[FRAME_HEADER_BYTES..]
        .get(..length)
        .map(|payload| (header, payload)))
}

/// Something a spinning thread can read replies from.
pub(crate) trait ReadNow: Send + Sync {
    /// Reads what there is now, without waiting (see [`Inbox::try_read`]).
    fn read_now(&self);
}

impl<Rep: DeserializeOwned + Send + 'static> ReadNow for Inbox<Rep> {
    fn read_now(&self) {
        self.try_read();
    }
}

thread_local! {
    /// On a thread that spins for its replies: the inbox of the call it last sent (held
    /// weakly, so a connection's end is not delayed by a thread that called it once).
    static SPINNING: RefCell<Option<Option<Weak<dyn ReadNow>>>> = const { RefCell::new(None) };
}

/// Marks the current thread, until the guard drops, as one that spins for its replies:
/// calls sent from it leave their inbox for [`read_now`].
pub(crate) fn spinning() -> SpinningGuard {
    let previous = SPINNING.with(|spinning| spinning.borrow_mut().replace(None));
    SpinningGuard { previous }
}

/// Ends [`spinning`] (restoring what an enclosing guard had).
pub(crate) struct SpinningGuard {
    previous: Option<Option<Weak<dyn ReadNow>>>,
}

impl Drop for SpinningGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        SPINNING.with(|spinning| *spinning.borrow_mut() = previous);
    }
}

/// Records `inbox` as the one a spinning thread reads (no-op on other threads).
pub(super) fn sent_from_here(inbox: &Arc<dyn ReadNow>) {
    SPINNING.with(|spinning| {
        if let Some(slot) = spinning.borrow_mut().as_mut() {
            *slot = Some(Arc::downgrade(inbox));
        }
    });
}

/// On a spinning thread, reads what the inbox of its last call holds now.
pub(crate) fn read_now() {
    let inbox = SPINNING.with(|spinning| {
        spinning
            .borrow()
            .as_ref()
            .and_then(|slot| slot.as_ref().and_then(Weak::upgrade))
    });
    if let Some(inbox) = inbox {
        inbox.read_now();
    }
}

#[cfg(test)]
mod tests {
    use super::super::{RpcClient, RpcConfig};
    use super::*;
    use crate::wire::frame::{encode_frame, FrameHeader};
    use std::future::Future;
    use std::io::{Read, Write};
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    /// Runs `future` on this thread as a blocking call's thread does, reading the inbox
    /// while it spins, for at most 10 s.
    fn spin_on<F: Future>(future: F) -> F::Output {
        let _spinning = spinning();
        let mut context = Context::from_waker(Waker::noop());
        let mut future = pin!(future);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
                return output;
            }
            assert!(std::time::Instant::now() < deadline, "no reply within 10 s");
            read_now();
            std::hint::spin_loop();
        }
    }

    /// A client whose driver task never runs (a current-thread runtime nobody drives):
    /// only a spinning thread can read its replies. With the server's blocking socket.
    fn undriven_client() -> (
        tokio::runtime::Runtime,
        RpcClient<u64, u64>,
        std::os::unix::net::UnixStream,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let rpc = runtime.block_on(async {
            let stream = tokio::net::UnixStream::from_std(ours).unwrap();
            let rpc = RpcClient::spawn_unix(stream, RpcConfig::default()).unwrap();
            // One turn of the reactor while the driver waits: the socket is known to be
            // writable (a caller writes its frame itself), and the driver never runs again.
            tokio::time::sleep(Duration::from_millis(10)).await;
            rpc
        });
        (runtime, rpc, theirs)
    }

    /// Reads one request frame from the server's blocking socket: its id and value.
    fn read_request(server: &mut std::os::unix::net::UnixStream) -> (u64, u64) {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        server.read_exact(&mut header).unwrap();
        let header = FrameHeader::decode(&header).unwrap();
        let mut payload = vec![0u8; header.payload_bytes as usize];
        server.read_exact(&mut payload).unwrap();
        (header.request_id, codec::decode(&payload).unwrap())
    }

    #[test]
    fn a_spinning_thread_reads_replies_the_driver_never_sees() {
        let (runtime, rpc, mut server) = undriven_client();
        let _context = runtime.enter();
        let answered = std::thread::spawn(move || {
            let (first, value) = read_request(&mut server);
            let (second, other) = read_request(&mut server);
            // Both replies in one write, in reverse order, split mid-frame in two writes.
            let mut bytes = encode_frame(second, &(other * 10)).unwrap();
            bytes.extend(encode_frame(first, &(value * 10)).unwrap());
            let (front, back) = bytes.split_at(FRAME_HEADER_BYTES + 3);
            server.write_all(front).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            server.write_all(back).unwrap();
            server
        });
        let (first, second) = spin_on(async { tokio::join!(rpc.call(4), rpc.call(5)) });
        assert_eq!(first.unwrap(), 40);
        assert_eq!(second.unwrap(), 50);
        // The peer's end reaches a spinning caller too: its call fails, it does not hang.
        let server = answered.join().unwrap();
        let waiting = std::thread::spawn(move || {
            let mut server = server;
            read_request(&mut server);
        });
        let lost = spin_on(async {
            let call = rpc.call(6);
            tokio::pin!(call);
            call.await
        });
        waiting.join().unwrap();
        assert!(
            matches!(lost, Err(WireError::ConnectionLost { .. })),
            "{lost:?}"
        );
    }

    #[test]
    fn a_spinning_thread_that_finds_a_bad_frame_fails_every_call() {
        let (runtime, rpc, mut server) = undriven_client();
        let _context = runtime.enter();
        let replied = std::thread::spawn(move || {
            read_request(&mut server);
            server.write_all(&[0u8; FRAME_HEADER_BYTES]).unwrap();
            server
        });
        let result = spin_on(rpc.call(1));
        let _server = replied.join().unwrap();
        assert!(
            matches!(&result, Err(WireError::ConnectionLost { reason }) if reason.contains("magic")),
            "{result:?}"
        );
        let after = spin_on(rpc.call(2));
        assert!(
            matches!(after, Err(WireError::ConnectionLost { .. })),
            "{after:?}"
        );
    }

    #[test]
    fn the_buffer_keeps_a_partial_frame_and_grows_only_for_a_longer_one() {
        let mut buffered = Buffered::default();
        buffered.make_room();
        assert_eq!(buffered.bytes.len(), READ_CHUNK_BYTES);
        // 100 bytes of a frame at the end of a full read: moved to the front, no growth.
        (buffered.start, buffered.end) = (READ_CHUNK_BYTES - 100, READ_CHUNK_BYTES);
        buffered.bytes[READ_CHUNK_BYTES - 100] = 7;
        buffered.make_room();
        assert_eq!((buffered.start, buffered.end), (0, 100));
        assert_eq!(buffered.bytes[0], 7);
        assert_eq!(buffered.bytes.len(), READ_CHUNK_BYTES + 100);
        let length = buffered.bytes.len();
        buffered.make_room();
        assert_eq!(
            buffered.bytes.len(),
            length,
            "room enough: nothing moves or grows"
        );
    }
}
