//! The handoff: the first bytes a node writes on every local connection, before any frame.
//! It carries, as `SCM_RIGHTS`, the memory files the connection's client may map (the
//! node's sealed CPU pool for a client its tenant rules admit; nothing for one they refuse,
//! which then hears its refusal at hello). A pool handed this way has no path another
//! process could open, so only the processes a node admits ever map it.
//!
//! Layout (16 bytes, little-endian): magic `KVTIERHO`, version (u32, 1), count of files
//! (u32), the files attached to these bytes. A client reads exactly these 16 bytes, so the
//! frames behind them are untouched.

use super::WireError;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::UnixStream;

/// First bytes of a handoff.
const MAGIC: [u8; 8] = *b"KVTIERHO";
/// The layout this build writes and reads.
const VERSION: u32 = 1;
/// Bytes of a handoff, without its files.
const HANDOFF_BYTES: usize = 16;
/// The most files one handoff carries: a CPU pool and the CXL pools of a node, with room.
pub const HANDED_FILES_MAX: usize = 16;

/// Writes the handoff of `files` on a connection just accepted (nothing written on it yet,
/// so 16 bytes fit its send buffer at once). `InvalidConfig` past [`HANDED_FILES_MAX`];
/// `Io` when the socket refuses (the client left).
pub fn send(stream: &UnixStream, files: &[BorrowedFd<'_>]) -> Result<(), WireError> {
    if files.len() > HANDED_FILES_MAX {
        return Err(WireError::InvalidConfig {
            reason: "more memory files than a handoff carries",
        });
    }
    let mut bytes = [0u8; HANDOFF_BYTES];
    bytes[..8].copy_from_slice(&MAGIC);
    bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
    bytes[12..16].copy_from_slice(&(files.len() as u32).to_le_bytes());
    let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
    let mut control = ControlBuffer::new();
    let sent = stream.try_io(Interest::WRITABLE, || {
        send_with_files(stream, &bytes, &raw, &mut control)
    })?;
    if sent != HANDOFF_BYTES {
        return Err(WireError::Handoff {
            reason: "the socket took only part of the handoff",
        });
    }
    Ok(())
}

/// Reads the node's handoff from a connection just opened, within `timeout`: the files it
/// carries, in order. `Handoff` when the bytes are not a handoff, the files are missing or
/// more than [`HANDED_FILES_MAX`] (the kernel then closes what did not fit), or nothing
/// came in time; `Io` when the socket fails.
pub async fn receive(stream: &UnixStream, timeout: Duration) -> Result<Vec<OwnedFd>, WireError> {
    let mut bytes = [0u8; HANDOFF_BYTES];
    let mut filled = 0;
    let mut files = Vec::new();
    let read_all = async {
        while filled < HANDOFF_BYTES {
            let mut control = ControlBuffer::new();
            let (read, truncated) = stream
                .async_io(Interest::READABLE, || {
                    receive_with_files(stream, &mut bytes[filled..], &mut control, &mut files)
                })
                .await?;
            if truncated {
                return Err(WireError::Handoff {
                    reason: "more memory files than a handoff carries",
                });
            }
            if read == 0 {
                return Err(WireError::Handoff {
                    reason: "the connection closed before the handoff",
                });
            }
            filled += read;
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read_all).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(WireError::Handoff {
                reason: "no handoff in time (an older node?)",
            })
        }
    }
    if bytes[..8] != MAGIC {
        return Err(WireError::Handoff {
            reason: "the connection does not start with a handoff (an older node?)",
        });
    }
    if bytes[8..12] != VERSION.to_le_bytes() {
        return Err(WireError::Handoff {
            reason: "a handoff of another layout version",
        });
    }
    let mut count = [0u8; 4];
    count.copy_from_slice(&bytes[12..16]);
    if u32::from_le_bytes(count) as usize != files.len() {
        return Err(WireError::Handoff {
            reason: "the handoff's count differs from the files attached",
        });
    }
    Ok(files)
}

/// Room for the control message of [`HANDED_FILES_MAX`] descriptors, aligned for `cmsghdr`.
struct ControlBuffer {
    words: [u64; ControlBuffer::WORDS],
}

impl ControlBuffer {
    /// `CMSG_SPACE` of 16 descriptors is 16 + 64 bytes on 64-bit Linux; 32 words leave room.
    const WORDS: usize = 32;

    fn new() -> Self {
        Self {
            words: [0; Self::WORDS],
        }
    }

    fn bytes(&self) -> usize {
        std::mem::size_of_val(&self.words)
    }
}

/// One `sendmsg` of `bytes` with `files` attached as `SCM_RIGHTS` (none when empty).
fn send_with_files(
    stream: &UnixStream,
    bytes: &[u8],
    files: &[RawFd],
    control: &mut ControlBuffer,
) -> std::io::Result<usize> {
    let files_bytes = std::mem::size_of_val(files);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is a valid "no name, no control" header.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    if !files.is_empty() {
        // SAFETY: CMSG_SPACE only computes a size; `files_bytes` is at most 64.
        let space = unsafe { libc::CMSG_SPACE(files_bytes as u32) } as usize;
        debug_assert!(space <= control.bytes());
        message.msg_control = control.words.as_mut_ptr().cast();
        message.msg_controllen = space;
        // SAFETY: `message` points at `control`, which holds `space` bytes, so the first
        // header and its `files_bytes` of data lie inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(files_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                files.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(header),
                files_bytes,
            );
        }
    }
    // SAFETY: `message` points at `iov` and `control`, both alive for the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sent as usize)
}

/// One `recvmsg` into `bytes`, appending the descriptors of any `SCM_RIGHTS` to `files`
/// (close-on-exec). Returns the bytes read and whether the kernel cut the control data.
fn receive_with_files(
    stream: &UnixStream,
    bytes: &mut [u8],
    control: &mut ControlBuffer,
    files: &mut Vec<OwnedFd>,
) -> std::io::Result<(usize, bool)> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is a valid "no name, no control" header.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.words.as_mut_ptr().cast();
    message.msg_controllen = control.bytes();
    // SAFETY: `message` points at `iov` and `control`, both alive for the call and as long
    // as it says.
    let read = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
    if read < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `message.msg_controllen` bytes of `control` with whole
    // control messages; CMSG_FIRSTHDR/NXTHDR stay inside them.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data_bytes = (*header).cmsg_len - libc::CMSG_LEN(0) as usize;
                let count = data_bytes / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for index in 0..count {
                    let fd = std::ptr::read_unaligned(data.add(index));
                    // Each received descriptor is new to this process and owned by nothing else.
                    files.push(OwnedFd::from_raw_fd(fd));
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    Ok((read as usize, message.msg_flags & libc::MSG_CTRUNC != 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const WAIT: Duration = Duration::from_secs(5);

    fn memory_file(text: &[u8]) -> std::fs::File {
        // SAFETY: a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"kvtier-handoff-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: just created, owned by nothing else.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.write_all(text).unwrap();
        file
    }

    #[tokio::test]
    async fn files_arrive_in_order_and_frames_behind_are_untouched() {
        use std::os::fd::AsFd;
        let (node, client) = UnixStream::pair().unwrap();
        let (first, second) = (memory_file(b"first"), memory_file(b"second"));
        send(&node, &[first.as_fd(), second.as_fd()]).unwrap();
        let mut node = node;
        node.write_all(b"frame").await.unwrap();
        let files = receive(&client, WAIT).await.unwrap();
        assert_eq!(files.len(), 2);
        for (file, expected) in files.into_iter().zip([&b"first"[..], b"second"]) {
            let mut file = std::fs::File::from(file);
            file.rewind().unwrap();
            let mut text = Vec::new();
            file.read_to_end(&mut text).unwrap();
            assert_eq!(text, expected);
        }
        let mut client = client;
        let mut behind = [0u8; 5];
        client.read_exact(&mut behind).await.unwrap();
        assert_eq!(&behind, b"frame");
    }

    #[tokio::test]
    async fn an_empty_handoff_gives_no_files() {
        let (node, client) = UnixStream::pair().unwrap();
        send(&node, &[]).unwrap();
        assert!(receive(&client, WAIT).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_stream_that_is_no_handoff_is_refused() {
        let (mut node, client) = UnixStream::pair().unwrap();
        node.write_all(b"KVTIERPLxxxxxxxxxxxx").await.unwrap();
        assert!(matches!(
            receive(&client, WAIT).await,
            Err(WireError::Handoff { .. })
        ));
        let (node, client) = UnixStream::pair().unwrap();
        drop(node);
        assert!(matches!(
            receive(&client, WAIT).await,
            Err(WireError::Handoff { .. })
        ));
        let (_silent, client) = UnixStream::pair().unwrap();
        assert!(matches!(
            receive(&client, Duration::from_millis(50)).await,
            Err(WireError::Handoff { .. })
        ));
    }

    #[tokio::test]
    async fn a_count_that_differs_from_the_files_is_refused() {
        let (mut node, client) = UnixStream::pair().unwrap();
        let mut bytes = [0u8; HANDOFF_BYTES];
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&3u32.to_le_bytes());
        node.write_all(&bytes).await.unwrap();
        assert!(matches!(
            receive(&client, WAIT).await,
            Err(WireError::Handoff { .. })
        ));
    }
}
