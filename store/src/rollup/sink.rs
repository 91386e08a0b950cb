//! [`RollupSink`]: the bounded queue in front of the rollup thread, and [`RollupWriter`], the
//! thread's state (also driven directly by `stel-ingestd rollup` and the benchmark).
//!
//! ```text
//! decode threads ──submit(Arc<CounterBatch>)──▶ bounded queue ──▶ stel-rollup thread
//!   (drop_newest: never waits; a shed batch is     (queue_batches)    per session: Accumulator
//!    counted by reason and is a gap in the tiers)                     → TierFile per tier
//!                                                                     → publish, retention
//! ```

use std::{
    collections::HashMap,
    fmt,
    path::PathBuf,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use crossbeam_channel::{Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError};

use super::{
    accum::{Accumulator, IntervalRow},
    config::{BurstRule, RollupConfig, Tier},
    plan::Plan,
    writer::{scan, FileIdentity, Layout, Published, TierFile},
};
use crate::{
    batch::CounterBatch,
    labels,
    log_limit::{LogLimiter, SharedLogLimiter},
    metrics::{Counter, Gauge, Metric, Registry, Snapshot},
    parquet::{Codec, ShedReason, WhenFull},
    retention::{BudgetHandle, History, Limits},
    schema::SessionSchema,
};

/// Errors of starting the rollup sink. Failures while running are counted and logged.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid rollup config: {}", .0.join("; "))]
    Config(Vec<String>),
    #[error("cannot create {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the rollup thread: {0}")]
    Spawn(std::io::Error),
    #[error("the rollup thread panicked")]
    Panicked,
}

/// The sink's counters (registry handles; `sink="rollup"`).
///
/// Accounting identity after shutdown: `received = delivered + Σ dropped` samples, where
/// delivered samples went into an accumulator (and so into the tiers' rows).
#[derive(Debug)]
pub(crate) struct Counters {
    registry: Arc<Registry>,
    batches_submitted: Counter,
    samples_submitted: Counter,
    batches_queued: Counter,
    batches_dequeued: Counter,
    shed_full_batches: Counter,
    shed_full_samples: Counter,
    shed_timeout_batches: Counter,
    shed_timeout_samples: Counter,
    shed_closed_batches: Counter,
    shed_closed_samples: Counter,
    samples_done: Counter,
    files_published: Counter,
    queued_bytes: Gauge,
    queued_bytes_peak: Gauge,
    rows_written: Counter,
    bytes_published: Counter,
    write_errors: Counter,
    retention_files: Counter,
    retention_bytes: Counter,
    tier_bytes: Gauge,
    stale_temp_files: Counter,
    evicted_sessions: Counter,
    memory_flushes: Counter,
}

impl Counters {
    fn new(parent: Option<&Arc<Registry>>) -> Self {
        let r = Registry::child_of(parent);
        let c = |m: Metric| r.counter(m, labels!(Sink = "rollup"));
        let d = |m: Metric, reason: &'static str| {
            r.counter(m, labels!(Sink = "rollup", Reason = reason))
        };
        Self {
            batches_submitted: c(Metric::SinkReceivedBatches),
            samples_submitted: c(Metric::SinkReceivedSamples),
            batches_queued: c(Metric::SinkQueuedBatches),
            batches_dequeued: c(Metric::SinkDequeuedBatches),
            shed_full_batches: d(Metric::SinkDroppedBatches, "queue_full"),
            shed_full_samples: d(Metric::SinkDroppedSamples, "queue_full"),
            shed_timeout_batches: d(Metric::SinkDroppedBatches, "queue_timeout"),
            shed_timeout_samples: d(Metric::SinkDroppedSamples, "queue_timeout"),
            shed_closed_batches: d(Metric::SinkDroppedBatches, "closed"),
            shed_closed_samples: d(Metric::SinkDroppedSamples, "closed"),
            samples_done: c(Metric::SinkDeliveredSamples),
            files_published: c(Metric::SinkPublishedFiles),
            queued_bytes: r.gauge(Metric::SinkQueuedBytes, labels!(Sink = "rollup")),
            queued_bytes_peak: r.gauge(Metric::SinkQueuedBytesPeak, labels!(Sink = "rollup")),
            rows_written: r.counter(Metric::RollupWrittenRows, labels!()),
            bytes_published: r.counter(Metric::RollupPublishedBytes, labels!()),
            write_errors: r.counter(Metric::RollupWriteErrors, labels!()),
            retention_files: r.counter(Metric::RollupRetentionFiles, labels!()),
            retention_bytes: r.counter(Metric::RollupRetentionBytes, labels!()),
            tier_bytes: r.gauge(Metric::RollupTierBytes, labels!()),
            stale_temp_files: r.counter(Metric::RollupStaleTempFiles, labels!()),
            evicted_sessions: r.counter(Metric::RollupEvictedSessions, labels!()),
            memory_flushes: r.counter(Metric::RollupMemoryFlushes, labels!()),
            registry: r,
        }
    }
}

/// The rollup sink's accounting over a snapshot of its counters.
pub mod accounting {
    use crate::metrics::{Label, Metric, Snapshot};

    fn rollup(s: &Snapshot, m: Metric) -> u64 {
        s.sum_where(m, Label::Sink, "rollup")
    }

    /// Samples submitted.
    pub fn submitted(s: &Snapshot) -> u64 {
        rollup(s, Metric::SinkReceivedSamples)
    }

    /// Samples that went into the tiers.
    pub fn rolled_up(s: &Snapshot) -> u64 {
        rollup(s, Metric::SinkDeliveredSamples)
    }

    /// Samples shed before the rollup thread took them (every reason).
    pub fn shed(s: &Snapshot) -> u64 {
        rollup(s, Metric::SinkDroppedSamples)
    }

    /// Tier files published.
    pub fn files(s: &Snapshot) -> u64 {
        rollup(s, Metric::SinkPublishedFiles)
    }

    /// Bytes of tier files published.
    pub fn bytes(s: &Snapshot) -> u64 {
        s.sum(Metric::RollupPublishedBytes)
    }

    /// Rows of tier files published.
    pub fn rows(s: &Snapshot) -> u64 {
        s.sum(Metric::RollupWrittenRows)
    }
}

/// What a tier holds on disk, for retention.
#[derive(Debug)]
struct TierStore {
    tier: Tier,
    history: History,
}

/// One session's tiers.
#[derive(Debug)]
struct SessionTiers {
    plan: Arc<Plan>,
    layout: Arc<Layout>,
    acc: Accumulator,
    /// Per coarser tier (index 1..): the row being absorbed and the start of the last finer
    /// row it took.
    pending: Vec<Option<(IntervalRow, i64)>>,
    /// Per tier: the open file.
    files: Vec<Option<TierFile>>,
    last_batch: Instant,
}

/// Figures of a [`RollupWriter`] (also in its counters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterTotals {
    /// Rows (interval × object) published, per tier.
    pub rows: Vec<u64>,
    /// Bytes published, per tier.
    pub bytes: Vec<u64>,
    pub files: u64,
    pub write_errors: u64,
    pub retention_files: u64,
    pub retention_bytes: u64,
    pub stale_temp_files: u64,
    pub evicted_sessions: u64,
    pub memory_flushes: u64,
}

/// The rollup thread's state: every session's accumulator and open tier files, the tiers'
/// retention. Driven by [`RollupSink`]'s thread, by `stel-ingestd rollup` and the benchmark.
#[derive(Debug)]
pub struct RollupWriter {
    root: PathBuf,
    ids: Vec<Arc<FileIdentity>>,
    rule: BurstRule,
    stores: Vec<TierStore>,
    sessions: HashMap<(String, String), SessionTiers>,
    seq: u32,
    budget: BudgetHandle,
    /// Close a session's open interval after this long without a batch.
    idle: Duration,
    max_sessions: usize,
    memory_budget: usize,
    last_age_scan: Instant,
    totals: WriterTotals,
    c: Option<Arc<Counters>>,
    log_err: LogLimiter,
}

impl RollupWriter {
    /// A writer of `cfg`'s tiers under `root` (the raw history's directory); files are marked
    /// as written by `switch`. Recovers what a previous run left: removes stale temporary files,
    /// indexes published ones for retention.
    ///
    /// # Errors
    /// An invalid config.
    pub fn new(
        cfg: &RollupConfig,
        root: PathBuf,
        switch: String,
        budget: BudgetHandle,
    ) -> Result<Self, Error> {
        let (tiers, rule) = cfg.resolve().map_err(Error::Config)?;
        let mut totals = WriterTotals {
            rows: vec![0; tiers.len()],
            bytes: vec![0; tiers.len()],
            ..WriterTotals::default()
        };
        let mut stores = Vec::new();
        for t in &tiers {
            let (found, stale, _) = scan(&root, &t.name);
            totals.stale_temp_files += stale;
            let mut history = History::default();
            for (p, first_ns, bytes) in found {
                // Age is data age: the file's first interval plus its span bounds its end.
                let end = (first_ns as i64).saturating_add(t.file_span_ns);
                history.insert(first_ns, p, bytes, data_time(end));
            }
            stores.push(TierStore {
                tier: t.clone(),
                history,
            });
        }
        let ids = tiers
            .iter()
            .map(|t| {
                Arc::new(FileIdentity {
                    root: root.clone(),
                    tier: t.clone(),
                    switch: switch.clone(),
                    rule: rule.clone(),
                    codec: Codec::Lz4,
                    compression_level: 1,
                })
            })
            .collect();
        let mut w = Self {
            root,
            ids,
            rule,
            stores,
            sessions: HashMap::new(),
            seq: 0,
            budget,
            idle: Duration::from_secs(5),
            max_sessions: cfg.max_sessions.max(1),
            memory_budget: usize::try_from(cfg.memory_budget_bytes).unwrap_or(usize::MAX),
            last_age_scan: Instant::now(),
            totals,
            c: None,
            log_err: LogLimiter::new(Duration::from_secs(10)),
        };
        w.enforce(true);
        Ok(w)
    }

    /// The tiers.
    pub fn tiers(&self) -> Vec<Tier> {
        self.ids.iter().map(|i| i.tier.clone()).collect()
    }

    /// The data directory.
    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    /// Figures so far.
    pub fn totals(&self) -> &WriterTotals {
        &self.totals
    }

    /// Bytes the open files and accumulators hold.
    pub fn memory(&self) -> usize {
        self.sessions
            .values()
            .flat_map(|s| s.files.iter().flatten())
            .map(TierFile::memory)
            .sum()
    }

    /// Takes one batch: every sample goes into its session's accumulator; closed intervals go
    /// into the tiers.
    pub fn push(&mut self, batch: &CounterBatch) {
        if batch.rows() == 0 {
            return;
        }
        self.with_session(&batch.schema, |acc, done| acc.push(batch, done));
        if let Some(c) = &self.c {
            c.samples_done.add(batch.samples() as u64);
        }
    }

    /// Takes rows of `schema` given as row-major `values` at `ts`, with optional per-value
    /// validity (the rebuild from raw files).
    pub fn push_rows(
        &mut self,
        schema: &Arc<SessionSchema>,
        ts: &[i64],
        values: &[u64],
        valid: Option<&[bool]>,
    ) {
        if ts.is_empty() {
            return;
        }
        self.with_session(schema, |acc, done| acc.push_rows(ts, values, valid, done));
    }

    fn with_session(
        &mut self,
        schema: &Arc<SessionSchema>,
        feed: impl FnOnce(&mut Accumulator, &mut dyn FnMut(IntervalRow)),
    ) {
        let key = (schema.profile.clone(), schema.group.clone());
        let changed = self
            .sessions
            .get(&key)
            .is_some_and(|s| !Arc::ptr_eq(&s.plan.schema, schema) && *s.plan.schema != **schema);
        if changed {
            if let Some(s) = self.sessions.remove(&key) {
                self.finish_session(s);
            }
        }
        if !self.sessions.contains_key(&key) && self.sessions.len() >= self.max_sessions {
            let lru = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.last_batch)
                .map(|(k, _)| k.clone());
            if let Some(s) = lru.and_then(|k| self.sessions.remove(&k)) {
                self.totals.evicted_sessions += 1;
                if let Some(c) = &self.c {
                    c.evicted_sessions.add(1);
                }
                self.finish_session(s);
            }
        }
        let s = match self.sessions.get_mut(&key) {
            Some(s) => s,
            None => {
                let plan = Arc::new(Plan::new(schema));
                let layout = Arc::new(Layout::new(&plan, &self.rule));
                let acc =
                    Accumulator::new(Arc::clone(&plan), self.ids[0].tier.interval_ns, &self.rule);
                self.sessions.entry(key.clone()).or_insert(SessionTiers {
                    pending: vec![None; self.ids.len()],
                    files: (0..self.ids.len()).map(|_| None).collect(),
                    plan,
                    layout,
                    acc,
                    last_batch: Instant::now(),
                })
            }
        };
        s.last_batch = Instant::now();
        let mut closed = Vec::new();
        feed(&mut s.acc, &mut |r| closed.push(r));
        let any = !closed.is_empty();
        for r in closed {
            self.take_row(&key, r);
        }
        if any {
            self.keep_budget();
        }
    }

    /// Publishes the open files that were opened first while they hold more than the memory
    /// budget (early, smaller files; nothing is lost).
    fn keep_budget(&mut self) {
        while self.memory() > self.memory_budget {
            let oldest =
                self.sessions
                    .iter()
                    .flat_map(|(k, s)| {
                        s.files.iter().enumerate().filter_map(move |(i, f)| {
                            f.as_ref().map(|f| (f.first_ns, k.clone(), i))
                        })
                    })
                    .min();
            let Some((_, k, i)) = oldest else { return };
            let Some(f) = self.sessions.get_mut(&k).and_then(|s| s.files[i].take()) else {
                return;
            };
            self.totals.memory_flushes += 1;
            if let Some(c) = &self.c {
                c.memory_flushes.add(1);
            }
            self.publish(i, f);
        }
    }

    /// A closed finest-tier row of session `key`: into tier 0, absorbed into the coarser ones.
    fn take_row(&mut self, key: &(String, String), row: IntervalRow) {
        let n = self.ids.len();
        let mut out: Vec<(usize, IntervalRow)> = Vec::new();
        if let Some(s) = self.sessions.get_mut(key) {
            for i in 1..n {
                let iv = self.ids[i].tier.interval_ns;
                let start = row.start_ns.div_euclid(iv) * iv;
                match &mut s.pending[i] {
                    // Finer rows of the same coarse interval, in time order.
                    Some((p, last)) if p.start_ns == start && row.start_ns > *last => {
                        p.absorb(&row);
                        *last = row.start_ns;
                    }
                    slot => {
                        if let Some((done, _)) = slot.take() {
                            out.push((i, done));
                        }
                        let mut p = row.clone();
                        p.start_ns = start;
                        *slot = Some((p, row.start_ns));
                    }
                }
            }
        }
        self.write_row(key, 0, &row);
        for (i, r) in out {
            self.write_row(key, i, &r);
        }
    }

    /// Appends `row` to tier `i`'s open file of session `key` (rotating as needed).
    fn write_row(&mut self, key: &(String, String), i: usize, row: &IntervalRow) {
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        let rotate = s.files[i].as_ref().is_some_and(|f| !f.takes(row));
        if rotate {
            if let Some(f) = s.files[i].take() {
                self.publish(i, f);
            }
        }
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        let f = s.files[i].get_or_insert_with(|| {
            TierFile::new(
                Arc::clone(&s.plan),
                Arc::clone(&s.layout),
                Arc::clone(&self.ids[i]),
                row.start_ns,
            )
        });
        f.push(row);
    }

    fn publish(&mut self, i: usize, f: TierFile) {
        match f.publish(&mut self.seq) {
            Ok(Some(p)) => self.published(i, p),
            Ok(None) => {}
            Err(e) => {
                self.totals.write_errors += 1;
                if let Some(c) = &self.c {
                    c.write_errors.add(1);
                }
                if let Some(n) = self.log_err.allow() {
                    tracing::error!(tier = %self.ids[i].tier.name, error = %e, suppressed = n,
                        "Cannot write a rollup file; those intervals of the tier are lost.");
                }
            }
        }
    }

    fn published(&mut self, i: usize, p: Published) {
        self.totals.rows[i] += p.rows;
        self.totals.bytes[i] += p.bytes;
        self.totals.files += 1;
        if let Some(c) = &self.c {
            c.files_published.add(1);
            c.rows_written.add(p.rows);
            c.bytes_published.add(p.bytes);
        }
        tracing::debug!(path = %p.path.display(), rows = p.rows, bytes = p.bytes, "Published a rollup file.");
        self.stores[i]
            .history
            .insert(p.name.first_ns, p.path, p.bytes, data_time(p.data_end_ns));
        self.enforce(false);
    }

    /// Tier retention (bytes always, age when `age`), then the tiers' total into the budget.
    fn enforce(&mut self, age: bool) {
        for st in &mut self.stores {
            let lim = Limits {
                max_bytes: st.tier.retention_max_bytes,
                max_age_s: st.tier.retention_max_age_s,
            };
            let d = st.history.enforce(lim, age, "a rollup file");
            self.totals.retention_files += d.files;
            self.totals.retention_bytes += d.bytes;
            if let Some(c) = &self.c {
                c.retention_files.add(d.files);
                c.retention_bytes.add(d.bytes);
            }
        }
        let held = self.stores.iter().map(|s| s.history.bytes()).sum();
        if let Some(b) = &self.budget.0 {
            b.set_tier_bytes(held);
        }
        if let Some(c) = &self.c {
            c.tier_bytes.set(held);
        }
    }

    /// Bytes each tier holds on disk now.
    pub fn tier_bytes(&self) -> Vec<u64> {
        self.stores.iter().map(|s| s.history.bytes()).collect()
    }

    /// Periodic work: close the open interval of sessions idle for a while (their rows become
    /// writable), age retention once a second.
    pub fn tick(&mut self) {
        let idle: Vec<(String, String)> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.last_batch.elapsed() >= self.idle)
            .map(|(k, _)| k.clone())
            .collect();
        for k in idle {
            let mut closed = Vec::new();
            if let Some(s) = self.sessions.get_mut(&k) {
                s.acc.close(&mut |r| closed.push(r));
            }
            for r in closed {
                self.take_row(&k, r);
            }
        }
        if self.last_age_scan.elapsed() >= Duration::from_secs(1) {
            self.last_age_scan = Instant::now();
            self.enforce(true);
        }
    }

    /// Closes one session: its open interval, pending coarse rows, open files (published).
    fn finish_session(&mut self, mut s: SessionTiers) {
        let key = (s.plan.schema.profile.clone(), s.plan.schema.group.clone());
        let mut closed = Vec::new();
        s.acc.close(&mut |r| closed.push(r));
        self.sessions.insert(key.clone(), s);
        for r in closed {
            self.take_row(&key, r);
        }
        let Some(mut s) = self.sessions.remove(&key) else {
            return;
        };
        let pending: Vec<(usize, IntervalRow)> = s
            .pending
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| p.take().map(|(r, _)| (i, r)))
            .collect();
        self.sessions.insert(key.clone(), s);
        for (i, r) in pending {
            self.write_row(&key, i, &r);
        }
        if let Some(mut s) = self.sessions.remove(&key) {
            for (i, f) in s.files.iter_mut().enumerate() {
                if let Some(f) = f.take() {
                    self.publish(i, f);
                }
            }
        }
    }

    /// Closes every session and publishes every open file.
    pub fn finish(&mut self) {
        let keys: Vec<_> = self.sessions.keys().cloned().collect();
        for k in keys {
            if let Some(s) = self.sessions.remove(&k) {
                self.finish_session(s);
            }
        }
    }
}

/// `ns` since the epoch as a `SystemTime` (for data-age retention).
fn data_time(ns: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64)
}

fn batch_bytes(b: &CounterBatch) -> u64 {
    (b.values.len() * 8 + b.ts.len() * 8 + b.part_masks.len() * 4) as u64
}

/// The rollup sink. Decode threads call [`RollupSink::submit`]; the `stel-rollup` thread
/// accumulates and writes the tiers.
pub struct RollupSink {
    tx: Option<Sender<Arc<CounterBatch>>>,
    thread: Option<JoinHandle<RollupWriter>>,
    c: Arc<Counters>,
    when_full: WhenFull,
    block_timeout: Duration,
    shed_log: SharedLogLimiter,
    tiers: Vec<Tier>,
    final_totals: Option<WriterTotals>,
}

impl fmt::Debug for RollupSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RollupSink")
            .field("tiers", &self.tiers)
            .finish_non_exhaustive()
    }
}

impl RollupSink {
    /// Validates `cfg`, recovers the tiers under `root` and starts the rollup thread.
    ///
    /// # Errors
    /// An invalid config, an uncreatable root, or no thread.
    /// `switch`: the name written into the files (the Parquet sink's `switch_name`), else the
    /// host name.
    pub fn start(
        cfg: &RollupConfig,
        root: PathBuf,
        switch: Option<String>,
        budget: BudgetHandle,
        registry: Option<&Arc<Registry>>,
    ) -> Result<Self, Error> {
        let switch = switch.unwrap_or_else(crate::parquet::writer::host_name);
        crate::durable::create_dirs(&root).map_err(|source| Error::CreateDir {
            path: root.clone(),
            source,
        })?;
        let mut w = RollupWriter::new(cfg, root, switch, budget)?;
        let c = Arc::new(Counters::new(registry));
        c.stale_temp_files.add(w.totals.stale_temp_files);
        c.tier_bytes.set(w.tier_bytes().iter().sum());
        w.c = Some(Arc::clone(&c));
        let tiers = w.tiers();
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue_batches);
        let wc = Arc::clone(&c);
        let thread = std::thread::Builder::new()
            .name("stel-rollup".into())
            .spawn(move || run(w, rx, wc))
            .map_err(Error::Spawn)?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            c,
            when_full: cfg.when_full,
            block_timeout: Duration::from_millis(cfg.block_timeout_ms),
            shed_log: SharedLogLimiter::new(Duration::from_secs(10)),
            tiers,
            final_totals: None,
        })
    }

    /// The tiers written.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// Hands a batch to the rollup thread; never waits with `drop_newest`. A shed batch is
    /// counted by reason (its samples become a gap the tiers report as `lost`).
    ///
    /// # Errors
    /// The reason the batch was shed.
    pub fn submit(&self, batch: Arc<CounterBatch>) -> Result<(), ShedReason> {
        let samples = batch.samples() as u64;
        self.c.batches_submitted.add(1);
        self.c.samples_submitted.add(samples);
        if batch.rows() == 0 {
            return Ok(());
        }
        let bytes = batch_bytes(&batch);
        let queued = self.c.queued_bytes.add(bytes) + bytes;
        let r = match (&self.tx, self.when_full) {
            (None, _) => Err(ShedReason::Closed),
            (Some(tx), WhenFull::DropNewest) => tx.try_send(batch).map_err(|e| match e {
                TrySendError::Full(_) => ShedReason::QueueFull,
                TrySendError::Disconnected(_) => ShedReason::Closed,
            }),
            (Some(tx), WhenFull::Block) => {
                tx.send_timeout(batch, self.block_timeout)
                    .map_err(|e| match e {
                        SendTimeoutError::Timeout(_) => ShedReason::QueueTimeout,
                        SendTimeoutError::Disconnected(_) => ShedReason::Closed,
                    })
            }
        };
        match r {
            Ok(()) => {
                self.c.batches_queued.add(1);
                self.c.queued_bytes_peak.max(queued);
                Ok(())
            }
            Err(reason) => {
                self.c.queued_bytes.sub(bytes);
                let (b, s) = match reason {
                    ShedReason::QueueTimeout => {
                        (&self.c.shed_timeout_batches, &self.c.shed_timeout_samples)
                    }
                    ShedReason::Closed => {
                        (&self.c.shed_closed_batches, &self.c.shed_closed_samples)
                    }
                    _ => (&self.c.shed_full_batches, &self.c.shed_full_samples),
                };
                b.add(1);
                s.add(samples);
                if self.shed_log.allow() {
                    tracing::warn!(
                        reason = reason.as_str(),
                        samples,
                        "Rollup sink shed a batch; the tiers show it as lost snapshots."
                    );
                }
                Err(reason)
            }
        }
    }

    /// The counters now (`stel_sink_*{sink="rollup"}`).
    pub fn stats(&self) -> Snapshot {
        self.c.registry.snapshot()
    }

    /// Stops taking batches, rolls up everything queued, publishes every open file.
    ///
    /// # Errors
    /// Only if the rollup thread panicked.
    pub fn shutdown(mut self) -> Result<(Snapshot, WriterTotals), Error> {
        self.stop()?;
        Ok((self.stats(), self.final_totals.take().unwrap_or_default()))
    }

    fn stop(&mut self) -> Result<(), Error> {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let w = t.join().map_err(|_| Error::Panicked)?;
            self.final_totals = Some(w.totals.clone());
        }
        Ok(())
    }
}

impl Drop for RollupSink {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "Rollup sink did not stop cleanly.");
        }
    }
}

fn run(mut w: RollupWriter, rx: Receiver<Arc<CounterBatch>>, c: Arc<Counters>) -> RollupWriter {
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(batch) => {
                c.batches_dequeued.add(1);
                c.queued_bytes.sub(batch_bytes(&batch));
                w.push(&batch);
                crate::batch::release(batch);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        w.tick();
    }
    w.finish();
    w
}
