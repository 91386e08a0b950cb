//! Size and age retention of a published history: the one owner for the counter writer
//! (`parquet::writer`) and the INT writer (`int::writer`), which index their published files here
//! and ask it to delete the oldest ones.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

#[derive(Debug, Clone, Copy)]
struct FileInfo {
    bytes: u64,
    published: SystemTime,
}

/// The limits, from the sink's config (0 = unlimited).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_bytes: u64,
    pub max_age_s: u64,
}

/// What one retention pass removed (for the writer's counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Deleted {
    pub files: u64,
    pub bytes: u64,
    /// Files that could not be deleted (kept indexed, tried again next pass).
    pub errors: u64,
}

/// Published files by (first_ns, path): the retention order, oldest data first.
#[derive(Debug, Default)]
pub(crate) struct History {
    files: BTreeMap<(u64, PathBuf), FileInfo>,
    bytes: u64,
}

impl History {
    /// Indexes a published file (at recovery, from its mtime; after a publish, now).
    pub(crate) fn insert(
        &mut self,
        first_ns: u64,
        path: PathBuf,
        bytes: u64,
        published: SystemTime,
    ) {
        let old = self
            .files
            .insert((first_ns, path), FileInfo { bytes, published });
        self.bytes = self.bytes + bytes - old.map_or(0, |o| o.bytes);
    }

    /// Bytes of every indexed file.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Deletes the oldest files while over `max_bytes`, and (when `age`) files published longer
    /// than `max_age_s` ago; empty hour and date directories go with their last file. A file
    /// already gone counts as deleted by someone else (not in `Deleted`); one that cannot be
    /// deleted stays indexed and is logged as `what`.
    pub(crate) fn enforce(&mut self, limits: Limits, age: bool, what: &str) -> Deleted {
        let mut doomed = Vec::new();
        if limits.max_bytes > 0 {
            let mut total = self.bytes;
            for (k, info) in &self.files {
                if total <= limits.max_bytes {
                    break;
                }
                total -= info.bytes;
                doomed.push(k.clone());
            }
        }
        if age && limits.max_age_s > 0 {
            let limit = Duration::from_secs(limits.max_age_s);
            let now = SystemTime::now();
            for (k, info) in &self.files {
                if now.duration_since(info.published).unwrap_or_default() > limit
                    && !doomed.contains(k)
                {
                    doomed.push(k.clone());
                }
            }
        }
        let mut out = Deleted::default();
        for k in doomed {
            let Some(info) = self.files.remove(&k) else {
                continue;
            };
            match fs::remove_file(&k.1) {
                Ok(()) => {
                    self.bytes -= info.bytes;
                    out.files += 1;
                    out.bytes += info.bytes;
                    remove_empty_parents(&k.1);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => self.bytes -= info.bytes,
                Err(e) => {
                    out.errors += 1;
                    tracing::warn!(path = %k.1.display(), error = %e, "Cannot delete {what} for retention.");
                    self.files.insert(k, info);
                }
            }
        }
        out
    }
}

/// Drops the hour and date directories of a deleted part once empty; "not empty" is ignored.
fn remove_empty_parents(part: &Path) {
    if let Some(hour) = part.parent() {
        if fs::remove_dir(hour).is_ok() {
            if let Some(date) = hour.parent() {
                let _ = fs::remove_dir(date);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(dir: &Path, hour: u32, name: &str, len: usize) -> PathBuf {
        let d = dir.join("date=2024-05-01").join(format!("hour={hour:02}"));
        fs::create_dir_all(&d).unwrap();
        let p = d.join(name);
        fs::write(&p, vec![0u8; len]).unwrap();
        p
    }

    #[test]
    fn oldest_data_goes_first_and_empty_hours_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = History::default();
        let now = SystemTime::now();
        let a = part(dir.path(), 1, "a.parquet", 100);
        let b = part(dir.path(), 2, "b.parquet", 100);
        let c = part(dir.path(), 2, "c.parquet", 100);
        // Inserted out of data order: the first_ns key decides, not the insertion order.
        h.insert(30, c.clone(), 100, now);
        h.insert(10, a.clone(), 100, now);
        h.insert(20, b.clone(), 100, now);
        assert_eq!(h.bytes(), 300);
        let lim = Limits {
            max_bytes: 150,
            max_age_s: 0,
        };
        let d = h.enforce(lim, true, "a test file");
        assert_eq!(
            d,
            Deleted {
                files: 2,
                bytes: 200,
                errors: 0
            }
        );
        assert!(!a.exists() && !b.exists() && c.exists());
        assert!(!dir.path().join("date=2024-05-01/hour=01").exists());
        assert!(dir.path().join("date=2024-05-01/hour=02").exists());
        assert_eq!(h.bytes(), 100);
    }

    #[test]
    fn age_only_when_asked_and_vanished_files_are_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = History::default();
        let old = SystemTime::now() - Duration::from_secs(3600);
        let a = part(dir.path(), 1, "a.parquet", 10);
        let gone = dir.path().join("gone.parquet");
        h.insert(1, a.clone(), 10, old);
        h.insert(2, gone, 10, old);
        let lim = Limits {
            max_bytes: 0,
            max_age_s: 60,
        };
        assert_eq!(h.enforce(lim, false, "x"), Deleted::default());
        assert!(a.exists());
        let d = h.enforce(lim, true, "x");
        assert_eq!((d.files, d.bytes, d.errors), (1, 10, 0));
        assert!(!a.exists());
        assert_eq!(h.bytes(), 0);
    }
}
