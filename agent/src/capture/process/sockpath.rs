//! Claiming a Unix socket path without hijacking or destroying anything: only a stale socket
//! (one nobody listens on) owned by this user is removed; a live one means another agent is
//! running, and anything else at the path is left alone. On exit, the path is removed only if
//! it is still the socket this process created.
use std::{
    io::ErrorKind,
    os::unix::{
        fs::{FileTypeExt, MetadataExt},
        net::UnixStream,
    },
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClaimError {
    #[error(
        "{0} is in use: another process (another inferscope agent?) is listening on it; stop it or pick another path"
    )]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket; refusing to remove it: pick another path")]
    NotASocket(PathBuf),
    #[error(
        "{0} is a socket owned by uid {1}, not by this user; refusing to remove it: pick another path"
    )]
    NotOurs(PathBuf, u32),
    #[error("cannot remove the stale socket {0}: {1}")]
    Remove(PathBuf, std::io::Error),
    #[error("cannot inspect {0}: {1}")]
    Inspect(PathBuf, std::io::Error),
}

/// Makes `path` free to bind: nothing there, or a stale socket of this user, removed.
pub(crate) fn claim(path: &Path) -> Result<(), ClaimError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ClaimError::Inspect(path.into(), e)),
    };
    if !meta.file_type().is_socket() {
        return Err(ClaimError::NotASocket(path.into()));
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(ClaimError::NotOurs(path.into(), meta.uid()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ClaimError::InUse(path.into())),
        // Nobody listens: a socket left by an agent that did not exit cleanly.
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => std::fs::remove_file(path)
            .or_else(|e| {
                if e.kind() == ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| ClaimError::Remove(path.into(), e)),
        Err(e) => Err(ClaimError::Inspect(path.into(), e)),
    }
}

/// The identity of the socket file this process bound, so exit removes only that one.
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Bound {
    /// Remembers the file now at `path` (call right after bind).
    pub(crate) fn new(path: &Path) -> Option<Self> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        Some(Self {
            path: path.into(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Removes the path if it still is the socket this process bound.
    pub(crate) fn remove(&self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path)
            && meta.dev() == self.dev
            && meta.ino() == self.ino
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn only_a_stale_socket_of_ours_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let free = dir.path().join("free.sock");
        assert!(claim(&free).is_ok());

        let file = dir.path().join("file");
        std::fs::write(&file, b"keep me").unwrap();
        assert!(matches!(claim(&file), Err(ClaimError::NotASocket(_))));
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

        let live = dir.path().join("live.sock");
        let listener = UnixListener::bind(&live).unwrap();
        assert!(matches!(claim(&live), Err(ClaimError::InUse(_))));
        assert!(live.exists());

        drop(listener); // the file stays, nobody listens: stale
        assert!(claim(&live).is_ok());
        assert!(!live.exists());
    }

    #[test]
    fn exit_removes_only_the_socket_it_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let _first = UnixListener::bind(&path).unwrap();
        let bound = Bound::new(&path).unwrap();
        // Another process puts its own socket at the path.
        let other = dir.path().join("b.sock");
        let _second = UnixListener::bind(&other).unwrap();
        std::fs::rename(&other, &path).unwrap();
        bound.remove();
        assert!(path.exists(), "another process's socket must stay");
        Bound::new(&path).unwrap().remove();
        assert!(!path.exists());
    }
}
