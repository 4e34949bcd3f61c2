//! The data folder's lock: one `fluxpipe run` per data folder. Two runs
//! sharing one would restore each other's state and write one checkpoint
//! file at once (corrupting it). The lock is the OS's advisory file lock
//! (`flock`) on `<data_dir>/lock`, released by the kernel when the process
//! ends however it ends, so a SIGKILL leaves no stale lock behind; the file
//! names the holder's pid for the message a second run prints.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name in the data folder.
pub const LOCK_FILE: &str = "lock";

/// Why the data folder could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "data_dir {dir} is in use by another fluxpipe run ({holder}); give each pipeline its own \
         data_dir (or --data-dir)"
    )]
    Held { dir: PathBuf, holder: String },
    #[error("cannot lock data_dir {dir}: {source}")]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Lock `dir` (which must exist), or say who holds it.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = match text.trim().parse::<u32>() {
                    Ok(pid) => format!("pid {pid}"),
                    Err(_) => "pid unknown".to_string(),
                };
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DataDirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid_and_given_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        let pid = std::process::id();
        assert!(err.to_string().contains(&format!("(pid {pid})")), "{err}");
        drop(first);
        let again = DataDirLock::acquire(dir.path());
        assert!(again.is_ok(), "{again:?}");
    }
}
