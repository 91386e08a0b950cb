//! Publishing files so they survive a crash, and telling a full disk from other write errors:
//! one copy for the Parquet history, the INT tables and the uploader's state.
use std::{fs::File, io, path::Path};

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
