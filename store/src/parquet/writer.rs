//! The writer thread's state: one open part per session, atomic publish, recovery, retention.
//!
//! Lives entirely on the sink's thread; nothing here is shared except the counters.

use crate::durable::{create_dirs, create_history_file, fsync_dir, is_disk_full};
use crate::log_limit::LogLimiter;
use crate::retention::{History, Limits};
use std::{
    collections::{BTreeMap, HashMap},
    fs::{self, File},
    io::{self, BufWriter},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use ::parquet::file::{
    metadata::{KeyValue, ParquetMetaDataReader},
    properties::WriterProperties,
};
use serde::Serialize;

use super::{
    chunk::{EncodeOptions, EncodePool, PartFile},
    keys,
    sink::Counters,
    ParquetSinkConfig,
};
use crate::{
    batch::CounterBatch,
    paths::{classify, LayoutEntry, PartName, PartPaths, SessionDir, UtcHour},
    schema::SessionSchema,
};

/// What the sink found under its root at start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// Published parts found (they count towards retention).
    pub published_files: u64,
    pub published_bytes: u64,
    /// Temporary parts left by a writer that was killed (removed).
    pub stale_temp_files: u64,
    pub stale_temp_bytes: u64,
    /// Published parts whose footer could not be read (left in place, logged).
    pub unreadable_files: u64,
    /// Per session, sorted by (profile, group).
    pub sessions: Vec<SessionRecovery>,
}

/// One session's state at start: where its durable history ends and what was lost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SessionRecovery {
    pub profile: String,
    pub group: String,
    /// Last timestamp in the newest published part (`stel.last_ns`), if any.
    pub last_durable_ns: Option<i64>,
    /// Temporary parts removed for this session.
    pub stale_temp_files: u64,
    pub stale_temp_bytes: u64,
    /// First timestamp of the oldest removed temporary part: rows from here until the previous
    /// run stopped were never published. `None` when no temporary part was left (the loss, if
    /// any, was only what sat in the queue: it starts after `last_durable_ns`).
    pub lost_from_ns: Option<i64>,
}

/// Most parts (files being written, one per session) open at once: each holds a file descriptor,
/// a `.tmp` file and its encoder's buffers, so a stream of ever new sessions (in-band templates
/// of many domains) cannot exhaust either. Past it, the part written to longest ago is published
/// early (counted `stel_parquet_rotations_total{reason="open_files"}`, logged at most once a
/// minute).
pub const MAX_OPEN_PARTS: usize = 256;

/// Why an open part was published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rotation {
    /// The session's schema (templates, generation) changed.
    Schema,
    /// The next rows belong to another hour partition.
    Hour,
    /// The part reached `max_file_bytes`.
    Size,
    /// The part is `flush_interval_ms` old.
    Age,
    /// [`MAX_OPEN_PARTS`] sessions had a part open and another one needed one: the part
    /// written to longest ago was published early.
    OpenFiles,
    /// The sink is shutting down.
    Shutdown,
}

struct OpenPart {
    paths: PartPaths,
    schema: Arc<SessionSchema>,
    writer: PartFile<BufWriter<File>>,
    opened: Instant,
    hour_start_ns: i64,
    hour_end_ns: i64,
    first_ns: i64,
    last_ns: i64,
    rows: u64,
    samples: u64,
    missing: u64,
    /// The writer's clock at its last write (the early-publish order).
    touched: u64,
}

impl std::fmt::Debug for OpenPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenPart")
            .field("paths", &self.paths)
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

/// Decoder batches of one session waiting to be written together (`write_batch_rows`; 1 by
/// default: the column-chunk encoder has no per-call cost worth coalescing for).
#[derive(Debug)]
struct Pending {
    batches: Vec<Arc<CounterBatch>>,
    rows: usize,
    since: Instant,
}

/// How long a batch may wait for others to be coalesced with.
const COALESCE_MAX_WAIT: Duration = Duration::from_millis(200);

/// Why writing stopped for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocked {
    DiskFull,
    IoError,
}

/// The writer thread's state.
#[derive(Debug)]
pub(crate) struct Writer {
    cfg: ParquetSinkConfig,
    /// Encodes column chunks of the open parts (`encode_threads`).
    pool: Arc<EncodePool>,
    props: WriterProperties,
    switch: String,
    c: Arc<Counters>,
    parts: HashMap<(String, String), OpenPart>,
    /// Batches waiting to be coalesced into one write of at least `write_batch_rows` rows.
    pending: HashMap<(String, String), Pending>,
    seq: u32,
    /// Published files, for retention.
    history: History,
    blocked: Option<(Blocked, Instant)>,
    /// An error episode is open until a part is published again.
    in_episode: bool,
    last_retention_scan: Instant,
    log_err: LogLimiter,
    log_drop: LogLimiter,
    log_open: LogLimiter,
    /// Advances per write: the parts' `touched` order.
    clock: u64,
}

/// Host name for the `stel.switch` key when the config does not name the switch.
pub(crate) fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// Footer key-value metadata that does not change while a part is open.
pub(crate) fn static_kv(schema: &SessionSchema, switch: &str) -> Vec<KeyValue> {
    let mut objects = BTreeMap::new();
    let mut sai = BTreeMap::new();
    for c in &schema.columns {
        objects.insert(c.label.to_string(), c.object.clone());
        sai.insert(c.key.short_name(), c.key.full_name());
    }
    let json = |m: &BTreeMap<String, String>| serde_json::to_string(m).unwrap_or_default();
    let kv = |k: &str, v: String| KeyValue::new(k.to_string(), v);
    vec![
        kv(keys::PROFILE, schema.profile.clone()),
        kv(keys::GROUP, schema.group.clone()),
        kv(keys::DOMAIN, schema.domain.to_string()),
        kv(
            keys::TEMPLATE_IDS,
            schema
                .template_ids
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
        kv(keys::GENERATION, schema.generation.to_string()),
        kv(keys::VERSION, env!("CARGO_PKG_VERSION").to_string()),
        kv(keys::SWITCH, switch.to_string()),
        kv(keys::OBJECTS, json(&objects)),
        kv(keys::SAI_NAMES, json(&sai)),
    ]
}

/// Reads `key` from a Parquet file's footer.
pub fn read_footer_kv(path: &Path, key: &str) -> Result<Option<String>, String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let md = ParquetMetaDataReader::new()
        .parse_and_finish(&f)
        .map_err(|e| e.to_string())?;
    Ok(md
        .file_metadata()
        .key_value_metadata()
        .and_then(|kvs| kvs.iter().find(|kv| kv.key == key))
        .and_then(|kv| kv.value.clone()))
}

impl Writer {
    pub(crate) fn new(cfg: ParquetSinkConfig, c: Arc<Counters>) -> io::Result<Self> {
        let switch = cfg.switch_name.clone().unwrap_or_else(host_name);
        let pool = Arc::new(EncodePool::new(cfg.encode_threads())?);
        Ok(Self {
            pool,
            props: cfg.writer_properties(),
            cfg,
            switch,
            c,
            parts: HashMap::new(),
            pending: HashMap::new(),
            seq: 0,
            history: History::default(),
            blocked: None,
            in_episode: false,
            last_retention_scan: Instant::now(),
            log_err: LogLimiter::new(Duration::from_secs(10)),
            log_drop: LogLimiter::new(Duration::from_secs(10)),
            log_open: LogLimiter::new(Duration::from_secs(60)),
            clock: 0,
        })
    }

    /// Walks the root: removes stale temporary parts, indexes published ones for retention and
    /// reads where each session's durable history ends. Errors reading single entries are
    /// logged and counted, never fatal.
    pub(crate) fn recover(&mut self) -> RecoveryReport {
        let root = self.cfg.dir.clone();
        let mut report = RecoveryReport::default();
        // Per session: its report and its newest published part.
        type Found = (SessionRecovery, Option<(PartName, PathBuf)>);
        let mut sessions: BTreeMap<(String, String), Found> = BTreeMap::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "Cannot list history directory.");
                    continue;
                }
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(ft) = entry.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(path);
                    continue;
                }
                let Ok(md) = entry.metadata() else { continue };
                match classify(&root, &path) {
                    LayoutEntry::Temp {
                        profile,
                        group,
                        name,
                    } => {
                        let s = &mut sessions
                            .entry((profile.clone(), group.clone()))
                            .or_insert_with(|| {
                                (
                                    SessionRecovery {
                                        profile,
                                        group,
                                        ..Default::default()
                                    },
                                    None,
                                )
                            })
                            .0;
                        match fs::remove_file(&path) {
                            Ok(()) => {
                                s.stale_temp_files += 1;
                                s.stale_temp_bytes += md.len();
                                let first = name.first_ns as i64;
                                s.lost_from_ns =
                                    Some(s.lost_from_ns.map_or(first, |f| f.min(first)));
                                report.stale_temp_files += 1;
                                report.stale_temp_bytes += md.len();
                            }
                            Err(e) => {
                                tracing::warn!(path = %path.display(), error = %e, "Cannot remove stale temporary part.");
                            }
                        }
                    }
                    LayoutEntry::Part {
                        profile,
                        group,
                        name,
                    } => {
                        report.published_files += 1;
                        report.published_bytes += md.len();
                        let published = md.modified().unwrap_or_else(|_| SystemTime::now());
                        self.history
                            .insert(name.first_ns, path.clone(), md.len(), published);
                        let e = sessions
                            .entry((profile.clone(), group.clone()))
                            .or_insert_with(|| {
                                (
                                    SessionRecovery {
                                        profile,
                                        group,
                                        ..Default::default()
                                    },
                                    None,
                                )
                            });
                        if e.1.as_ref().is_none_or(|(n, _)| name > *n) {
                            e.1 = Some((name, path));
                        }
                    }
                    LayoutEntry::Other => {}
                }
            }
        }
        for (_, (mut s, newest)) in sessions {
            if let Some((_, path)) = newest {
                match read_footer_kv(&path, keys::LAST_NS) {
                    Ok(v) => s.last_durable_ns = v.and_then(|v| v.parse().ok()),
                    Err(e) => {
                        report.unreadable_files += 1;
                        tracing::warn!(path = %path.display(), error = %e, "Cannot read the footer of a published part.");
                    }
                }
            }
            report.sessions.push(s);
        }
        self.c.stale_temp_files_removed.add(report.stale_temp_files);
        self.c.stale_temp_bytes_removed.add(report.stale_temp_bytes);
        self.c.history_bytes.set(self.history.bytes());
        self.enforce_retention(true);
        report
    }

    /// Writes one batch: split at hour boundaries, each piece into its session's open part.
    /// Takes one submitted batch: coalesces it with the session's pending batches and writes
    /// them once they reach `write_batch_rows` rows (or the schema changes, or they waited
    /// [`COALESCE_MAX_WAIT`]).
    pub(crate) fn push(&mut self, batch: Arc<CounterBatch>) {
        if batch.rows() == 0 {
            return;
        }
        let key = (batch.schema.profile.clone(), batch.schema.group.clone());
        let changed = self.pending.get(&key).is_some_and(|p| {
            p.batches.first().is_some_and(|f| {
                !Arc::ptr_eq(&f.schema, &batch.schema) && *f.schema != *batch.schema
            })
        });
        if changed {
            self.flush_pending(&key);
        }
        let p = self.pending.entry(key.clone()).or_insert_with(|| Pending {
            batches: Vec::new(),
            rows: 0,
            since: Instant::now(),
        });
        p.rows += batch.rows();
        p.batches.push(batch);
        if p.rows >= self.cfg.write_batch_rows {
            self.flush_pending(&key);
        } else {
            self.update_memory();
        }
    }

    fn flush_pending(&mut self, key: &(String, String)) {
        let Some(p) = self.pending.remove(key) else {
            return;
        };
        let n = p.batches.len() as u64;
        if self.cfg.test_write_delay_us > 0 {
            std::thread::sleep(Duration::from_micros(self.cfg.test_write_delay_us * n));
        }
        if n == 1 {
            self.write_batch(&p.batches[0], 1);
            p.batches.into_iter().for_each(crate::batch::release);
            return;
        }
        let schema = Arc::clone(&p.batches[0].schema);
        let width = schema.width();
        let parts = schema.parts().max(1);
        let full: u32 = if parts >= 32 {
            u32::MAX
        } else {
            (1u32 << parts) - 1
        };
        let masks = p.batches.iter().any(|b| !b.part_masks.is_empty());
        let mut ts = Vec::with_capacity(p.rows);
        let mut values = Vec::with_capacity(p.rows * width);
        let mut part_masks = Vec::new();
        for b in &p.batches {
            ts.extend_from_slice(&b.ts);
            values.extend_from_slice(&b.values);
            if masks {
                if b.part_masks.is_empty() {
                    part_masks.extend(std::iter::repeat_n(full, b.rows()));
                } else {
                    part_masks.extend_from_slice(&b.part_masks);
                }
            }
        }
        p.batches.into_iter().for_each(crate::batch::release);
        let merged = Arc::new(CounterBatch {
            schema,
            ts,
            values,
            part_masks,
        });
        self.write_batch(&merged, n);
    }

    fn flush_all_pending(&mut self, older_than: Option<Duration>) {
        let now = Instant::now();
        let due: Vec<_> = self
            .pending
            .iter()
            .filter(|(_, p)| older_than.is_none_or(|d| now.duration_since(p.since) >= d))
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            self.flush_pending(&k);
        }
    }

    /// Writes `batch` (`n` submitted batches): split at hour boundaries, each piece into its
    /// session's open part.
    fn write_batch(&mut self, batch: &Arc<CounterBatch>, n: u64) {
        let rows = batch.rows();
        if rows == 0 {
            return;
        }
        let samples = batch.samples() as u64;
        if let Some((why, until)) = self.blocked {
            if Instant::now() < until {
                self.count_lost(why, samples);
                if let Some(n) = self.log_drop.allow() {
                    tracing::warn!(
                        samples,
                        suppressed = n,
                        reason = ?why,
                        "Parquet writes paused after a write error; batch not written."
                    );
                }
                return;
            }
            self.blocked = None;
        }
        let width = batch.schema.width() as u64;
        let mut start = 0;
        let mut ok = true;
        while start < rows {
            let t0 = batch.ts[start];
            let h0 = UtcHour::next_start_ns(t0);
            let lo = h0 - 3_600_000_000_000;
            let mut end = start + 1;
            while end < rows && batch.ts[end] >= lo && batch.ts[end] < h0 {
                end += 1;
            }
            let first = t0;
            let last = batch.ts[start..end].iter().copied().max().unwrap_or(t0);
            ok &= self.write_piece(batch, start, end, first, last, width);
            start = end;
        }
        if ok {
            self.c.batches_written.add(n);
        }
        self.update_memory();
    }

    fn count_lost(&self, why: Blocked, samples: u64) {
        match why {
            Blocked::DiskFull => self.c.lost_disk_full_samples.add(samples),
            Blocked::IoError => self.c.lost_write_error_samples.add(samples),
        };
    }

    fn update_memory(&self) {
        let pending: usize = self
            .pending
            .values()
            .flat_map(|p| &p.batches)
            .map(|b| (b.values.len() + b.ts.len()) * 8)
            .sum();
        let mem: usize = self
            .parts
            .values()
            .map(|p| self.part_memory(p))
            .sum::<usize>()
            + pending;
        self.c.writer_bytes.set(mem as u64);
        self.c.writer_bytes_peak.max(mem as u64);
    }

    /// Bytes an open part holds: its encoded, unflushed row group (the encoder keeps no raw
    /// values with DELTA_BINARY_PACKED; one page of them per column otherwise).
    fn part_memory(&self, p: &OpenPart) -> usize {
        p.writer.in_progress_size()
    }

    /// Returns false when the piece was not written (counted as lost).
    fn write_piece(
        &mut self,
        batch: &Arc<CounterBatch>,
        start: usize,
        end: usize,
        first: i64,
        last: i64,
        width: u64,
    ) -> bool {
        let schema = &batch.schema;
        let key = (schema.profile.clone(), schema.group.clone());
        let rows = (end - start) as u64;
        let samples = rows * width;
        if let Some(p) = self.parts.get(&key) {
            let rotation = if !Arc::ptr_eq(&p.schema, schema) && *p.schema != **schema {
                Some(Rotation::Schema)
            } else if first < p.hour_start_ns || first >= p.hour_end_ns {
                Some(Rotation::Hour)
            } else {
                None
            };
            if let Some(r) = rotation {
                self.publish(&key, r);
            }
        }
        if !self.parts.contains_key(&key) {
            self.make_room_for_a_part();
            match self.open_part(schema, first) {
                Ok(p) => {
                    self.parts.insert(key.clone(), p);
                }
                Err(e) => {
                    let dir = SessionDir::new(&self.cfg.dir, &schema.profile, &schema.group)
                        .partition(first);
                    self.failed(None, Some(dir.as_path()), samples, e.as_ref(), "open");
                    return false;
                }
            }
        }
        let Some(p) = self.parts.get_mut(&key) else {
            return false;
        };
        self.clock += 1;
        p.touched = self.clock;
        if let Err(e) = p.writer.write(batch, start, end) {
            let p = self.parts.remove(&key);
            self.failed(p, None, samples, &e, "write");
            return false;
        }
        p.rows += rows;
        p.samples += samples;
        p.missing += batch.missing_samples_in(start, end) as u64;
        p.first_ns = p.first_ns.min(first);
        p.last_ns = p.last_ns.max(last);
        // Memory budget: the writer may hold at most half of it in buffered row groups.
        let budget_half = (self.cfg.memory_budget_bytes / 2) as usize;
        if p.writer.in_progress_size() > budget_half {
            self.c.budget_row_group_flushes.add(1);
            if let Err(e) = p.writer.flush() {
                let p = self.parts.remove(&key);
                self.failed(p, None, 0, &e, "flush");
                return false;
            }
        }
        let size = (p.writer.bytes_written() + p.writer.in_progress_size()) as u64;
        if size >= self.cfg.max_file_bytes {
            self.publish(&key, Rotation::Size);
        }
        true
    }

    fn open_part(
        &mut self,
        schema: &Arc<SessionSchema>,
        first_ns: i64,
    ) -> Result<OpenPart, Box<dyn std::error::Error + Send + Sync>> {
        let partition =
            SessionDir::new(&self.cfg.dir, &schema.profile, &schema.group).partition(first_ns);
        create_dirs(partition.as_path())?;
        let (paths, file) = loop {
            let paths = partition.part(PartName::new(first_ns, self.seq));
            self.seq = (self.seq + 1) % (crate::paths::MAX_SEQ + 1);
            if paths.published.exists() {
                continue;
            }
            match create_history_file(&paths.temp) {
                Ok(f) => break (paths, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let props = self
            .props
            .clone()
            .into_builder()
            .set_key_value_metadata(Some({
                let mut kv = static_kv(schema, &self.switch);
                if !self.cfg.port_speeds_mbps.is_empty() {
                    kv.push(KeyValue::new(
                        keys::PORT_SPEED_MBPS.to_string(),
                        serde_json::to_string(&self.cfg.port_speeds_mbps).unwrap_or_default(),
                    ));
                }
                kv
            }))
            .build();
        let opts = EncodeOptions::from(&self.cfg);
        let writer = match PartFile::try_new(
            BufWriter::with_capacity(1 << 20, file),
            schema,
            props,
            opts,
            Arc::clone(&self.pool),
        ) {
            Ok(w) => w,
            Err(e) => {
                let _ = fs::remove_file(&paths.temp);
                return Err(e.into());
            }
        };
        let hour_end_ns = UtcHour::next_start_ns(first_ns);
        Ok(OpenPart {
            paths,
            schema: Arc::clone(schema),
            writer,
            opened: Instant::now(),
            hour_start_ns: hour_end_ns - 3_600_000_000_000,
            hour_end_ns,
            first_ns,
            last_ns: first_ns,
            rows: 0,
            samples: 0,
            missing: 0,
            touched: 0,
        })
    }

    /// Publishes the part written to longest ago while [`MAX_OPEN_PARTS`] are open.
    fn make_room_for_a_part(&mut self) {
        while self.parts.len() >= MAX_OPEN_PARTS {
            let Some(key) = self
                .parts
                .iter()
                .min_by_key(|(_, p)| p.touched)
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            if let Some(n) = self.log_open.allow() {
                tracing::warn!(
                    max = MAX_OPEN_PARTS,
                    profile = %key.0,
                    group = %key.1,
                    suppressed = n,
                    "More sessions than open Parquet parts allow; the part written to longest ago is published early."
                );
            }
            self.publish(&key, Rotation::OpenFiles);
        }
    }

    /// A write/open/publish failed: abandon the part (its samples are lost), pause writing for
    /// `retry_interval_ms`, count and log. `at` names the path when there is no part (the
    /// partition a part could not be opened in, the file that could not be published).
    fn failed(
        &mut self,
        part: Option<OpenPart>,
        at: Option<&Path>,
        extra_samples: u64,
        e: &(dyn std::error::Error + 'static),
        stage: &'static str,
    ) {
        let disk_full = is_disk_full(e);
        let why = if disk_full {
            Blocked::DiskFull
        } else {
            Blocked::IoError
        };
        let mut lost = extra_samples;
        let mut path = at.map(Path::to_path_buf);
        if let Some(p) = part {
            lost += p.samples;
            drop(p.writer);
            let _ = fs::remove_file(&p.paths.temp);
            path = Some(p.paths.temp);
        }
        self.count_lost(why, lost);
        if disk_full {
            self.c.disk_full_errors.add(1);
        } else {
            self.c.io_errors.add(1);
        }
        if !self.in_episode {
            self.in_episode = true;
            if disk_full {
                self.c.disk_full_episodes.add(1);
            } else {
                self.c.io_error_episodes.add(1);
            }
        }
        self.blocked = Some((
            why,
            Instant::now() + Duration::from_millis(self.cfg.retry_interval_ms),
        ));
        if let Some(n) = self.log_err.allow() {
            tracing::error!(
                stage,
                disk_full,
                lost_samples = lost,
                path = %path.as_deref().map_or_else(|| self.cfg.dir.display().to_string(), |p| p.display().to_string()),
                error = %e,
                suppressed = n,
                "Parquet write failed; samples not written, retrying after the retry interval."
            );
        }
        // Free the space an abandoned part held at once; if retention can help, let it.
        if disk_full {
            self.enforce_retention(false);
        }
    }

    /// Closes, fsyncs and publishes the session's open part.
    fn publish(&mut self, key: &(String, String), why: Rotation) {
        let Some(mut p) = self.parts.remove(key) else {
            return;
        };
        let kv = |k: &str, v: String| KeyValue::new(k.to_string(), v);
        p.writer
            .append_key_value_metadata(kv(keys::FIRST_NS, p.first_ns.to_string()));
        p.writer
            .append_key_value_metadata(kv(keys::LAST_NS, p.last_ns.to_string()));
        p.writer
            .append_key_value_metadata(kv(keys::ROWS, p.rows.to_string()));
        p.writer
            .append_key_value_metadata(kv(keys::SAMPLES, p.samples.to_string()));
        p.writer
            .append_key_value_metadata(kv(keys::MISSING_SAMPLES, p.missing.to_string()));
        let (paths, rows, samples, missing) = (p.paths.clone(), p.rows, p.samples, p.missing);
        let result = (|| -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
            let buf = p.writer.into_inner()?;
            let file = buf.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            let bytes = file.metadata()?.len();
            drop(file);
            fs::rename(&paths.temp, &paths.published)?;
            if let Some(dir) = paths.published.parent() {
                fsync_dir(dir)?;
            }
            Ok(bytes)
        })();
        match result {
            Ok(bytes) => {
                let c = &self.c;
                c.files_published.add(1);
                c.bytes_published.add(bytes);
                c.rows_written.add(rows);
                c.samples_written.add(samples);
                c.missing_samples_written.add(missing);
                match why {
                    Rotation::Schema => c.rotations_schema.add(1),
                    Rotation::Hour => c.rotations_hour.add(1),
                    Rotation::Size => c.rotations_size.add(1),
                    Rotation::Age => c.rotations_age.add(1),
                    Rotation::OpenFiles => c.rotations_open_files.add(1),
                    Rotation::Shutdown => {}
                };
                if self.in_episode {
                    self.in_episode = false;
                    c.recoveries.add(1);
                    tracing::info!(path = %paths.published.display(), "Parquet writes recovered.");
                }
                tracing::debug!(path = %paths.published.display(), rows, bytes, reason = ?why, "Published a Parquet part.");
                self.history.insert(
                    paths.name.first_ns,
                    paths.published.clone(),
                    bytes,
                    SystemTime::now(),
                );
                self.c.history_bytes.set(self.history.bytes());
                self.enforce_retention(false);
            }
            Err(e) => {
                // The part is gone with its temp file: its samples are the loss.
                let _ = fs::remove_file(&paths.temp);
                self.failed(None, Some(&paths.temp), samples, e.as_ref(), "publish");
            }
        }
        self.update_memory();
    }

    /// Periodic work: publish parts older than the flush interval, age-based retention.
    pub(crate) fn tick(&mut self) {
        self.flush_all_pending(Some(COALESCE_MAX_WAIT.min(self.cfg.flush_interval())));
        let now = Instant::now();
        let max_age = self.cfg.flush_interval();
        let due: Vec<(String, String)> = self
            .parts
            .iter()
            .filter(|(_, p)| now.duration_since(p.opened) >= max_age)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            self.publish(&k, Rotation::Age);
        }
        if now.duration_since(self.last_retention_scan) >= Duration::from_secs(1) {
            self.last_retention_scan = now;
            self.enforce_retention(true);
        }
    }

    /// How long the writer thread may sleep before [`Writer::tick`] has work.
    pub(crate) fn next_deadline(&self) -> Duration {
        let now = Instant::now();
        let max_age = self.cfg.flush_interval();
        let wait = COALESCE_MAX_WAIT.min(max_age);
        self.parts
            .values()
            .map(|p| (p.opened + max_age).saturating_duration_since(now))
            .chain(
                self.pending
                    .values()
                    .map(|p| (p.since + wait).saturating_duration_since(now)),
            )
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1))
    }

    /// Publishes every open part.
    pub(crate) fn close_all(&mut self) {
        self.flush_all_pending(None);
        let keys: Vec<_> = self.parts.keys().cloned().collect();
        for k in keys {
            self.publish(&k, Rotation::Shutdown);
        }
    }

    /// Deletes the oldest published files while over `retention_max_bytes`, and (when `age`)
    /// files published longer than `retention_max_age_s` ago.
    fn enforce_retention(&mut self, age: bool) {
        let limits = Limits {
            max_bytes: self.cfg.disk_budget.raw_limit(self.cfg.retention_max_bytes),
            max_age_s: self.cfg.retention_max_age_s,
        };
        let d = self.history.enforce(limits, age, "a file");
        self.c.retention_files_deleted.add(d.files);
        self.c.retention_bytes_deleted.add(d.bytes);
        self.c.retention_errors.add(d.errors);
        self.c.history_bytes.set(self.history.bytes());
    }
}
