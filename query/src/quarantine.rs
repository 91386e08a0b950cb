//! Parquet files a question cannot use: unreadable ones (a truncated or interrupted copy, random
//! bytes, an empty file) and foreign ones (another schema dropped into the tree).
//!
//! They are found when a table is registered — every footer is read then anyway, to merge the
//! files' schemas — named in a warning on stderr, counted in the command's summary
//! (`files_skipped`), and hidden from every later listing of the context's object store
//! ([`HidingStore`]), so no scan ever opens them. With `--strict` the first one is the error
//! instead. One bad file in a lake of thousands thus costs its own rows, not every question.

use std::{
    collections::HashSet,
    fmt,
    ops::Range,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use arrow_schema::{DataType, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::{
    datasource::listing::{ListingOptions, ListingTableUrl},
    execution::context::SessionState,
};
use futures::{stream::BoxStream, StreamExt, TryStreamExt};
use object_store::{
    path::Path, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

use crate::error::{Error, Result};

/// Warnings printed per process; later skips are only counted (the summary has the total).
const MAX_WARNINGS: u64 = 10;

/// Files skipped by this process (every catalog), for the summary line.
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// How many files this process skipped.
pub fn skipped_total() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

/// One skipped file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// As the user would name it: an absolute path, or `s3://bucket/key`.
    pub path: String,
    pub reason: String,
}

/// The files of one context that no listing returns.
#[derive(Debug, Default)]
pub struct Quarantine {
    hidden: Mutex<HashSet<Path>>,
    skipped: Mutex<Vec<Skipped>>,
    /// Fail on the first bad file instead of skipping it.
    pub strict: bool,
}

impl Quarantine {
    pub fn new(strict: bool) -> Self {
        Self {
            strict,
            ..Self::default()
        }
    }

    fn is_hidden(&self, p: &Path) -> bool {
        self.hidden.lock().map(|h| h.contains(p)).unwrap_or(false)
    }

    /// The files skipped so far.
    pub fn skipped(&self) -> Vec<Skipped> {
        self.skipped.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Skips `location` (or, strict, fails with its name and `reason`).
    fn reject(&self, location: &Path, shown: String, reason: String) -> Result<()> {
        if self.strict {
            return Err(Error::BadFile(format!(
                "{shown}: {reason} (--strict; without it the file is skipped with a warning)"
            )));
        }
        if let Ok(mut h) = self.hidden.lock() {
            if !h.insert(location.clone()) {
                return Ok(());
            }
        }
        let n = SKIPPED.fetch_add(1, Ordering::Relaxed);
        if n < MAX_WARNINGS {
            crate::diag::warn(
                &format!("skipping {shown}: {reason}"),
                serde_json::json!({"path": shown, "reason": reason}),
            );
        }
        if let Ok(mut s) = self.skipped.lock() {
            s.push(Skipped {
                path: shown,
                reason,
            });
        }
        Ok(())
    }
}

/// What every file of a table must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The counter history: `ts` (timestamp, ns) and UInt64 counters.
    Counters,
    /// A `ts` column of nanosecond timestamps, anything else.
    Timestamped,
    /// Any schema that merges with the others.
    Any,
}

impl Shape {
    /// Why `s` is not of this shape, if it is not.
    fn mismatch(self, s: &Schema) -> Option<String> {
        if self == Shape::Any {
            return None;
        }
        match s.field_with_name("ts").map(|f| f.data_type()) {
            Ok(DataType::Timestamp(TimeUnit::Nanosecond, _)) => {}
            Ok(t) => {
                return Some(format!(
                    "not a stel file: its ts column is {t}, not a nanosecond timestamp"
                ))
            }
            Err(_) => return Some("not a stel file: it has no ts column".into()),
        }
        if self == Shape::Counters {
            if let Some(f) = s
                .fields()
                .iter()
                .find(|f| f.name() != "ts" && f.data_type() != &DataType::UInt64)
            {
                return Some(format!(
                    "not a stel counter file: column {} is {}, not UInt64",
                    f.name(),
                    f.data_type()
                ));
            }
        }
        None
    }
}

/// The schema of the table at `url`, merged over its data files that are readable and of
/// `shape`; every other file is quarantined in `q` (strict: the first one is the error).
/// `None` when no usable file exists. `raw` is the store itself (not the [`HidingStore`]): this
/// listing must see every file, and must not fill the context's listing cache.
///
/// # Errors
/// Listing failures; with `q.strict`, the first bad file.
pub async fn infer_schema(
    state: &SessionState,
    raw: &Arc<dyn ObjectStore>,
    url: &ListingTableUrl,
    opts: &ListingOptions,
    shape: Shape,
    q: &Quarantine,
) -> Result<Option<SchemaRef>> {
    let ignore_sub = state
        .config_options()
        .execution
        .listing_table_ignore_subdirectory;
    let mut files: Vec<ObjectMeta> = raw
        .list(Some(url.prefix()))
        .try_filter(|m| {
            futures::future::ready(
                m.location.as_ref().ends_with(&opts.file_extension)
                    && url.contains(&m.location, ignore_sub),
            )
        })
        .try_collect()
        .await?;
    files.sort_by(|a, b| a.location.cmp(&b.location));
    let shown = |p: &Path| match url.scheme() {
        "file" => format!("/{p}"),
        s => format!("{s}://{}/{p}", url.get_url().host_str().unwrap_or_default()),
    };
    // Footers in parallel (as DataFusion's own inference does), verdicts in path order.
    let schemas: Vec<(ObjectMeta, std::result::Result<SchemaRef, String>)> =
        futures::stream::iter(files)
            .map(|m| async move {
                let r = if m.size == 0 {
                    Err("empty file".to_string())
                } else {
                    opts.format
                        .infer_schema(state, raw, std::slice::from_ref(&m))
                        .await
                        .map_err(|e| {
                            let m = e.strip_backtrace();
                            let mut m = m.as_str();
                            while let Some(r) = m.strip_prefix("Parquet error: ") {
                                m = r;
                            }
                            format!("unreadable Parquet ({m})")
                        })
                };
                (m, r)
            })
            .buffered(32)
            .collect()
            .await;
    let mut merged: Option<Schema> = None;
    for (m, r) in schemas {
        let s = match r {
            Ok(s) => s,
            Err(why) => {
                q.reject(&m.location, shown(&m.location), why)?;
                continue;
            }
        };
        if let Some(why) = shape.mismatch(&s) {
            q.reject(&m.location, shown(&m.location), why)?;
            continue;
        }
        merged = match merged {
            None => Some(s.as_ref().clone()),
            Some(acc) => match Schema::try_merge([acc.clone(), s.as_ref().clone()]) {
                Ok(x) => Some(x),
                Err(e) => {
                    q.reject(
                        &m.location,
                        shown(&m.location),
                        format!("its columns do not match the other files' ({e})"),
                    )?;
                    Some(acc)
                }
            },
        };
    }
    Ok(merged.map(Arc::new))
}

/// An object store whose listings leave out the quarantined files (everything else is the
/// wrapped store's).
#[derive(Debug)]
pub struct HidingStore {
    inner: Arc<dyn ObjectStore>,
    q: Arc<Quarantine>,
}

impl HidingStore {
    pub fn new(inner: Arc<dyn ObjectStore>, q: Arc<Quarantine>) -> Self {
        Self { inner, q }
    }
}

impl fmt::Display for HidingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HidingStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for HidingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let q = Arc::clone(&self.q);
        self.inner
            .list(prefix)
            .try_filter(move |m| futures::future::ready(!q.is_hidden(&m.location)))
            .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let q = Arc::clone(&self.q);
        self.inner
            .list_with_offset(prefix, offset)
            .try_filter(move |m| futures::future::ready(!q.is_hidden(&m.location)))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let mut l = self.inner.list_with_delimiter(prefix).await?;
        l.objects.retain(|m| !self.q.is_hidden(&m.location));
        Ok(l)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_schema::Field;

    use super::*;

    #[test]
    fn shapes() {
        let ts = Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        );
        let good = Schema::new(vec![
            ts.clone(),
            Field::new("Ethernet0.IF_IN_OCTETS", DataType::UInt64, true),
        ]);
        assert_eq!(Shape::Counters.mismatch(&good), None);
        let strs = Schema::new(vec![ts, Field::new("note", DataType::Utf8, true)]);
        assert!(Shape::Counters
            .mismatch(&strs)
            .unwrap()
            .contains("note is Utf8"));
        assert_eq!(Shape::Timestamped.mismatch(&strs), None);
        let int_ts = Schema::new_with_metadata(
            vec![Field::new("ts", DataType::Int64, false)],
            HashMap::new(),
        );
        assert!(Shape::Timestamped
            .mismatch(&int_ts)
            .unwrap()
            .contains("ts column is Int64"));
        assert_eq!(Shape::Any.mismatch(&int_ts), None);
    }
}
