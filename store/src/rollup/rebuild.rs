//! Tiers from raw files: history written before the tiers existed, or `stel-ingestd --input`
//! captures. Every session's published raw files are read in time order and their rows go
//! through the same [`RollupWriter`] the daemon runs, so the tier files hold the same values the
//! live path writes from the same samples (`store/tests/rollup.rs`).

use std::{
    collections::BTreeMap,
    fs::File,
    path::{Path, PathBuf},
    sync::Arc,
};

use ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use arrow_array::{
    cast::AsArray,
    types::{TimestampNanosecondType, UInt64Type},
    Array,
};

use super::{
    config::RollupConfig,
    sink::{Error, RollupWriter, WriterTotals},
};
use crate::{
    paths::{classify, published_parts, LayoutEntry},
    schema::SessionSchema,
    BudgetHandle,
};

/// Rows read from a raw file at a time.
const READ_ROWS: usize = 4096;

/// Why a rebuild stopped.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error(transparent)]
    Config(#[from] Error),
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{0} already holds rollup tiers ({1}); remove them first or write elsewhere (--out)")]
    Exists(PathBuf, String),
    #[error(
        "{0} holds no raw history (published files under profile=<p>/group=<g>/); \
         is it the daemon's --data-dir?"
    )]
    NoRaw(PathBuf),
}

/// What a rebuild read and wrote.
#[derive(Debug, Clone, Default)]
pub struct RebuildReport {
    pub files_read: u64,
    pub rows_read: u64,
    pub samples_read: u64,
    pub written: WriterTotals,
}

/// The session schema a raw file was written with (its Arrow field metadata and footer keys).
fn file_schema(
    path: &Path,
) -> Result<(Arc<SessionSchema>, ParquetRecordBatchReaderBuilder<File>), String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let b = ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| e.to_string())?;
    let kv: BTreeMap<String, String> = b
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kvs| {
            kvs.iter()
                .filter_map(|k| Some((k.key.clone(), k.value.clone()?)))
                .collect()
        })
        .unwrap_or_default();
    let schema = SessionSchema::from_stel_file(b.schema().fields(), &kv)?;
    Ok((Arc::new(schema), b))
}

/// A session's raw files: (first_ns, relative path, path).
type Files = Vec<(u64, String, PathBuf)>;

/// The published raw files under `root`, per session (profile, group).
fn raw_sessions(root: &Path) -> BTreeMap<(String, String), Files> {
    let mut sessions: BTreeMap<(String, String), Files> = BTreeMap::new();
    for (rel, path, first_ns) in published_parts(root) {
        if let LayoutEntry::Part { profile, group, .. } = classify(root, &path) {
            sessions
                .entry((profile, group))
                .or_default()
                .push((first_ns, rel, path));
        }
    }
    sessions
}

/// Whether `root` holds a published raw file to build tiers from (what [`rebuild`] refuses
/// without, [`RebuildError::NoRaw`]).
pub fn has_raw_history(root: &Path) -> bool {
    published_parts(root)
        .into_iter()
        .any(|(_, path, _)| matches!(classify(root, &path), LayoutEntry::Part { .. }))
}

/// Builds `cfg`'s tiers under `out` from the raw files under `root` (every session, in time
/// order), as the daemon would have written them live; `switch` names the switch in the files
/// (default: the host name). `each` is told about every file read.
///
/// # Errors
/// An invalid config, tiers already under `out`, no published raw file under `root`, or a raw
/// file that cannot be read.
pub fn rebuild(
    root: &Path,
    out: &Path,
    cfg: &RollupConfig,
    switch: Option<String>,
    mut each: impl FnMut(&Path, u64),
) -> Result<RebuildReport, RebuildError> {
    let switch = switch.unwrap_or_else(crate::parquet::writer::host_name);
    let existing: Vec<String> = published_parts(out)
        .into_iter()
        .filter(|(rel, _, _)| rel.starts_with("tier="))
        .map(|(rel, _, _)| rel.split('/').next().unwrap_or_default().to_string())
        .collect();
    if let Some(t) = existing.first() {
        return Err(RebuildError::Exists(out.to_path_buf(), t.clone()));
    }
    let mut sessions = raw_sessions(root);
    // Nothing to build from (a mistyped directory, or one holding only tiers): say so before
    // anything is created under `out`.
    if sessions.is_empty() {
        return Err(RebuildError::NoRaw(root.to_path_buf()));
    }
    std::fs::create_dir_all(out).map_err(|e| RebuildError::File {
        path: out.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut w = RollupWriter::new(cfg, out.to_path_buf(), switch, BudgetHandle::default())?;
    let mut report = RebuildReport::default();
    for files in sessions.values_mut() {
        files.sort();
        for (_, _, path) in files.iter() {
            let bad = |message: String| RebuildError::File {
                path: path.clone(),
                message,
            };
            let (schema, b) = file_schema(path).map_err(bad)?;
            let rows_in_file = b.metadata().file_metadata().num_rows() as u64;
            let reader = b
                .with_batch_size(READ_ROWS)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            let wdt = schema.width();
            let mut values = Vec::new();
            let mut valid = Vec::new();
            for rb in reader {
                let rb = rb.map_err(|e| bad(e.to_string()))?;
                let n = rb.num_rows();
                let ts = rb.column(0).as_primitive::<TimestampNanosecondType>();
                values.clear();
                values.resize(n * wdt, 0);
                let any_null = rb.columns().iter().skip(1).any(|c| c.null_count() > 0);
                valid.clear();
                if any_null {
                    valid.resize(n * wdt, true);
                }
                for c in 0..wdt {
                    let a = rb.column(c + 1).as_primitive::<UInt64Type>();
                    for (r, v) in a.values().iter().enumerate() {
                        values[r * wdt + c] = *v;
                    }
                    if any_null && a.null_count() > 0 {
                        for r in 0..n {
                            valid[r * wdt + c] = a.is_valid(r);
                        }
                    }
                }
                w.push_rows(
                    &schema,
                    ts.values(),
                    &values,
                    any_null.then_some(valid.as_slice()),
                );
                report.rows_read += n as u64;
                report.samples_read += (n * wdt) as u64;
            }
            report.files_read += 1;
            each(path, rows_in_file);
        }
    }
    w.finish();
    report.written = w.totals().clone();
    Ok(report)
}
