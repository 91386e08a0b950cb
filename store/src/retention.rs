//! Size and age retention of a published history: the one owner for the counter writer
//! (`parquet::writer`), the INT writer (`int::writer`) and the rollup tiers (`rollup::sink`),
//! which index their published files here and ask it to delete the oldest ones; and the data
//! dir's [`DiskBudget`], shared by the raw history and the tiers.
//!
//! # The disk budget
//! Each tier has its own limits (bytes and age); the raw history keeps what the budget leaves:
//! `raw allowance = budget − bytes the tiers hold now` (and never more than its own
//! `retention_max_bytes` when that is set). The tiers publish their total into the budget after
//! every change; the raw writer reads it when it enforces. A switch thus keeps months of
//! rollups and as much raw stream as fits beside them (`store/ROLLUPS.md` §7).

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, SystemTime},
};

/// The data dir's disk budget (see the module docs). Cross-thread facts are counters only: the
/// tiers' bytes are one atomic.
#[derive(Debug)]
pub struct DiskBudget {
    total: u64,
    tiers: AtomicU64,
}

impl DiskBudget {
    /// A budget of `total_bytes` for raw history plus tiers.
    pub fn new(total_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            total: total_bytes,
            tiers: AtomicU64::new(0),
        })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes the tiers hold now.
    pub fn tier_bytes(&self) -> u64 {
        self.tiers.load(Relaxed)
    }

    /// Bytes the raw history may hold now (at least 1: raw always keeps its newest file).
    pub fn raw_allowance(&self) -> u64 {
        self.total.saturating_sub(self.tier_bytes()).max(1)
    }

    /// The tiers' total, published by their writer after each change.
    pub(crate) fn set_tier_bytes(&self, bytes: u64) {
        self.tiers.store(bytes, Relaxed);
    }
}

/// A writer's share of a [`DiskBudget`], if the data dir has one: a config-side handle (compares
/// by identity; not part of any file format).
#[derive(Debug, Clone, Default)]
pub struct BudgetHandle(pub Option<Arc<DiskBudget>>);

impl PartialEq for BudgetHandle {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl BudgetHandle {
    /// The raw history's byte limit: its own `max_bytes` (0 = none) and the budget's allowance,
    /// whichever is smaller.
    pub(crate) fn raw_limit(&self, max_bytes: u64) -> u64 {
        match (&self.0, max_bytes) {
            (None, m) => m,
            (Some(b), 0) => b.raw_allowance(),
            (Some(b), m) => m.min(b.raw_allowance()),
        }
    }
}

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
    fn raw_keeps_what_the_tiers_leave() {
        let b = DiskBudget::new(1000);
        let h = BudgetHandle(Some(Arc::clone(&b)));
        assert_eq!(h.raw_limit(0), 1000);
        b.set_tier_bytes(300);
        assert_eq!(h.raw_limit(0), 700);
        assert_eq!(h.raw_limit(500), 500);
        b.set_tier_bytes(5000);
        assert_eq!(h.raw_limit(0), 1, "raw always keeps its newest file");
        assert_eq!(BudgetHandle::default().raw_limit(0), 0);
        assert_eq!(BudgetHandle(Some(Arc::clone(&b))), h);
        assert_ne!(BudgetHandle(Some(DiskBudget::new(1000))), h);
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
