//! The INT writer thread: one open part per (table, switch), split at hour boundaries, atomic
//! publish (temp file → fsync → rename → fsync dir), recovery of a killed writer's temp files,
//! retention over the `table=` tree. Lives entirely on the sink's thread.

use crate::durable::{fsync_dir, is_disk_full};
use std::{
    collections::{hash_map::Entry, HashMap, HashSet},
    fs::{self, File},
    io::{self, BufWriter},
    sync::{atomic::Ordering::Relaxed, Arc},
    time::{Duration, Instant, SystemTime},
};

use ::parquet::file::metadata::KeyValue;

use super::{
    encode::{file_properties, Codecs, IntFile},
    stats::Counters,
    tree::for_each_file,
    IntBatch, IntSinkConfig, Piece, Table, NS_PER_HOUR,
};
use crate::{
    log_limit::LogLimiter,
    parquet::{chunk::EncodeOptions, keys},
    paths::{PartName, PartPaths, TableDir, TableEntry},
    retention::{History, Limits},
};

struct OpenPart {
    paths: PartPaths,
    writer: IntFile<BufWriter<File>>,
    opened: Instant,
    hour_start_ns: i64,
    first_ns: i64,
    last_ns: i64,
    rows: u64,
}

/// Write buffer per open file: row groups reach it as whole pages, so a small buffer costs no
/// extra syscalls worth measuring, and `3 × max_switches` of them stay small.
const WRITE_BUFFER: usize = 64 << 10;

impl OpenPart {
    /// Bytes this open file holds in memory: its unfinished row group and its write buffer.
    fn memory(&self) -> u64 {
        (self.writer.memory() + WRITE_BUFFER) as u64
    }
}

/// (table, switch id)
type Key = (Table, u32);

pub(crate) struct Writer {
    cfg: IntSinkConfig,
    c: Arc<Counters>,
    parts: HashMap<Key, OpenPart>,
    /// Switches being written (at most `max_switches`) and when rows of each last arrived. A
    /// switch keeps its slot while its files rotate (hour, size, age) and gives it up once idle
    /// for `idle_publish_ms`.
    switches: HashMap<u32, Instant>,
    /// New switch ids that may still be admitted now (token bucket: `max_switches` at most,
    /// refilled at `new_switches_per_s`), and when it was last refilled.
    admit_tokens: f64,
    admit_refilled: Instant,
    log_refused: LogLimiter,
    seq: u32,
    history: History,
    paused_until: Option<Instant>,
    /// A batch's rows regrouped per (table, switch, hour) when it mixes switches (buffers
    /// kept from batch to batch: as big as the largest batch so far).
    regrouped: IntBatch,
    /// Per table (`Table::ALL` order), whether compressing each column pays: shared by the
    /// table's files, so a new file does not try the codec where the others found it useless.
    codecs: [Codecs; 3],
    last_retention: Instant,
    log_err: LogLimiter,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntWriter")
            .field("open_parts", &self.parts.len())
            .finish_non_exhaustive()
    }
}

impl Writer {
    pub(crate) fn new(cfg: IntSinkConfig, c: Arc<Counters>) -> Self {
        Self {
            admit_tokens: cfg.max_switches as f64,
            cfg,
            c,
            parts: HashMap::new(),
            switches: HashMap::new(),
            admit_refilled: Instant::now(),
            log_refused: LogLimiter::new(Duration::from_secs(10)),
            seq: 0,
            history: History::default(),
            paused_until: None,
            regrouped: IntBatch::default(),
            codecs: Table::ALL.map(Codecs::new),
            last_retention: Instant::now(),
            log_err: LogLimiter::new(Duration::from_secs(10)),
        }
    }

    /// Removes temporary parts under `table=` (a killed writer's), indexes published ones.
    pub(crate) fn recover(&mut self) {
        let root = self.cfg.dir.clone();
        for_each_file(&root, None, |path, entry, md| match entry {
            TableEntry::Temp { .. } => {
                if fs::remove_file(&path).is_ok() {
                    self.c.stale_temp_files_removed.fetch_add(1, Relaxed);
                    self.c.stale_temp_bytes_removed.fetch_add(md.len(), Relaxed);
                }
            }
            TableEntry::Part { name, .. } => {
                let published = md.modified().unwrap_or_else(|_| SystemTime::now());
                self.history
                    .insert(name.first_ns, path, md.len(), published);
            }
            TableEntry::Other => {}
        });
        let stale = self.c.stale_temp_files_removed.load(Relaxed);
        if stale > 0 {
            tracing::warn!(
                stale_temp_files = stale,
                "The previous run stopped without publishing INT parts; their rows are lost."
            );
        }
        self.c.history_bytes.store(self.history.bytes(), Relaxed);
        self.enforce_retention(true);
    }

    pub(crate) fn push(&mut self, batch: IntBatch) {
        let now = Instant::now();
        // Rows are grouped by (table, switch, hour) and encoded straight from the batch's
        // column buffers (one pass over each column per file, no Arrow arrays in between).
        let mut regrouped = std::mem::take(&mut self.regrouped);
        let pieces = batch.split(&mut regrouped);
        // Switches without a slot: decided once per switch and batch from the groups (no
        // pass over the rows); their pieces are not written.
        let groups: Vec<(u32, u64)> = pieces.iter().map(|p| (p.switch, p.len() as u64)).collect();
        let refused = self.admit(&groups, now);
        for piece in pieces {
            let rows = piece.len() as u64;
            if rows == 0 || refused.contains(&piece.switch) {
                continue;
            }
            if let Some(until) = self.paused_until {
                if Instant::now() < until {
                    self.c.lost_write_error_rows.fetch_add(rows, Relaxed);
                    continue;
                }
                self.paused_until = None;
            }
            self.write_piece(&piece);
        }
        regrouped.clear();
        self.regrouped = regrouped;
        batch.recycle();
        self.update_memory();
    }

    /// Decides, for the (switch, rows) groups of a batch in order, which switches have a slot
    /// or get one (a free slot and an admission token, in order of first appearance), and
    /// returns the others, whose rows are not written: counted by reason (`switch_limit`: no
    /// free slot; `switch_rate`: new ids faster than `new_switches_per_s`; one refusal per
    /// switch id per batch) and logged at most every 10 s. A batch of made-up ids costs its
    /// grouping and regroup (bounded by the batch), nothing per id beyond.
    fn admit(&mut self, groups: &[(u32, u64)], now: Instant) -> HashSet<u32> {
        let max = self.cfg.max_switches;
        let elapsed = now.saturating_duration_since(self.admit_refilled);
        self.admit_refilled = now;
        self.admit_tokens = (self.admit_tokens
            + elapsed.as_secs_f64() * self.cfg.new_switches_per_s)
            .min(max as f64);
        let mut refused: HashSet<u32> = HashSet::new();
        let (mut no_slot, mut too_fast) = (0u64, 0u64);
        // One map lookup per run of rows of the same switch.
        let mut last: Option<(u32, Verdict)> = None;
        let switches = &mut self.switches;
        let tokens = &mut self.admit_tokens;
        let mut verdict = |switch: u32| -> Verdict {
            if let Some((s, v)) = last {
                if s == switch {
                    return v;
                }
            }
            let free = switches.len() < max;
            let v = match switches.entry(switch) {
                Entry::Occupied(mut e) => {
                    e.insert(now);
                    Verdict::Keep
                }
                Entry::Vacant(_) if !free => Verdict::NoSlot,
                Entry::Vacant(_) if *tokens < 1.0 => Verdict::TooFast,
                Entry::Vacant(e) => {
                    *tokens -= 1.0;
                    e.insert(now);
                    Verdict::Keep
                }
            };
            if v != Verdict::Keep {
                refused.insert(switch);
            }
            last = Some((switch, v));
            v
        };
        for &(switch, rows) in groups {
            match verdict(switch) {
                Verdict::Keep => {}
                Verdict::NoSlot => no_slot += rows,
                Verdict::TooFast => too_fast += rows,
            }
        }
        if refused.is_empty() {
            return refused;
        }
        self.c.shed_switch_limit_rows.fetch_add(no_slot, Relaxed);
        self.c.shed_switch_rate_rows.fetch_add(too_fast, Relaxed);
        self.c
            .switch_refusals
            .fetch_add(refused.len() as u64, Relaxed);
        if let Some(n) = self.log_refused.allow_at(now) {
            tracing::warn!(
                switch_ids = refused.len(),
                rows_no_slot = no_slot,
                rows_too_fast = too_fast,
                max_switches = max,
                new_switches_per_s = self.cfg.new_switches_per_s,
                suppressed = n,
                "INT: rows of new switch ids refused: max_switches switches are being written, or new ids arrive faster than new_switches_per_s (a slot frees when a switch sends nothing for idle_publish_ms; raise int.parquet.max_switches for a larger fleet, or set [int.filter] senders if the ids are made up)."
            );
        }
        refused
    }

    fn write_piece(&mut self, piece: &Piece<'_>) {
        let (table, switch, hour_start) = (piece.table, piece.switch, piece.hour * NS_PER_HOUR);
        let key = (table, switch);
        let rows = piece.len() as u64;
        let (first, last) = piece.ts_range().unwrap_or((hour_start, hour_start));
        if self
            .parts
            .get(&key)
            .is_some_and(|p| p.hour_start_ns != hour_start)
        {
            self.publish(key, Rotation::Hour);
        }
        if !self.parts.contains_key(&key) {
            match self.open_part(table, switch, first, hour_start) {
                Ok(p) => {
                    self.parts.insert(key, p);
                }
                Err(e) => {
                    self.failed(None, rows, e.as_ref());
                    return;
                }
            }
        }
        let Some(p) = self.parts.get_mut(&key) else {
            return;
        };
        if let Err(e) = p.writer.write(piece) {
            let p = self.parts.remove(&key);
            self.failed(p, rows, &e);
            return;
        }
        p.rows += rows;
        p.first_ns = p.first_ns.min(first);
        p.last_ns = p.last_ns.max(last);
        let size = (p.writer.bytes_written() + p.writer.in_progress_size()) as u64;
        if size >= self.cfg.max_file_bytes {
            self.publish(key, Rotation::Size);
        }
    }

    fn open_part(
        &mut self,
        table: Table,
        switch: u32,
        first_ns: i64,
        hour_start_ns: i64,
    ) -> Result<OpenPart, Box<dyn std::error::Error + Send + Sync>> {
        let partition =
            TableDir::new(&self.cfg.dir, table.name(), &switch.to_string()).partition(first_ns);
        crate::durable::create_dirs(partition.as_path())?;
        let (paths, file) = loop {
            let paths = partition.part(PartName::new(first_ns, self.seq));
            self.seq = (self.seq + 1) % (crate::paths::MAX_SEQ + 1);
            if paths.published.exists() {
                continue;
            }
            match crate::durable::create_history_file(&paths.temp) {
                Ok(f) => break (paths, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let kv = |k: &str, v: String| KeyValue::new(k.to_string(), v);
        let props = file_properties(vec![
            kv(super::TABLE_KEY, table.name().to_string()),
            kv(keys::SWITCH, switch.to_string()),
            kv(keys::VERSION, env!("CARGO_PKG_VERSION").to_string()),
        ]);
        let writer = match IntFile::try_new(
            BufWriter::with_capacity(WRITE_BUFFER, file),
            &table.schema(),
            props,
            EncodeOptions::from(&self.cfg),
            &self.codecs[table as usize],
        ) {
            Ok(w) => w,
            Err(e) => {
                let _ = fs::remove_file(&paths.temp);
                return Err(e.into());
            }
        };
        Ok(OpenPart {
            paths,
            writer,
            opened: Instant::now(),
            hour_start_ns,
            first_ns,
            last_ns: first_ns,
            rows: 0,
        })
    }

    fn failed(&mut self, part: Option<OpenPart>, rows: u64, e: &(dyn std::error::Error + 'static)) {
        let mut lost = rows;
        if let Some(p) = part {
            lost += p.rows;
            drop(p.writer);
            let _ = fs::remove_file(&p.paths.temp);
        }
        if is_disk_full(e) {
            self.c.lost_disk_full_rows.fetch_add(lost, Relaxed);
        } else {
            self.c.lost_write_error_rows.fetch_add(lost, Relaxed);
        }
        self.c.write_errors.fetch_add(1, Relaxed);
        self.paused_until =
            Some(Instant::now() + Duration::from_millis(self.cfg.retry_interval_ms));
        if let Some(n) = self.log_err.allow() {
            tracing::error!(error = %e, lost_rows = lost, suppressed = n, "INT Parquet write failed; rows not written, retrying after the retry interval.");
        }
    }

    fn publish(&mut self, key: Key, why: Rotation) {
        let Some(mut p) = self.parts.remove(&key) else {
            return;
        };
        let kv = |k: &str, v: String| KeyValue::new(k.to_string(), v);
        p.writer
            .append_key_value_metadata(kv(keys::FIRST_NS, p.first_ns.to_string()));
        p.writer
            .append_key_value_metadata(kv(keys::LAST_NS, p.last_ns.to_string()));
        p.writer
            .append_key_value_metadata(kv(keys::ROWS, p.rows.to_string()));
        let (paths, rows) = (p.paths.clone(), p.rows);
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
                self.c.files_published.fetch_add(1, Relaxed);
                self.c.bytes_published.fetch_add(bytes, Relaxed);
                self.c.rows_written.fetch_add(rows, Relaxed);
                match why {
                    Rotation::Hour => self.c.rotations_hour.fetch_add(1, Relaxed),
                    Rotation::Size => self.c.rotations_size.fetch_add(1, Relaxed),
                    Rotation::Age => self.c.rotations_age.fetch_add(1, Relaxed),
                    Rotation::Idle => self.c.rotations_idle.fetch_add(1, Relaxed),
                    Rotation::Shutdown => 0,
                };
                self.history.insert(
                    paths.name.first_ns,
                    paths.published,
                    bytes,
                    SystemTime::now(),
                );
                self.c.history_bytes.store(self.history.bytes(), Relaxed);
                self.enforce_retention(false);
            }
            Err(e) => {
                let _ = fs::remove_file(&paths.temp);
                self.failed(None, rows, e.as_ref());
            }
        }
    }

    /// Publishes the writer's memory (open parts' buffers and unfinished row groups) and, when
    /// it is above half the memory budget, flushes the largest row groups until it is below a
    /// quarter (the files stay open; their row groups are on disk).
    fn update_memory(&mut self) {
        let mut m: u64 = self.parts.values().map(OpenPart::memory).sum();
        let budget = self.cfg.memory_budget_bytes;
        if m > budget / 2 {
            let mut by_size: Vec<(u64, Key)> =
                self.parts.iter().map(|(k, p)| (p.memory(), *k)).collect();
            by_size.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
            for (_, key) in by_size {
                if m <= budget / 4 {
                    break;
                }
                let Some(p) = self.parts.get_mut(&key) else {
                    continue;
                };
                let before = p.memory();
                self.c.budget_row_group_flushes.fetch_add(1, Relaxed);
                if let Err(e) = p.writer.flush() {
                    let p = self.parts.remove(&key);
                    self.failed(p, 0, &e);
                    m = m.saturating_sub(before);
                    continue;
                }
                m = m.saturating_sub(before) + p.memory();
            }
        }
        self.c.writer_bytes.store(m, Relaxed);
        self.c.open_files.store(self.parts.len() as u64, Relaxed);
        self.c
            .open_switches
            .store(self.switches.len() as u64, Relaxed);
    }

    /// Publishes parts due by age and the parts of idle switches (not while `backlog`: batches
    /// waiting in the queue may hold their rows), and enforces retention.
    pub(crate) fn tick(&mut self, backlog: bool) {
        let now = Instant::now();
        let idle = self.cfg.idle_publish();
        let quiet: Vec<u32> = self
            .switches
            .iter()
            .filter(|(_, &last)| !backlog && now.saturating_duration_since(last) >= idle)
            .map(|(s, _)| *s)
            .collect();
        for s in quiet {
            self.switches.remove(&s);
            for t in Table::ALL {
                self.publish((t, s), Rotation::Idle);
            }
        }
        let max_age = self.cfg.flush_interval();
        let due: Vec<Key> = self
            .parts
            .iter()
            .filter(|(_, p)| now.duration_since(p.opened) >= max_age)
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            self.publish(k, Rotation::Age);
        }
        if now.duration_since(self.last_retention) >= Duration::from_secs(1) {
            self.last_retention = now;
            self.enforce_retention(true);
        }
        self.update_memory();
    }

    pub(crate) fn next_deadline(&self) -> Duration {
        let now = Instant::now();
        let (max_age, idle) = (self.cfg.flush_interval(), self.cfg.idle_publish());
        let age = self
            .parts
            .values()
            .map(|p| (p.opened + max_age).saturating_duration_since(now));
        let quiet = self
            .switches
            .values()
            .map(|&last| (last + idle).saturating_duration_since(now));
        age.chain(quiet)
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1))
    }

    pub(crate) fn close_all(&mut self) {
        let keys: Vec<Key> = self.parts.keys().copied().collect();
        for k in keys {
            self.publish(k, Rotation::Shutdown);
        }
        self.switches.clear();
        self.update_memory();
    }

    fn enforce_retention(&mut self, age: bool) {
        let limits = Limits {
            max_bytes: self.cfg.retention_max_bytes,
            max_age_s: self.cfg.retention_max_age_s,
        };
        let d = self.history.enforce(limits, age, "an INT file");
        self.c.retention_files_deleted.fetch_add(d.files, Relaxed);
        self.c.retention_bytes_deleted.fetch_add(d.bytes, Relaxed);
        self.c.history_bytes.store(self.history.bytes(), Relaxed);
    }
}

/// What [`Writer::admit`] decided for a switch id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Keep,
    NoSlot,
    TooFast,
}

#[derive(Debug, Clone, Copy)]
enum Rotation {
    Hour,
    Size,
    Age,
    Idle,
    Shutdown,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{int::IntSink, paths::UtcHour};

    fn batch(rows: &[(i64, u32, u32)]) -> IntBatch {
        let mut b = IntBatch::with_capacity(rows.len(), 0);
        for &(ts, sw, seq) in rows {
            b.hops
                .row(ts, sw)
                .seq(Some(seq))
                .report_index(Some(0))
                .hop_index(Some(0))
                .node_id(Some(sw))
                .done();
        }
        b
    }

    #[test]
    fn per_switch_and_hour_files_published_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let t = 1_700_000_000_000_000_000i64; // 2023-11-14T22:13:20Z
        let next_hour = UtcHour::next_start_ns(t);
        // A stale temp file of a killed writer is removed at start.
        let stale = TableDir::new(dir.path(), "int_hops", "1")
            .partition(t)
            .part(PartName::new(t, 99));
        fs::create_dir_all(stale.temp.parent().unwrap()).unwrap();
        fs::write(&stale.temp, b"junk").unwrap();
        let sink = IntSink::start(IntSinkConfig::for_test(dir.path())).unwrap();
        sink.submit(batch(&[(t, 1, 10), (t + 1, 2, 20), (next_hour, 1, 11)]))
            .unwrap();
        let st = sink.shutdown().unwrap();
        assert_eq!(st.stale_temp_files_removed, 1);
        assert_eq!(st.rows_submitted, 3);
        assert_eq!(st.rows_written, 3);
        assert_eq!(st.files_published, 3);
        let mut found: Vec<String> = crate::paths::published_parts(dir.path())
            .into_iter()
            .map(|(rel, ..)| rel.rsplit_once('/').unwrap().0.to_string())
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                "table=int_hops/switch=1/date=2023-11-14/hour=22",
                "table=int_hops/switch=1/date=2023-11-14/hour=23",
                "table=int_hops/switch=2/date=2023-11-14/hour=22",
            ]
        );
        assert!(!stale.temp.exists());
    }

    /// Polls the sink's counters until `ok` holds (the writer works on its own thread).
    fn wait_for(sink: &IntSink, what: &str, ok: impl Fn(&crate::int::IntSinkStats) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ok(&sink.stats()) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                sink.stats()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn new_switch_ids_past_max_switches_are_refused_until_one_goes_idle() {
        let dir = tempfile::tempdir().unwrap();
        let t = 1_700_000_000_000_000_000i64;
        let cfg = IntSinkConfig {
            max_switches: 2,
            new_switches_per_s: 1000.0,
            idle_publish_ms: 300,
            flush_interval_ms: 3_600_000,
            ..IntSinkConfig::for_test(dir.path())
        };
        let sink = IntSink::start(cfg).unwrap();
        // Switches 1 and 2 take the two slots; switch 3's rows are refused, counted.
        sink.submit(batch(&[(t, 1, 1), (t, 2, 1), (t, 3, 1), (t + 1, 3, 2)]))
            .unwrap();
        // (The refusal is counted before the batch is written, the gauges after.)
        wait_for(&sink, "the refusal and the files", |s| {
            s.switch_refusals == 1 && s.open_files == 2
        });
        let s = sink.stats();
        assert_eq!(s.shed_switch_limit_rows, 2);
        assert_eq!(s.open_switches, 2);
        assert_eq!(s.open_files, 2);
        // Switch 1 keeps writing, its slot stays; switch 2 goes quiet and is published.
        let mut n = 2;
        let deadline = Instant::now() + Duration::from_secs(10);
        while sink.stats().rotations_idle == 0 {
            sink.submit(batch(&[(t + n, 1, n as u32)])).unwrap();
            n += 1;
            std::thread::sleep(Duration::from_millis(20));
            assert!(Instant::now() < deadline, "{:?}", sink.stats());
        }
        wait_for(&sink, "switch 2's slot", |s| s.open_switches == 1);
        assert_eq!(
            sink.stats().files_published,
            1,
            "switch 1's file stays open"
        );
        // Now switch 3 gets the free slot.
        sink.submit(batch(&[(t + n, 3, 3)])).unwrap();
        wait_for(&sink, "switch 3's slot", |s| s.open_switches == 2);
        let st = sink.shutdown().unwrap();
        assert_eq!(st.switch_refusals, 1);
        assert_eq!(
            st.rows_submitted,
            st.rows_written + st.shed_rows() + st.lost_rows(),
            "{st:?}"
        );
        assert_eq!(st.rows_written, st.rows_submitted - 2);
        assert_eq!(st.open_switches, 0);
        assert_eq!(st.open_files, 0);
    }

    #[test]
    fn new_switch_ids_beyond_the_admission_rate_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let t = 1_700_000_000_000_000_000i64;
        let cfg = IntSinkConfig {
            max_switches: 4,
            new_switches_per_s: 0.001,
            idle_publish_ms: 100,
            ..IntSinkConfig::for_test(dir.path())
        };
        let sink = IntSink::start(cfg).unwrap();
        // The burst: four ids at once take the four slots (and tokens).
        sink.submit(batch(&[(t, 1, 1), (t, 2, 1), (t, 3, 1), (t, 4, 1)]))
            .unwrap();
        wait_for(&sink, "four idle publishes", |s| s.rotations_idle == 4);
        // Slots are free again, but no new id may come in before the bucket refills.
        sink.submit(batch(&[(t, 5, 1), (t, 6, 1), (t + 1, 6, 2)]))
            .unwrap();
        wait_for(&sink, "the refusals", |s| s.switch_refusals == 2);
        // A switch that had a slot before is a new id again once it gave the slot up.
        sink.submit(batch(&[(t + 2, 1, 2)])).unwrap();
        wait_for(&sink, "the third refusal", |s| s.switch_refusals == 3);
        let st = sink.shutdown().unwrap();
        assert_eq!(st.shed_switch_rate_rows, 4, "{st:?}");
        assert_eq!(st.shed_switch_limit_rows, 0, "{st:?}");
        assert_eq!(st.rows_written, 4);
        assert_eq!(st.rows_submitted, st.rows_written + st.shed_rows());
    }
}
