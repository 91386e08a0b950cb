//! The data-lake uploader: copies every Parquet file the history sink publishes to a local
//! directory or `s3://bucket/prefix`, under `switch=<name>/` and then the history's own Hive
//! layout, continuously and off the decode path. The lake's layout is written down in
//! `store/LAKE.md`.
//!
//! ```text
//!  ParquetSink ── rename ──▶ <dir>/profile=…/group=…/date=…/hour=…/part-….parquet
//!                                     │ scan every scan_interval_ms (published files only:
//!                                     ▼  temp files are `.part-….parquet.tmp`, never matched)
//!  uploader thread (current-thread tokio runtime):
//!     pending, oldest first ──▶ up to `concurrency` uploads ──▶ <dest>/switch=<name>/<same path>
//!          ▲                          │ ok: size checked at the destination
//!          └── failed: retried with   ▼
//!              exponential backoff   <dir>/.stel-upload-state   (append + fsync per upload)
//! ```
//!
//! # Why scan, not a notification from the Parquet sink
//! A published file is complete (atomic rename) and immutable, so the directory itself is the
//! queue: nothing is held in memory that a crash could lose, a restart finds exactly the files
//! not yet uploaded, and the uploader needs no hook into the writer thread. The cost is one
//! directory walk (readdir only; a stat only for files not uploaded yet) per scan interval.
//!
//! # The switch name
//! `[upload] switch`, else (set by the daemon before [`Uploader::start`], see
//! [`resolve_switch`]) the Parquet sink's `switch_name`, the `hostname` of CONFIG_DB's
//! `DEVICE_METADATA|localhost` when Redis is configured, or the host name. Every file a daemon
//! uploads lands under one `switch=` prefix, which is part of the destination the state file
//! records: renaming the switch uploads the history again under the new name.
//!
//! # Progress and crashes
//! The state file (`.stel-upload-state` in the data dir; hidden, so Hive readers skip it) holds
//! the destination URL and one relative path per uploaded file, appended and fsynced after each
//! upload. A crash between an upload and its journal line uploads that file again at restart
//! (same key, same bytes: idempotent); no crash can mark a file done that was not uploaded.
//! Entries of files deleted locally (retention, `delete_after_upload`) are dropped when the file
//! is rewritten (compaction), so the state stays proportional to the data dir.
//! A different destination starts the state over.
//!
//! # Failure and loss accounting
//! A failed upload is counted (`failures`), logged rate-limited, and retried after a per-file
//! exponential backoff; when every upload of a round fails (the destination is down), the whole
//! uploader backs off the same way. A file deleted locally before it was uploaded (retention
//! outran a destination outage) is counted in `vanished_files`/`vanished_bytes` and logged as an
//! error: that data never reaches the lake.
use crate::durable::fsync_dir;
use crate::log_limit::LogLimiter;

/// How often a repeated upload failure is logged.
const LOG_EVERY: Duration = Duration::from_secs(10);
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs,
    io::{self, Read, Write},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering::Relaxed},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use object_store::{
    aws::{AmazonS3Builder, AmazonS3ConfigKey},
    path::Path as ObjectPath,
    ClientConfigKey, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig, WriteMultipart,
};
use serde::{Deserialize, Serialize};
use tokio::{sync::Notify, task::JoinSet};

use crate::{
    labels,
    metrics::{Counter, Gauge, Metric, Registry, Snapshot},
    parquet::writer::host_name,
    paths::{published_parts, switch_segment},
};

/// `<to>/switch=<escaped name>`: where one switch's files go (a directory or an S3 prefix).
pub fn lake_root(to: &str, switch: &str) -> String {
    format!(
        "{}/{}",
        to.trim().trim_end_matches('/'),
        switch_segment(switch)
    )
}

/// Where the lake's switch name came from ([`resolve_switch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchSource {
    /// `[upload] switch`.
    Config,
    /// The Parquet sink's `switch_name` (the `stel.switch` footer key of every file).
    ParquetSink,
    /// CONFIG_DB `DEVICE_METADATA|localhost` `hostname` (SONiC's own name for the switch).
    ConfigDb,
    /// The kernel's host name.
    HostName,
}

/// CONFIG_DB's database number in SONiC's Redis.
pub const CONFIG_DB: i64 = 4;

/// Fills `cfg.switch` when it is empty: the Parquet sink's `switch_name`, else the `hostname` of
/// CONFIG_DB `DEVICE_METADATA|localhost` at `redis_url` (with the `redis` feature; a Redis that
/// does not answer within 2 s is logged and skipped), else the host name. Returns where the name
/// came from.
pub fn resolve_switch(
    cfg: &mut UploadConfig,
    parquet_switch: Option<&str>,
    redis_url: Option<&str>,
) -> SwitchSource {
    if !cfg.switch.trim().is_empty() {
        return SwitchSource::Config;
    }
    if let Some(s) = parquet_switch.map(str::trim).filter(|s| !s.is_empty()) {
        cfg.switch = s.to_string();
        return SwitchSource::ParquetSink;
    }
    #[cfg(feature = "redis")]
    if let Some(url) = redis_url {
        match config_db_hostname(url) {
            Ok(Some(h)) => {
                cfg.switch = h;
                return SwitchSource::ConfigDb;
            }
            Ok(None) => tracing::info!(
                url,
                "CONFIG_DB has no DEVICE_METADATA|localhost hostname; the lake uses the host name."
            ),
            Err(e) => tracing::warn!(
                url,
                error = %e,
                "Cannot read the switch name from CONFIG_DB; the lake uses the host name."
            ),
        }
    }
    #[cfg(not(feature = "redis"))]
    let _ = redis_url;
    cfg.switch = host_name();
    SwitchSource::HostName
}

/// `HGET DEVICE_METADATA|localhost hostname` in CONFIG_DB (db 4) of the Redis at `url`.
///
/// # Errors
/// A bad URL, Redis not answering within 2 s, a command error.
#[cfg(feature = "redis")]
pub fn config_db_hostname(url: &str) -> Result<Option<String>, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut info = client.get_connection_info().clone();
    info.redis.db = CONFIG_DB;
    let client = redis::Client::open(info)?;
    let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let h: Option<String> = redis::cmd("HGET")
        .arg("DEVICE_METADATA|localhost")
        .arg("hostname")
        .query(&mut c)?;
    Ok(h.map(|s| s.trim().to_string()).filter(|s| !s.is_empty()))
}

/// Name of the progress file in the data dir.
pub const STATE_FILE: &str = ".stel-upload-state";
const STATE_HEADER: &str = "# stel-upload v1 ";

/// `[upload]`: copy every published Parquet file to a data lake.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UploadConfig {
    /// Destination: a local directory (path or `file:///…`) or `s3://bucket/prefix`. S3 settings
    /// come from the standard environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ALLOW_HTTP=true (http endpoints).
    pub to: String,
    /// How often the data dir is scanned for newly published files, ms.
    pub scan_interval_ms: u64,
    /// Uploads in flight at once.
    pub concurrency: usize,
    /// First retry delay after a failed upload, ms; doubles per consecutive failure.
    pub retry_initial_ms: u64,
    /// Longest retry delay, ms.
    pub retry_max_ms: u64,
    /// Files larger than this are sent as a multipart upload in parts of this size (S3 needs
    /// parts of at least 5 MiB).
    pub multipart_bytes: u64,
    /// Delete the local file once its upload is confirmed (the lake becomes the history).
    pub delete_after_upload: bool,
    /// Upload the files already in the data dir the first time this destination is used
    /// (false: only files published from now on).
    pub backfill: bool,
    /// At shutdown, keep uploading what is pending for at most this long, ms.
    pub shutdown_timeout_ms: u64,
    /// The switch's name in the lake (`<to>/switch=<name>/…`). Empty: the Parquet sink's
    /// `switch_name`, else CONFIG_DB `DEVICE_METADATA|localhost` `hostname` when Redis is
    /// configured, else the host name.
    pub switch: String,
    /// Upload the raw history (`profile=…`). False: only the rollup tiers (`tier=…`) and INT
    /// tables go to the lake, the raw stream stays on the switch (the affordable fleet setting,
    /// store/LAKE.md §5).
    pub raw: bool,
}

impl Default for UploadConfig {
    fn default() -> Self {
        Self {
            to: String::new(),
            scan_interval_ms: 2_000,
            concurrency: 4,
            retry_initial_ms: 500,
            retry_max_ms: 60_000,
            multipart_bytes: 32 << 20,
            delete_after_upload: false,
            backfill: true,
            shutdown_timeout_ms: 10_000,
            switch: String::new(),
            raw: true,
        }
    }
}

impl UploadConfig {
    /// Small and fast: for tests.
    pub fn for_test(to: impl Into<String>) -> Self {
        Self {
            to: to.into(),
            scan_interval_ms: 100,
            retry_initial_ms: 100,
            retry_max_ms: 1_000,
            multipart_bytes: 5 << 20,
            shutdown_timeout_ms: 5_000,
            switch: "test-switch".into(),
            ..Self::default()
        }
    }

    /// Every problem with this config, in one go.
    fn validate(&self) -> Result<(), Error> {
        let mut problems = Vec::new();
        if self.to.trim().is_empty() {
            problems.push("to is empty (a directory or s3://bucket/prefix)".to_string());
        }
        if self.scan_interval_ms == 0 {
            problems.push("scan_interval_ms must be at least 1".into());
        }
        if self.concurrency == 0 {
            problems.push("concurrency must be at least 1".into());
        }
        if self.retry_initial_ms == 0 || self.retry_max_ms < self.retry_initial_ms {
            problems.push("retry_initial_ms must be at least 1 and at most retry_max_ms".into());
        }
        if self.multipart_bytes < 5 << 20 {
            problems.push(format!(
                "multipart_bytes = {} is below S3's 5 MiB minimum part size",
                self.multipart_bytes
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(problems))
        }
    }
}

/// Errors of starting the uploader. Failures while running are counted (`stel_upload_*`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid upload config: {}", .0.join("; "))]
    Config(Vec<String>),
    #[error(
        "upload destination {}: {}",
        crate::redact::redact(url),
        crate::redact::redact(message)
    )]
    Destination { url: String, message: String },
    #[error("upload state file {path}: {source}")]
    State { path: PathBuf, source: io::Error },
    #[error("cannot start the uploader thread: {0}")]
    Spawn(io::Error),
}

/// What the uploader counts: registry handles (the daemon's registry, or one of its own).
#[derive(Debug)]
struct Counters {
    registry: Arc<Registry>,
    files_uploaded: Counter,
    bytes_uploaded: Counter,
    failures: Counter,
    retries: Counter,
    vanished_files: Counter,
    vanished_bytes: Counter,
    pending_files: Gauge,
    pending_bytes: Gauge,
    resumed_files: Gauge,
    deleted_after_upload: Counter,
    skipped_backfill: Counter,
    state_errors: Counter,
    scans: Counter,
    backing_off: Gauge,
    /// Not a count: the last failure's text, for the status file's `info`.
    last_error: Mutex<Option<String>>,
    /// The last failure's text while uploads are failing: set by a failed upload, cleared by a
    /// successful one ([`Uploader::failing`]).
    failing: Mutex<Option<String>>,
}

impl Counters {
    fn new(parent: Option<&Arc<Registry>>) -> Self {
        let r = Registry::child_of(parent);
        let c = |m: Metric| r.counter(m, labels!());
        let g = |m: Metric| r.gauge(m, labels!());
        Self {
            files_uploaded: c(Metric::UploadFiles),
            bytes_uploaded: c(Metric::UploadBytes),
            failures: c(Metric::UploadFailures),
            retries: c(Metric::UploadRetries),
            vanished_files: c(Metric::UploadVanishedFiles),
            vanished_bytes: c(Metric::UploadVanishedBytes),
            pending_files: g(Metric::UploadPendingFiles),
            pending_bytes: g(Metric::UploadPendingBytes),
            resumed_files: g(Metric::UploadResumedFiles),
            deleted_after_upload: c(Metric::UploadDeletedFiles),
            skipped_backfill: c(Metric::UploadSkippedFiles),
            state_errors: c(Metric::UploadStateErrors),
            scans: c(Metric::UploadScans),
            backing_off: g(Metric::UploadBackingOff),
            last_error: Mutex::new(None),
            failing: Mutex::new(None),
            registry: r,
        }
    }
}

#[derive(Debug)]
struct Shared {
    destination: String,
    switch: String,
    c: Counters,
    stop: AtomicBool,
    wake: Notify,
}

/// Where uploads go.
#[derive(Debug, Clone)]
enum Dest {
    /// A local directory: copy to a hidden temp name, fsync, rename (readers never see a
    /// partial file). std::fs rather than object_store's LocalFileSystem, which percent-decodes
    /// keys and would turn the Hive escape `%2F` back into a `/`.
    Local(PathBuf),
    /// An object store (S3), the key prefix (no leading/trailing `/`) and what its errors name.
    Store(Arc<dyn ObjectStore>, String, S3Facts),
}

/// What an S3 error message needs to say what to change ([`explain_store_error`]).
#[derive(Debug, Clone, Default)]
struct S3Facts {
    bucket: String,
    /// The endpoint, when it is plain `http://` and AWS_ALLOW_HTTP is not true: object_store
    /// refuses every request ("HTTP error: builder error").
    http_refused: Option<String>,
}

impl Dest {
    fn parse(url: &str, data_dir: &Path) -> Result<Self, Error> {
        let bad = |message: String| Error::Destination {
            url: url.to_string(),
            message,
        };
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket; use s3://<bucket>/<prefix>".into()));
            }
            // object_store's own retries are kept short (its default keeps retrying a request
            // for 3 minutes): the uploader retries with its own backoff and counts each failure.
            let retry = RetryConfig {
                max_retries: 2,
                retry_timeout: Duration::from_secs(10),
                ..RetryConfig::default()
            };
            let builder = AmazonS3Builder::from_env();
            let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
            let allow_http = builder
                .get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
                .is_some_and(|v| v == "true");
            let facts = S3Facts {
                bucket: bucket.to_string(),
                http_refused: endpoint
                    .filter(|e| !allow_http && e.to_ascii_lowercase().starts_with("http://")),
            };
            let store = builder
                .with_bucket_name(bucket)
                .with_retry(retry)
                .build()
                .map_err(|e| {
                    bad(format!(
                        "{e} (set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; AWS_ALLOW_HTTP=true for http endpoints)"
                    ))
                })?;
            return Ok(Dest::Store(
                Arc::new(store),
                prefix.trim_matches('/').to_string(),
                facts,
            ));
        }
        let path = match url.strip_prefix("file://") {
            Some(p) => PathBuf::from(p),
            None if url.contains("://") => {
                return Err(bad(
                    "unsupported scheme; use a directory, file:///dir or s3://bucket/prefix".into(),
                ))
            }
            None => PathBuf::from(url),
        };
        fs::create_dir_all(&path).map_err(|e| bad(format!("cannot create it: {e}")))?;
        let canon = path
            .canonicalize()
            .map_err(|e| bad(format!("cannot resolve it: {e}")))?;
        if let Ok(data) = data_dir.canonicalize() {
            if canon.starts_with(&data) || data.starts_with(&canon) {
                return Err(bad(format!(
                    "overlaps the data dir {} (it would upload into itself)",
                    data.display()
                )));
            }
        }
        Ok(Dest::Local(canon))
    }
}

/// One published file waiting for upload.
#[derive(Debug, Clone)]
struct Pending {
    path: PathBuf,
    bytes: u64,
    failures: u32,
    not_before: Option<Instant>,
}

/// The progress journal (see the module docs). One line per file: its relative path when it was
/// uploaded, `!` + the path when `backfill = false` skipped it (never deleted locally).
#[derive(Debug)]
struct State {
    path: PathBuf,
    file: fs::File,
    destination: String,
    /// Relative path → uploaded (false: skipped by `backfill = false`).
    done: HashMap<String, bool>,
    /// Lines in the file (to decide when to compact).
    lines: usize,
    /// The state was empty or for another destination.
    fresh: bool,
}

impl State {
    fn open(dir: &Path, destination: &str) -> io::Result<Self> {
        let path = dir.join(STATE_FILE);
        let mut done = HashMap::new();
        let mut lines = 0;
        let mut fresh = true;
        match fs::read_to_string(&path) {
            Ok(text) => {
                let mut it = text.split_inclusive('\n');
                match it.next().map(|h| h.trim_end_matches('\n')) {
                    Some(h) if h.strip_prefix(STATE_HEADER) == Some(destination) => {
                        fresh = false;
                        for l in it {
                            // A torn last line (crash mid-append) has no newline: not done.
                            if let Some(rel) = l.strip_suffix('\n') {
                                let (rel, uploaded) = match rel.strip_prefix('!') {
                                    Some(r) => (r, false),
                                    None => (rel, true),
                                };
                                if !rel.is_empty() {
                                    done.insert(rel.to_string(), uploaded);
                                    lines += 1;
                                }
                            }
                        }
                    }
                    Some(h) => tracing::warn!(
                        previous = h.strip_prefix(STATE_HEADER).unwrap_or(h),
                        destination,
                        "The upload destination changed; the upload state starts over."
                    ),
                    None => {}
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        let mut s = Self {
            path,
            file,
            destination: destination.to_string(),
            done,
            lines,
            fresh,
        };
        // Rewrite at once when the header is not ours (new file, other destination) or the
        // last line was torn.
        s.compact()?;
        Ok(s)
    }

    /// Appends files (uploaded, or skipped when `!uploaded`) and makes them durable.
    fn record(&mut self, rels: &[String], uploaded: bool) -> io::Result<()> {
        let mut buf = String::new();
        for r in rels {
            if !uploaded {
                buf.push('!');
            }
            buf.push_str(r);
            buf.push('\n');
        }
        for r in rels {
            self.done.insert(r.clone(), uploaded);
            self.lines += 1;
        }
        self.file.write_all(buf.as_bytes())?;
        self.file.sync_data()
    }

    /// Rewrites the file with only the live entries (temp, fsync, rename, fsync dir).
    fn compact(&mut self) -> io::Result<()> {
        let mut out = String::with_capacity(64 + self.done.len() * 96);
        out.push_str(STATE_HEADER);
        out.push_str(&self.destination);
        out.push('\n');
        let mut v: Vec<(&String, &bool)> = self.done.iter().collect();
        v.sort();
        for (r, uploaded) in v {
            if !uploaded {
                out.push('!');
            }
            out.push_str(r);
            out.push('\n');
        }
        crate::durable::write_state_file_durable(&self.path, out.as_bytes())?;
        self.file = fs::OpenOptions::new().append(true).open(&self.path)?;
        self.lines = self.done.len();
        Ok(())
    }
}

/// How one upload ended.
#[derive(Debug)]
enum Outcome {
    Uploaded(u64),
    /// The local file was gone (retention) before it could be read.
    Vanished,
    Failed(String),
}

fn backoff(initial_ms: u64, max_ms: u64, failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(20);
    Duration::from_millis(initial_ms.saturating_mul(1 << shift).min(max_ms))
}

/// Uploads `src` (data-dir relative path `rel`) to `dest`, the lake root, at the lake key of
/// switch `switch` (`paths::lake_key`).
async fn upload_one(
    dest: Dest,
    switch: String,
    src: PathBuf,
    rel: String,
    multipart: u64,
) -> Outcome {
    let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
    match dest {
        Dest::Local(root) => {
            // On the uploader's own thread: blocking file I/O stalls nothing else.
            let dst = root.join(crate::paths::lake_key(&switch, &rel));
            let Some(parent) = dst.parent() else {
                return Outcome::Failed(format!("{}: no parent directory", dst.display()));
            };
            let tmp = parent.join(format!(
                ".{}.upload.tmp",
                dst.file_name().and_then(|n| n.to_str()).unwrap_or("part")
            ));
            let r = (|| -> io::Result<u64> {
                fs::create_dir_all(parent)?;
                let n = fs::copy(&src, &tmp)?;
                fs::File::open(&tmp)?.sync_all()?;
                fs::rename(&tmp, &dst)?;
                fsync_dir(parent)?;
                let got = fs::metadata(&dst)?.len();
                if got != n {
                    return Err(io::Error::other(format!(
                        "copied {n} bytes but the destination has {got}"
                    )));
                }
                Ok(n)
            })();
            match r {
                Ok(n) => Outcome::Uploaded(n),
                Err(e) => {
                    let _ = fs::remove_file(&tmp);
                    if gone(&e) && !src.exists() {
                        Outcome::Vanished
                    } else {
                        Outcome::Failed(format!("{}: {e}", dst.display()))
                    }
                }
            }
        }
        Dest::Store(store, prefix, facts) => {
            let rel = crate::paths::lake_key(&switch, &rel);
            let key = if prefix.is_empty() {
                rel.to_string()
            } else {
                format!("{prefix}/{rel}")
            };
            // parse, not from: the Hive escapes (`%2F`) must reach the key unchanged.
            let key = match ObjectPath::parse(&key) {
                Ok(k) => k,
                Err(e) => return Outcome::Failed(format!("{key}: {e}")),
            };
            let mut f = match fs::File::open(&src) {
                Ok(f) => f,
                Err(e) if gone(&e) => return Outcome::Vanished,
                Err(e) => return Outcome::Failed(format!("{}: {e}", src.display())),
            };
            let size = match f.metadata() {
                Ok(m) => m.len(),
                Err(e) => return Outcome::Failed(format!("{}: {e}", src.display())),
            };
            let r: Result<(), String> = if size <= multipart {
                // An open file stays readable even if retention unlinks it now.
                let mut buf = Vec::with_capacity(size as usize);
                match f.read_to_end(&mut buf) {
                    Ok(_) => store
                        .put(&key, PutPayload::from(buf))
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(format!("{}: {e}", src.display())),
                }
            } else {
                multipart_upload(&*store, &key, &mut f, multipart as usize).await
            };
            if let Err(e) = r {
                return Outcome::Failed(explain_store_error(&facts, &key, &e));
            }
            match store.head(&key).await {
                Ok(m) if m.size == size => Outcome::Uploaded(size),
                Ok(m) => Outcome::Failed(format!(
                    "{key}: uploaded {size} bytes but the store has {}",
                    m.size
                )),
                Err(e) => Outcome::Failed(explain_store_error(
                    &facts,
                    &key,
                    &format!("checking the upload: {e}"),
                )),
            }
        }
    }
}

/// An object store failure in words an operator can act on. A bucket that does not exist is
/// told apart from a missing key by S3's error code (`NoSuchBucket`; object_store reports both as
/// "Object at location … not found"): `bucket <b> does not exist (NoSuchBucket: …)`, without the
/// key. Anything else: `<key>: <error>`, and what to change where it can be told:
/// - no credentials in the environment: object_store falls back to the EC2 instance metadata
///   endpoint (`http://169.254.169.254/latest/api/token`), so that is what the error names;
/// - a plain `http://` endpoint without AWS_ALLOW_HTTP=true: "HTTP error: builder error".
fn explain_store_error(s3: &S3Facts, key: &ObjectPath, e: &str) -> String {
    if e.contains("NoSuchBucket") {
        return format!(
            "bucket {} does not exist (NoSuchBucket: create the bucket, or check [upload] to)",
            s3.bucket
        );
    }
    let mut hints = Vec::new();
    if let Some(endpoint) = &s3.http_refused {
        hints.push(format!(
            "the endpoint {endpoint} is plain http: set AWS_ALLOW_HTTP=true to use it"
        ));
    }
    if e.contains("/latest/api/token") || e.contains("/latest/meta-data") {
        // object_store reads no ~/.aws profile: only the environment and the instance's role.
        hints.push(
            "no AWS credentials found (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, \
             AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or an instance role; ~/.aws \
             profiles are not read)"
                .to_string(),
        );
    }
    if hints.is_empty() {
        format!("{key}: {e}")
    } else {
        format!("{}: {key}: {e}", hints.join("; "))
    }
}

async fn multipart_upload(
    store: &dyn ObjectStore,
    key: &ObjectPath,
    f: &mut fs::File,
    chunk: usize,
) -> Result<(), String> {
    let up = store.put_multipart(key).await.map_err(|e| e.to_string())?;
    let mut w = WriteMultipart::new_with_chunk_size(up, chunk);
    let mut buf = vec![0u8; chunk];
    loop {
        let n = match read_full(f, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                let _ = w.abort().await;
                return Err(e.to_string());
            }
        };
        if n == 0 {
            break;
        }
        if let Err(e) = w.wait_for_capacity(2).await {
            let _ = w.abort().await;
            return Err(e.to_string());
        }
        w.write(&buf[..n]);
    }
    w.finish().await.map(drop).map_err(|e| e.to_string())
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The uploader's state, owned by its thread.
#[derive(Debug)]
struct Engine {
    cfg: UploadConfig,
    dir: PathBuf,
    dest: Dest,
    state: State,
    shared: Arc<Shared>,
    /// Not uploaded yet, oldest data first.
    pending: BTreeMap<(u64, String), Pending>,
    consecutive_failures: u32,
    pause_until: Option<Instant>,
    fail_log: LogLimiter,
    vanish_log: LogLimiter,
    first_scan: bool,
}

impl Engine {
    /// Scans the data dir: new files become pending; files gone are forgotten (and counted as
    /// vanished when they were still pending).
    fn rescan(&mut self) {
        let mut found = published_parts(&self.dir);
        if !self.cfg.raw {
            found.retain(|(rel, ..)| !rel.starts_with("profile="));
        }
        self.shared.c.scans.add(1);
        let present: HashSet<&str> = found.iter().map(|(r, ..)| r.as_str()).collect();
        // Pending files that disappeared: deleted before upload.
        let gone: Vec<(u64, String)> = self
            .pending
            .keys()
            .filter(|(_, r)| !present.contains(r.as_str()))
            .cloned()
            .collect();
        for k in gone {
            // Not listed, but still there (a directory that could not be read this time).
            if self.pending.get(&k).is_some_and(|p| p.path.exists()) {
                continue;
            }
            if let Some(p) = self.pending.remove(&k) {
                self.vanished(&k.1, p.bytes);
            }
        }
        // Done files that disappeared: drop them from the state at the next compaction.
        let before = self.state.done.len();
        self.state.done.retain(|r, _| present.contains(r.as_str()));
        let dropped = before - self.state.done.len();
        if self.first_scan {
            let uploaded = self.state.done.values().filter(|u| **u).count();
            self.shared.c.resumed_files.set(uploaded as u64);
        }
        let mut backfill_marked = Vec::new();
        for (rel, path, first_ns) in &found {
            if let Some(&uploaded) = self.state.done.get(rel) {
                if uploaded && self.cfg.delete_after_upload {
                    self.delete_local(path);
                }
                continue;
            }
            let key = (*first_ns, rel.clone());
            if self.pending.contains_key(&key) {
                continue;
            }
            if self.first_scan && self.state.fresh && !self.cfg.backfill {
                backfill_marked.push(rel.clone());
                continue;
            }
            let Ok(md) = fs::metadata(path) else {
                continue; // gone between readdir and stat: never pending, nothing lost to us
            };
            self.pending.insert(
                key,
                Pending {
                    path: path.clone(),
                    bytes: md.len(),
                    failures: 0,
                    not_before: None,
                },
            );
        }
        if !backfill_marked.is_empty() {
            self.shared
                .c
                .skipped_backfill
                .add(backfill_marked.len() as u64);
            tracing::info!(
                files = backfill_marked.len(),
                "backfill = false: files already in the data dir are not uploaded."
            );
            if let Err(e) = self.state.record(&backfill_marked, false) {
                self.state_error(&e);
            }
        }
        self.first_scan = false;
        if dropped > 0 && self.state.lines > 2 * self.state.done.len() + 1024 {
            if let Err(e) = self.state.compact() {
                self.state_error(&e);
            }
        }
        self.publish_pending();
    }

    fn publish_pending(&self) {
        let c = &self.shared.c;
        c.pending_files.set(self.pending.len() as u64);
        c.pending_bytes
            .set(self.pending.values().map(|p| p.bytes).sum());
    }

    fn vanished(&mut self, rel: &str, bytes: u64) {
        self.shared.c.vanished_files.add(1);
        self.shared.c.vanished_bytes.add(bytes);
        if let Some(suppressed) = self.vanish_log.allow() {
            tracing::error!(
                file = rel,
                bytes,
                suppressed,
                "A published file was deleted locally before it was uploaded; it will not reach the lake (retention outran the uploader)."
            );
        }
    }

    fn state_error(&self, e: &io::Error) {
        self.shared.c.state_errors.add(1);
        tracing::warn!(path = %self.state.path.display(), error = %e, "Cannot write the upload state; files may be uploaded again after a restart.");
    }

    fn delete_local(&self, path: &Path) {
        match fs::remove_file(path) {
            Ok(()) => {
                self.shared.c.deleted_after_upload.add(1);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "Cannot delete an uploaded file.")
            }
        }
    }

    /// Uploads what is due, up to `concurrency` at a time, until nothing is due or `deadline`.
    /// Returns (uploaded, failed).
    async fn upload_due(&mut self, deadline: Option<Instant>) -> (u64, u64) {
        let mut set: JoinSet<((u64, String), Outcome)> = JoinSet::new();
        let mut queue: Vec<(u64, String)> = {
            let now = Instant::now();
            self.pending
                .iter()
                .filter(|(_, p)| p.not_before.is_none_or(|t| t <= now))
                .map(|(k, _)| k.clone())
                .collect()
        };
        queue.reverse(); // pop() takes the oldest
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut done: Vec<String> = Vec::new();
        loop {
            while set.len() < self.cfg.concurrency
                && deadline.is_none_or(|d| Instant::now() < d)
                && self.pause_until.is_none_or(|t| Instant::now() >= t)
            {
                let Some(k) = queue.pop() else { break };
                let Some(p) = self.pending.get(&k) else {
                    continue;
                };
                if p.failures > 0 {
                    self.shared.c.retries.add(1);
                }
                let (dest, src, rel) = (self.dest.clone(), p.path.clone(), k.1.clone());
                let switch = self.shared.switch.clone();
                let mp = self.cfg.multipart_bytes;
                set.spawn(async move { (k, upload_one(dest, switch, src, rel, mp).await) });
            }
            let joined = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    match tokio::time::timeout(left, set.join_next()).await {
                        Ok(j) => j,
                        Err(_) => {
                            set.abort_all();
                            break;
                        }
                    }
                }
                None => set.join_next().await,
            };
            let Some(joined) = joined else { break };
            let Ok((k, outcome)) = joined else {
                continue; // a task panicked or was aborted: the file stays pending
            };
            match outcome {
                Outcome::Uploaded(n) => {
                    ok += 1;
                    let p = self.pending.remove(&k);
                    self.shared.c.files_uploaded.add(1);
                    self.shared.c.bytes_uploaded.add(n);
                    self.consecutive_failures = 0;
                    self.pause_until = None;
                    if let Ok(mut g) = self.shared.c.failing.lock() {
                        *g = None;
                    }
                    if let Err(e) = self.state.record(std::slice::from_ref(&k.1), true) {
                        self.state_error(&e);
                    }
                    if self.cfg.delete_after_upload {
                        if let Some(p) = p {
                            self.delete_local(&p.path);
                        }
                    }
                    done.push(k.1);
                }
                Outcome::Vanished => {
                    if let Some(p) = self.pending.remove(&k) {
                        self.vanished(&k.1, p.bytes);
                    }
                }
                Outcome::Failed(msg) => {
                    failed += 1;
                    self.shared.c.failures.add(1);
                    if let Ok(mut g) = self.shared.c.last_error.lock() {
                        *g = Some(msg.clone());
                    }
                    if let Ok(mut g) = self.shared.c.failing.lock() {
                        *g = Some(msg.clone());
                    }
                    if let Some(p) = self.pending.get_mut(&k) {
                        p.failures += 1;
                        p.not_before = Some(
                            Instant::now()
                                + backoff(
                                    self.cfg.retry_initial_ms,
                                    self.cfg.retry_max_ms,
                                    p.failures,
                                ),
                        );
                    }
                    if ok == 0 {
                        // Nothing got through this round: treat the destination as down.
                        self.consecutive_failures += 1;
                        let wait = backoff(
                            self.cfg.retry_initial_ms,
                            self.cfg.retry_max_ms,
                            self.consecutive_failures,
                        );
                        self.pause_until = Some(Instant::now() + wait);
                    }
                    if let Some(suppressed) = self.fail_log.allow() {
                        tracing::warn!(error = %msg, suppressed, "Upload failed; retrying with backoff.");
                    }
                }
            }
        }
        if !done.is_empty() {
            tracing::debug!(files = done.len(), "Uploaded.");
        }
        self.shared
            .c
            .backing_off
            .set(u64::from(self.pause_until.is_some()));
        self.publish_pending();
        (ok, failed)
    }

    /// How long to sleep before the next round.
    fn next_wake(&self) -> Duration {
        let scan = Duration::from_millis(self.cfg.scan_interval_ms);
        let now = Instant::now();
        let mut d = scan;
        if let Some(p) = self.pause_until {
            d = d.max(p.saturating_duration_since(now));
        } else if let Some(t) = self.pending.values().filter_map(|p| p.not_before).min() {
            d = d.min(t.saturating_duration_since(now));
        }
        d.max(Duration::from_millis(1))
    }

    async fn run(mut self) {
        loop {
            if self.shared.stop.load(Relaxed) {
                break;
            }
            self.rescan();
            self.upload_due(None).await;
            let wait = self.next_wake();
            let _ = tokio::time::timeout(wait, self.shared.wake.notified()).await;
        }
        // Final round: what the Parquet sink published at shutdown, bounded in time; the
        // destination's backoff is ignored once (it may be back).
        let deadline = Instant::now() + Duration::from_millis(self.cfg.shutdown_timeout_ms);
        self.rescan();
        self.pause_until = None;
        for p in self.pending.values_mut() {
            p.not_before = None;
        }
        while Instant::now() < deadline && !self.pending.is_empty() {
            let (ok, _) = self.upload_due(Some(deadline)).await;
            if ok == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(self.next_wake().min(left)).await;
                self.pause_until = None;
            }
        }
        if !self.pending.is_empty() {
            tracing::warn!(
                files = self.pending.len(),
                "Uploader stopped with files not uploaded; they are uploaded at the next start."
            );
        }
        let _ = self.state.compact();
    }
}

/// The running uploader: its thread and its counters.
#[derive(Debug)]
pub struct Uploader {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Uploader {
    /// Checks the config and destination, opens the state file in `data_dir`, and starts the
    /// uploader thread. The destination being unreachable is not an error here: it is retried.
    ///
    /// # Errors
    /// An invalid config, an unusable destination URL or S3 setting, an unreadable state file.
    ///
    /// With a `registry`, the counters are registered in it (a child; see
    /// [`crate::metrics::Registry::child`]).
    pub fn start(
        cfg: UploadConfig,
        data_dir: &Path,
        registry: Option<&Arc<Registry>>,
    ) -> Result<Self, Error> {
        cfg.validate()?;
        let switch = if cfg.switch.trim().is_empty() {
            host_name()
        } else {
            cfg.switch.trim().to_string()
        };
        // Everything goes under `switch=<name>/`: that is the destination, for the files and for
        // the state file (another name is another destination).
        let root = lake_root(cfg.to.trim(), &switch);
        // Keys are lake keys (`paths::lake_key`): `switch=<name>/…` for the history, and
        // `_tiers/tier=<t>/switch=<name>/…` for rollup tiers, so the destination is the lake.
        let dest = Dest::parse(cfg.to.trim(), data_dir)?;
        fs::create_dir_all(data_dir).map_err(|source| Error::State {
            path: data_dir.to_owned(),
            source,
        })?;
        let destination = cfg.to.trim().to_string();
        let state = State::open(data_dir, &root).map_err(|source| Error::State {
            path: data_dir.join(STATE_FILE),
            source,
        })?;
        tracing::info!(destination = %crate::redact::redact(&root.to_string()), switch = %switch, "Uploading under the switch's lake prefix.");
        let shared = Arc::new(Shared {
            destination,
            switch,
            c: Counters::new(registry),
            stop: AtomicBool::new(false),
            wake: Notify::new(),
        });
        let engine = Engine {
            dir: data_dir.to_owned(),
            dest,
            state,
            shared: Arc::clone(&shared),
            pending: BTreeMap::new(),
            consecutive_failures: 0,
            pause_until: None,
            fail_log: LogLimiter::new(LOG_EVERY),
            vanish_log: LogLimiter::new(LOG_EVERY),
            first_scan: true,
            cfg,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Spawn)?;
        let thread = std::thread::Builder::new()
            .name("stel-upload".into())
            .spawn(move || rt.block_on(engine.run()))
            .map_err(Error::Spawn)?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Counters (`stel_upload_*`).
    pub fn stats(&self) -> Snapshot {
        self.shared.c.registry.snapshot()
    }

    /// Where files go (as configured).
    pub fn destination(&self) -> &str {
        &self.shared.destination
    }

    /// The switch name every file is uploaded under (`switch=<name>/`).
    pub fn switch(&self) -> &str {
        &self.shared.switch
    }

    /// The last failure, if any.
    pub fn last_error(&self) -> Option<String> {
        self.shared.c.last_error.lock().ok().and_then(|g| g.clone())
    }

    /// While uploads are failing (the last attempt failed, none succeeded since): its error.
    pub fn failing(&self) -> Option<String> {
        self.shared.c.failing.lock().ok().and_then(|g| g.clone())
    }

    /// Scans now instead of at the next interval (e.g. right after a publish).
    pub fn wake(&self) {
        self.shared.wake.notify_one();
    }

    /// Uploads what is pending (bounded by `shutdown_timeout_ms`), writes the state and stops.
    pub fn shutdown(self) -> Snapshot {
        self.shutdown_with_failure().0
    }

    /// [`Uploader::shutdown`], and the error of the last attempt when it failed (why files are
    /// still pending; `None` with files pending: the time ran out while uploads went through).
    /// What is pending stays in the data dir and is uploaded by the next start.
    pub fn shutdown_with_failure(mut self) -> (Snapshot, Option<String>) {
        self.stop();
        (self.stats(), self.failing())
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("The uploader thread panicked.");
            }
        }
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests;
