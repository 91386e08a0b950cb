//! Publishing files so they survive a crash, telling a full disk from other write errors, and
//! the modes of everything the daemon creates: one copy for the Parquet history, the INT tables,
//! the uploader's state, the status file and the inspect socket.
//!
//! # Modes
//! Set explicitly with `fchmod`/`chmod` after creation, so they do not depend on the umask the
//! daemon was started with (with umask 000 a plain `create` would give 0666 history anyone could
//! rewrite and a 0777 socket anyone could read live counters from):
//!
//! | what | mode |
//! |---|---|
//! | history: counter and INT Parquet files (and their `.tmp` while written) | [`mode::HISTORY`] 0640 |
//! | sockets (the live inspect socket) | [`mode::SOCKET`] 0660 |
//! | state files (status file, uploader progress, session files) | [`mode::STATE`] 0600 |
//! | directories the daemon creates (data dir, partitions, run dir) | [`mode::DIR`] 0750 |
//!
//! Directories that already exist keep their mode (an operator's choice, or systemd's
//! `StateDirectoryMode=`). The group of every file is the daemon's group: its primary group, or
//! the one `[files] group` / `--group` names (the daemon switches to it at start), so members of
//! that group read the history and the inspect socket, and nobody else does.
use std::{
    fs::{self, File, OpenOptions, Permissions},
    io::{self, Write},
    os::unix::fs::PermissionsExt,
    path::Path,
};

/// The modes of what the daemon creates (see the module docs).
pub mod mode {
    /// Parquet history (counter and INT tables): owner writes, group reads.
    pub const HISTORY: u32 = 0o640;
    /// Unix sockets: owner and group connect.
    pub const SOCKET: u32 = 0o660;
    /// State files (status file, uploader progress, session files): owner only.
    pub const STATE: u32 = 0o600;
    /// Directories the daemon creates: group may list and enter.
    pub const DIR: u32 = 0o750;
}

/// Sets `path`'s mode (follows symlinks, like `chmod`).
///
/// # Errors
/// `chmod` failing (not the owner, the file vanished).
pub fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(path, Permissions::from_mode(mode))
}

/// Creates a new history file (fails if it exists) with mode [`mode::HISTORY`], whatever the
/// umask: the mode is set on the open descriptor before a byte is written.
///
/// # Errors
/// As `File::create_new`, or `fchmod` failing.
pub fn create_history_file(path: &Path) -> io::Result<File> {
    let f = File::create_new(path)?;
    f.set_permissions(Permissions::from_mode(mode::HISTORY))?;
    Ok(f)
}

/// `create_dir_all` where every directory it creates gets [`mode::DIR`] (existing ones are left
/// as they are).
///
/// # Errors
/// As `create_dir_all`, or `chmod` of a created directory failing.
pub fn create_dirs(path: &Path) -> io::Result<()> {
    if path.as_os_str().is_empty() || path.is_dir() {
        return Ok(());
    }
    // The missing components, outermost first.
    let missing: Vec<&Path> = path
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .collect();
    fs::create_dir_all(path)?;
    for d in missing.into_iter().rev() {
        set_mode(d, mode::DIR)?;
    }
    Ok(())
}

/// Creates `dir` ([`create_dirs`]) and checks that files can be created in it (one is created
/// and removed), so a daemon that could never write its history says so at start, naming the
/// directory, instead of losing every sample later.
///
/// # Errors
/// The directory cannot be created, or a file cannot be created in it (read-only file system,
/// no permission, a file where the directory should be).
pub fn check_writable(dir: &Path) -> io::Result<()> {
    create_dirs(dir)?;
    let probe = dir.join(format!(".stel-write-check-{}", std::process::id()));
    let _ = fs::remove_file(&probe);
    drop(create_history_file(&probe)?);
    fs::remove_file(&probe)
}

/// Replaces `path` atomically with `bytes` (a temporary file beside it, renamed over it), mode
/// [`mode::STATE`]; creates its directory ([`create_dirs`]). Not fsync'd: for state rewritten
/// often (the status file); use [`write_state_file_durable`] for state that must survive a
/// crash.
///
/// # Errors
/// Creating, writing or renaming failing.
pub fn write_state_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_state(path, bytes, false)
}

/// [`write_state_file`], fsync'd (file and directory) before it returns.
///
/// # Errors
/// As [`write_state_file`], or an fsync failing.
pub fn write_state_file_durable(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_state(path, bytes, true)
}

fn write_state(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(d) = dir {
        create_dirs(d)?;
    }
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    // Before the first byte: a leftover temporary file of another mode is narrowed too.
    f.set_permissions(Permissions::from_mode(mode::STATE))?;
    f.write_all(bytes)?;
    if durable {
        f.sync_all()?;
    }
    drop(f);
    fs::rename(&tmp, path)?;
    if let (true, Some(d)) = (durable, dir) {
        fsync_dir(d)?;
    }
    Ok(())
}

/// Makes a rename or unlink in `dir` durable (the directory entry itself is fsync'd).
pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The io::Error inside a parquet/arrow error chain, if any.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<io::ErrorKind> {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        cur = e.source();
    }
    None
}

/// ENOSPC or EDQUOT anywhere in the chain (parquet's own errors keep only the message).
pub(crate) fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        io_kind(e),
        Some(io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
    ) || e.to_string().contains("No space left on device")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode_of(p: &Path) -> u32 {
        fs::metadata(p).unwrap().mode() & 0o7777
    }

    /// Modes are what the table says whatever the umask; existing directories keep theirs.
    /// (The process-wide umask is not changed here: other tests run in parallel threads. The
    /// binary's test runs the daemon with umask 000.)
    #[test]
    fn modes_are_set_explicitly() {
        let t = tempfile::tempdir().unwrap();
        set_mode(t.path(), 0o755).unwrap();
        let deep = t.path().join("a/b/c");
        create_dirs(&deep).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode_of(&t.path().join(d)), mode::DIR, "{d}");
        }
        assert_eq!(
            mode_of(t.path()),
            0o755,
            "an existing directory keeps its mode"
        );
        let f = deep.join("part.parquet.tmp");
        drop(create_history_file(&f).unwrap());
        assert_eq!(mode_of(&f), mode::HISTORY);
        assert_eq!(
            create_history_file(&f).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let s = t.path().join("run/status.json");
        // A leftover temporary file with a wide mode is narrowed before it is written.
        create_dirs(s.parent().unwrap()).unwrap();
        fs::write(t.path().join("run/status.json.tmp"), b"old").unwrap();
        set_mode(&t.path().join("run/status.json.tmp"), 0o666).unwrap();
        write_state_file(&s, b"{}").unwrap();
        assert_eq!(mode_of(&s), mode::STATE);
        assert_eq!(fs::read(&s).unwrap(), b"{}");
        write_state_file_durable(&s, b"{\"a\":1}").unwrap();
        assert_eq!(mode_of(&s), mode::STATE);
        assert!(!t.path().join("run/status.json.tmp").exists());
    }
}
