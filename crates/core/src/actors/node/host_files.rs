//! What a node process creates on its host and removes when it goes, however it goes: the
//! instance lock (one process per node name and host), its pool file and its socket; and
//! the stop signals it honours at every step of its life. A file is removed only while it
//! is still the one this process created (same device and inode), so an old and a new
//! instance of one node never delete each other's files by path.

use anyhow::{bail, Context};
use futures_util::FutureExt;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// A file's identity: device and inode.
type Identity = (u64, u64);

fn identity_of(path: &Path) -> std::io::Result<Identity> {
    let metadata = std::fs::symlink_metadata(path)?;
    Ok((metadata.dev(), metadata.ino()))
}

/// A file this process created; removed on drop if `path` still names it.
#[derive(Debug)]
pub struct OwnedFile {
    path: PathBuf,
    identity: Identity,
}

impl OwnedFile {
    /// Takes ownership of the file now at `path` (just created by this process).
    pub fn record(path: &Path) -> anyhow::Result<OwnedFile> {
        let identity =
            identity_of(path).with_context(|| format!("reading back {}", path.display()))?;
        Ok(OwnedFile {
            path: path.to_path_buf(),
            identity,
        })
    }
}

impl OwnedFile {
    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for OwnedFile {
    fn drop(&mut self) {
        if identity_of(&self.path).is_ok_and(|identity| identity == self.identity) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The lock that makes this process the only instance of its node on this host: an
/// exclusive `flock` on `<socket>.lock`, held for the process's life and removed with it.
#[derive(Debug)]
pub struct InstanceLock {
    // Field order: the file is removed (by `_owned`) before its descriptor closes, which
    // releases the lock, so no other instance ever locks a file that is about to vanish.
    _owned: OwnedFile,
    _file: File,
}

impl InstanceLock {
    /// Takes the lock of the node whose socket is `socket`. Fails, saying so, when another
    /// instance of the node runs on this host.
    pub fn acquire(socket: &Path) -> anyhow::Result<InstanceLock> {
        let mut name = socket.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        // 0600: it says only which process holds the node.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening the instance lock {}", path.display()))?;
        // SAFETY: flock(2) on a descriptor this function owns; it changes no memory.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                bail!(
                    "another instance of this node runs on this host (it holds {}); stop it first",
                    path.display()
                );
            }
            return Err(error).with_context(|| format!("locking {}", path.display()));
        }
        // The file locked must still be the one at `path`: an instance that was just
        // leaving may have removed it after this one opened it.
        let metadata = file.metadata()?;
        if identity_of(&path).ok() != Some((metadata.dev(), metadata.ino())) {
            bail!(
                "the instance lock {} changed while starting; start the node again",
                path.display()
            );
        }
        std::fs::write(&path, format!("{}\n", std::process::id()))?;
        Ok(InstanceLock {
            _owned: OwnedFile::record(&path)?,
            _file: file,
        })
    }
}

/// SIGTERM and SIGINT (stop) and SIGHUP (reload), listened to from the very start of the
/// process: a signal that arrives during a blocking step (the pool's pre-fault) is seen
/// right after it, and none of them kills the process outright, so its files always go
/// with it. A SIGHUP before the node serves waits, and is answered once it serves.
pub struct Stop {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
}

/// What a signal asks of a serving node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signalled {
    /// SIGTERM or SIGINT: stop, removing what the process created.
    Stop,
    /// SIGHUP: re-read the configuration.
    Reload,
}

impl Stop {
    /// Starts listening; from now on the signals no longer kill the process outright.
    pub fn install() -> anyhow::Result<Stop> {
        Ok(Stop {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves when a stop signal arrives (or arrived since the last call).
    pub async fn wait(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }

    /// Resolves with the next stop or reload signal (or one that arrived since the last
    /// call).
    pub async fn next(&mut self) -> Signalled {
        tokio::select! {
            _ = self.terminate.recv() => Signalled::Stop,
            _ = self.interrupt.recv() => Signalled::Stop,
            _ = self.hangup.recv() => Signalled::Reload,
        }
    }

    /// Whether a stop signal arrived and was not seen yet.
    pub fn requested(&mut self) -> bool {
        self.wait().now_or_never().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let directory =
            std::env::temp_dir().join(format!("kvtier-host-files-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        directory
    }

    #[test]
    fn a_second_instance_is_refused_and_the_lock_goes_with_the_first() {
        let directory = scratch("lock");
        let socket = directory.join("node.sock");
        let first = InstanceLock::acquire(&socket).unwrap();
        let error = InstanceLock::acquire(&socket).unwrap_err();
        assert!(error.to_string().contains("another instance"), "{error}");
        drop(first);
        assert!(!directory.join("node.sock.lock").exists());
        let again = InstanceLock::acquire(&socket).unwrap();
        drop(again);
        std::fs::remove_dir_all(directory).unwrap();
    }

    #[test]
    fn a_file_replaced_by_another_instance_is_not_removed() {
        let directory = scratch("owned");
        let path = directory.join("pool");
        std::fs::write(&path, b"old").unwrap();
        let old = OwnedFile::record(&path).unwrap();
        // Moved aside, not removed, so the new file cannot reuse its inode number.
        std::fs::rename(&path, directory.join("pool.old")).unwrap();
        std::fs::write(&path, b"new").unwrap();
        drop(old);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let new = OwnedFile::record(&path).unwrap();
        drop(new);
        assert!(!path.exists());
        std::fs::remove_dir_all(directory).unwrap();
    }
}
