//! One writer per data directory: an exclusive `flock` on `<dir>/.stel-ingestd.lock`.
//!
//! At start every sink clears what a crashed run left in its directory (unpublished temporary
//! files); a second daemon on a directory another one is writing would delete that one's files
//! in progress and rewrite its status file. So before any sink starts, the daemon locks every
//! directory it writes history into and holds the locks until it exits (`stel-ingestd rollup`
//! locks the directory it writes its tiers into the same way). The kernel drops a
//! `flock` when its process ends, however it ends (`kill -9` too): a lock never outlives its
//! holder, and the file left behind means nothing on its own.
//!
//! The lock file (mode 0644, so anyone may see who holds it) holds one line naming the holder,
//! `pid N, since YYYY-MM-DDTHH:MM:SSZ`, rewritten by each holder once it has the lock.
//! Where the file system has no `flock` (some network file systems answer ENOLCK or
//! EOPNOTSUPP), the daemon warns and runs unlocked.
use std::{
    fs::{File, OpenOptions, Permissions},
    io::{self, Read, Seek, Write},
    os::{
        fd::AsRawFd,
        unix::fs::{OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

/// The lock file's name inside a data directory.
pub const LOCK_FILE: &str = ".stel-ingestd.lock";

/// The lock file's mode: readable by anyone (it names the holder), written by its owner.
const LOCK_MODE: u32 = 0o644;

/// A held data-directory lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DirLock {
    dir: PathBuf,
    _file: File,
}

impl DirLock {
    /// The directory locked (as given).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Why a directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    /// Another process holds the lock.
    #[error(
        "{} is being written by another stel-ingestd ({holder}); stop it or give this one another {setting}",
        dir.display()
    )]
    Held {
        dir: PathBuf,
        /// `pid N, since T` as the holder wrote it, or `pid unknown`.
        holder: String,
        /// The flag or config key that names the directory, for the hint.
        setting: &'static str,
    },
    /// The directory, or one of the directories above it, is something else (a regular file):
    /// named as such, not as the lock file's `File exists` / `Not a directory`.
    #[error("{setting} {}{} is not a directory", dir.display(), in_the_way(dir, path))]
    NotADirectory {
        dir: PathBuf,
        /// The path that is not a directory: `dir` itself or the ancestor in the way.
        path: PathBuf,
        setting: &'static str,
    },
    /// The lock file cannot be created or opened, or `flock` failed otherwise.
    #[error("cannot lock {}: {source}{}", path.display(), hint(source))]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The first of `dir` and its ancestors, nearest first, that exists and is not a directory (a
/// symlink is followed): what stops `dir` being created or used.
fn not_a_directory(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .find_map(|p| match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => Some(None),
            Ok(_) => Some(Some(p.to_path_buf())),
            Err(_) => None,
        })
        .flatten()
}

/// For [`DirLockError::NotADirectory`]'s message: `: <ancestor>` when the path in the way is
/// above the directory.
fn in_the_way(dir: &Path, path: &Path) -> String {
    if dir == path {
        String::new()
    } else {
        format!(": {}", path.display())
    }
}

/// What to do about an I/O error on the lock file, for its message.
fn hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::PermissionDenied {
        " (the history cannot be written there either: run as the directory's owner, e.g. \
         the stel user, or root, or give another --data-dir)"
    } else {
        ""
    }
}

/// Takes `dir`'s lock without waiting (`dir` is created, [`stel_store::durable::create_dirs`],
/// when missing). `setting` names what chose the directory (`--data-dir`, `[int.parquet] dir`)
/// in the refusal. `Ok(None)`: the file system has no `flock`; a warning says the directory is
/// unprotected.
///
/// # Errors
/// [`DirLockError::Held`]: another process holds it. [`DirLockError::NotADirectory`]: `dir`, or
/// a path above it, exists and is not a directory. [`DirLockError::Io`]: the directory or the
/// lock file cannot be created or opened (the history could not be written there either).
pub fn lock_dir(dir: &Path, setting: &'static str) -> Result<Option<DirLock>, DirLockError> {
    let path = dir.join(LOCK_FILE);
    let io_err = |source| DirLockError::Io {
        path: path.clone(),
        source,
    };
    if let Some(f) = not_a_directory(dir) {
        return Err(DirLockError::NotADirectory {
            dir: dir.to_path_buf(),
            path: f,
            setting,
        });
    }
    stel_store::durable::create_dirs(dir).map_err(io_err)?;
    // No truncation before the lock is ours: the file names the current holder.
    let mut file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(LOCK_MODE)
        .open(&path)
    {
        Ok(f) => f,
        // Another user's lock file: a read-only descriptor can still take (or test) the lock.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied && path.exists() => {
            File::open(&path).map_err(io_err)?
        }
        Err(e) => return Err(io_err(e)),
    };
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Err(DirLockError::Held {
                dir: dir.to_path_buf(),
                holder: holder(&mut file),
                setting,
            }),
            Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS) => {
                tracing::warn!(
                    dir = %dir.display(),
                    error = %e,
                    "The file system cannot lock the data directory: nothing stops a second stel-ingestd from writing it too."
                );
                Ok(None)
            }
            _ => Err(io_err(e)),
        };
    }
    // Ours: say who holds it. The lock holds whatever happens to these writes (a read-only
    // descriptor of another user's file, a full disk): the line left in the file then names a
    // process that has exited, which `holder` does not repeat.
    let line = format!("pid {}, since {}\n", std::process::id(), utc_now());
    let _ = file.set_permissions(Permissions::from_mode(LOCK_MODE));
    let _ = file
        .set_len(0)
        .and_then(|()| file.write_all(line.as_bytes()));
    Ok(Some(DirLock {
        dir: dir.to_path_buf(),
        _file: file,
    }))
}

/// The holder's line from the lock file, or `pid unknown`: the holder has not written it yet,
/// or could not (another user's file), so that the line names a process that has exited. (A
/// holder this process cannot see in /proc — another PID namespace, `hidepid` — is `pid
/// unknown` too: only the message is affected.)
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file
        .rewind()
        .and_then(|()| file.take(256).read_to_string(&mut text));
    let line = text.lines().next().unwrap_or_default().trim();
    let alive = line
        .strip_prefix("pid ")
        .and_then(|r| r.split(',').next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| Path::new("/proc").join(pid.to_string()).exists());
    if alive {
        line.to_string()
    } else {
        "pid unknown".to_string()
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let h = stel_store::paths::UtcHour::of_ns(s.saturating_mul(1_000_000_000));
    format!(
        "{}T{:02}:{:02}:{:02}Z",
        h.date_value(),
        h.hour,
        s.rem_euclid(3600) / 60,
        s.rem_euclid(60)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_named_as_not_a_directory() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("afile");
        std::fs::write(&f, b"x").unwrap();
        let e = lock_dir(&f, "--data-dir").unwrap_err().to_string();
        assert_eq!(e, format!("--data-dir {} is not a directory", f.display()));
        let below = f.join("sub");
        let e = lock_dir(&below, "--data-dir").unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "--data-dir {}: {} is not a directory",
                below.display(),
                f.display()
            )
        );
    }

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_free_once_dropped() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("new/data");
        let first = lock_dir(&dir, "--data-dir").unwrap().expect("flock on tmp");
        let text = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
        assert!(
            text.starts_with(&format!("pid {}, since 20", std::process::id())),
            "{text}"
        );
        // A second open file description, as another process would have.
        let e = lock_dir(&dir, "--data-dir").unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, DirLockError::Held { .. }), "{msg}");
        assert!(
            msg.contains(&format!("(pid {}, since 20", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("another --data-dir"), "{msg}");
        assert_eq!(first.dir(), dir);
        drop(first);
        assert!(lock_dir(&dir, "--data-dir").unwrap().is_some());
        let mode = std::fs::metadata(dir.join(LOCK_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, LOCK_MODE);
    }

    /// A line its holder could not rewrite (another user's lock file) names a process that has
    /// exited: a refusal says `pid unknown` rather than that process.
    #[test]
    fn a_stale_holder_line_is_not_repeated() {
        let d = tempfile::tempdir().unwrap();
        let _held = lock_dir(d.path(), "--data-dir")
            .unwrap()
            .expect("flock on tmp");
        // pid_max is at most 2^22: no process has this pid.
        std::fs::write(
            d.path().join(LOCK_FILE),
            "pid 4194305, since 2026-01-01T00:00:00Z\n",
        )
        .unwrap();
        let msg = lock_dir(d.path(), "--data-dir").unwrap_err().to_string();
        assert!(msg.contains("(pid unknown)"), "{msg}");
    }
}
