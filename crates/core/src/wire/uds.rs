//! Unix domain sockets between the node and the engines' client libraries on the same host.
//! They carry the same frames as QUIC. Who can reach the socket is the socket file's mode
//! and group; who is served is the node's tenant rules, by the peer's credentials.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;

use tokio::net::{UnixListener, UnixStream};

use super::error::WireError;

/// Who may connect to a listening socket, through its file mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketMode {
    /// 0600: only processes of the node's user (engines running as the same user).
    OwnerOnly,
    /// 0660: also processes of the socket's group (engines in a shared service group).
    OwnerAndGroup,
}

impl SocketMode {
    fn bits(self) -> u32 {
        match self {
            SocketMode::OwnerOnly => 0o600,
            SocketMode::OwnerAndGroup => 0o660,
        }
    }
}

/// Listens on `path` with file mode `mode`, the file given group `group` when set.
///
/// A socket file left by a dead process is removed first. Refuses with
/// [`WireError::SocketInUse`] when a live listener answers on `path`, and with
/// [`WireError::NotASocket`] when `path` is another kind of file or a link (it is never
/// removed nor followed). The socket is bound inside a fresh private (0700) folder beside
/// `path`, given its mode and group there, and only then linked at `path` — a link that
/// fails when anything appeared at `path` meanwhile — so no one can connect before the
/// mode holds, and nothing at `path` is ever replaced. Must be called inside a tokio
/// runtime.
pub async fn bind(
    path: &Path,
    mode: SocketMode,
    group: Option<u32>,
) -> Result<UnixListener, WireError> {
    remove_stale_socket(path).await?;
    let parent = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let private = parent.join(format!(".{name}.{}.binding", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = (|| -> std::io::Result<UnixListener> {
        let staged = private.join("socket");
        let listener = UnixListener::bind(&staged)?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(mode.bits()))?;
        std::os::unix::fs::chown(&staged, None, group)?;
        fs::hard_link(&staged, path)?;
        Ok(listener)
    })();
    let _ = fs::remove_file(private.join("socket"));
    let _ = fs::remove_dir(&private);
    Ok(bound?)
}

/// Connects to the listener at `path`. Errors: [`WireError::Io`] (no such socket, refused,
/// permission denied).
pub async fn connect(path: &Path) -> Result<UnixStream, WireError> {
    Ok(UnixStream::connect(path).await?)
}

/// Removes `path` if it is a socket nobody listens on; does nothing if it does not exist.
async fn remove_stale_socket(path: &Path) -> Result<(), WireError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    if !metadata.file_type().is_socket() {
        return Err(WireError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match UnixStream::connect(path).await {
        Ok(_live) => Err(WireError::SocketInUse {
            path: path.to_path_buf(),
        }),
        Err(error) if error.kind() == ErrorKind::ConnectionRefused => match fs::remove_file(path) {
            Err(error) if error.kind() != ErrorKind::NotFound => Err(error.into()),
            _ => Ok(()),
        },
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::{read_frame, write_frame};
    use crate::wire::tls::tests::temp_directory;

    #[tokio::test]
    async fn bind_sets_the_mode_and_carries_frames() {
        let directory = temp_directory("uds-bind");
        let path = directory.join("node.sock");
        let listener = bind(&path, SocketMode::OwnerOnly, None).await.unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut client = connect(&path).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        write_frame(&mut client, 5, &"ping".to_string())
            .await
            .unwrap();
        let frame = read_frame::<_, String>(&mut server).await.unwrap();
        assert_eq!(frame, Some((5, "ping".to_string())));
        fs::remove_dir_all(&directory).unwrap();
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_is_refused() {
        let directory = temp_directory("uds-stale");
        let path = directory.join("node.sock");
        // A socket file whose listener is gone.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let live = bind(&path, SocketMode::OwnerAndGroup, None).await.unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660);
        let refused = bind(&path, SocketMode::OwnerOnly, None).await;
        assert!(
            matches!(refused, Err(WireError::SocketInUse { .. })),
            "{refused:?}"
        );
        drop(live);
        fs::remove_dir_all(&directory).unwrap();
    }

    #[tokio::test]
    async fn a_link_is_never_followed_nor_replaced() {
        let directory = temp_directory("uds-link");
        let path = directory.join("node.sock");
        let target = directory.join("elsewhere");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let refused = bind(&path, SocketMode::OwnerOnly, None).await;
        assert!(
            matches!(refused, Err(WireError::NotASocket { .. })),
            "{refused:?}"
        );
        assert!(!target.exists(), "nothing was created through the link");
        assert!(fs::symlink_metadata(&path).unwrap().is_symlink());
        fs::remove_dir_all(&directory).unwrap();
    }

    #[tokio::test]
    async fn a_regular_file_is_never_removed() {
        let directory = temp_directory("uds-file");
        let path = directory.join("node.sock");
        fs::write(&path, b"data").unwrap();
        let refused = bind(&path, SocketMode::OwnerOnly, None).await;
        assert!(
            matches!(refused, Err(WireError::NotASocket { .. })),
            "{refused:?}"
        );
        assert_eq!(fs::read(&path).unwrap(), b"data");
        fs::remove_dir_all(&directory).unwrap();
    }
}
