//! The INT writer thread: one open part per (table, switch), split at hour boundaries, atomic
//! publish (temp file → fsync → rename → fsync dir), recovery of a killed writer's temp files,
//! retention over the `table=` tree. Lives entirely on the sink's thread.

use crate::durable::{fsync_dir, is_disk_full};
use std::{
    collections::HashMap,
    fs::{self, File},
    io::{self, BufWriter},
    path::PathBuf,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::{Duration, Instant, SystemTime},
};

use ::parquet::{arrow::ArrowWriter, file::metadata::KeyValue};
use arrow_array::{cast::AsArray, types::TimestampNanosecondType, RecordBatch};

use super::{sink::Counters, IntBatch, IntSinkConfig, Table, NS_PER_HOUR, TS_COLUMN};
use crate::{
    log_limit::LogLimiter,
    parquet::keys,
    paths::{classify_table, PartName, PartPaths, TableDir, TableEntry},
    retention::{History, Limits},
};

struct OpenPart {
    paths: PartPaths,
    writer: ArrowWriter<BufWriter<File>>,
    opened: Instant,
    hour_start_ns: i64,
    first_ns: i64,
    last_ns: i64,
    rows: u64,
}

/// (table, switch id)
type Key = (Table, u32);

pub(crate) struct Writer {
    cfg: IntSinkConfig,
    c: Arc<Counters>,
    parts: HashMap<Key, OpenPart>,
    seq: u32,
    history: History,
    paused_until: Option<Instant>,
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
            cfg,
            c,
            parts: HashMap::new(),
            seq: 0,
            history: History::default(),
            paused_until: None,
            last_retention: Instant::now(),
            log_err: LogLimiter::new(Duration::from_secs(10)),
        }
    }

    /// Removes temporary parts under `table=` (a killed writer's), indexes published ones.
    pub(crate) fn recover(&mut self) {
        let root = self.cfg.dir.clone();
        let mut stack: Vec<PathBuf> = match fs::read_dir(&root) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("table="))
                .map(|e| e.path())
                .collect(),
            Err(_) => Vec::new(),
        };
        while let Some(dir) = stack.pop() {
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                let path = e.path();
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(path);
                    continue;
                }
                let Ok(md) = e.metadata() else { continue };
                match classify_table(&root, &path) {
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
                }
            }
        }
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

    pub(crate) fn push(&mut self, mut batch: IntBatch) {
        // Rows are grouped by (table, switch, hour) before the transpose: one pass over the
        // rows, no column filtering afterwards.
        let pieces = match batch.finish_split() {
            Ok(t) => {
                batch.recycle();
                t
            }
            Err(e) => {
                self.c.write_errors.fetch_add(1, Relaxed);
                self.c
                    .lost_write_error_rows
                    .fetch_add(batch.rows() as u64, Relaxed);
                tracing::error!(error = %e, "INT batch could not become Arrow; rows lost.");
                return;
            }
        };
        for (table, switch, hour, rb) in pieces {
            if rb.num_rows() == 0 {
                continue;
            }
            if let Some(until) = self.paused_until {
                if Instant::now() < until {
                    self.c
                        .lost_write_error_rows
                        .fetch_add(rb.num_rows() as u64, Relaxed);
                    continue;
                }
                self.paused_until = None;
            }
            self.write_piece(table, switch, hour * NS_PER_HOUR, &rb);
        }
        self.update_memory();
    }

    fn write_piece(&mut self, table: Table, switch: u32, hour_start: i64, rb: &RecordBatch) {
        let key = (table, switch);
        let rows = rb.num_rows() as u64;
        let (first, last) = rb
            .column_by_name(TS_COLUMN)
            .map(|c| c.as_primitive::<TimestampNanosecondType>().values())
            .and_then(|ts| Some((*ts.iter().min()?, *ts.iter().max()?)))
            .unwrap_or((hour_start, hour_start));
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
        if let Err(e) = p.writer.write(rb) {
            let p = self.parts.remove(&key);
            self.failed(p, rows, &e);
            return;
        }
        p.rows += rows;
        p.first_ns = p.first_ns.min(first);
        p.last_ns = p.last_ns.max(last);
        if p.writer.in_progress_size() as u64 > self.cfg.memory_budget_bytes / 2 {
            self.c.budget_row_group_flushes.fetch_add(1, Relaxed);
            if let Err(e) = p.writer.flush() {
                let p = self.parts.remove(&key);
                self.failed(p, 0, &e);
                return;
            }
        }
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
        fs::create_dir_all(partition.as_path())?;
        let (paths, file) = loop {
            let paths = partition.part(PartName::new(first_ns, self.seq));
            self.seq = (self.seq + 1) % (crate::paths::MAX_SEQ + 1);
            if paths.published.exists() {
                continue;
            }
            match File::create_new(&paths.temp) {
                Ok(f) => break (paths, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let kv = |k: &str, v: String| KeyValue::new(k.to_string(), v);
        let props = self
            .cfg
            .writer_properties()
            .into_builder()
            .set_key_value_metadata(Some(vec![
                kv(super::TABLE_KEY, table.name().to_string()),
                kv(keys::SWITCH, switch.to_string()),
                kv(keys::VERSION, env!("CARGO_PKG_VERSION").to_string()),
            ]))
            .build();
        let writer = match ArrowWriter::try_new(
            BufWriter::with_capacity(1 << 20, file),
            table.schema(),
            Some(props),
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

    fn update_memory(&self) {
        let m: usize = self
            .parts
            .values()
            .map(|p| p.writer.in_progress_size())
            .sum();
        self.c.writer_bytes.store(m as u64, Relaxed);
    }

    pub(crate) fn tick(&mut self) {
        let now = Instant::now();
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
        let max_age = self.cfg.flush_interval();
        self.parts
            .values()
            .map(|p| (p.opened + max_age).saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1))
    }

    pub(crate) fn close_all(&mut self) {
        let keys: Vec<Key> = self.parts.keys().copied().collect();
        for k in keys {
            self.publish(k, Rotation::Shutdown);
        }
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

#[derive(Debug, Clone, Copy)]
enum Rotation {
    Hour,
    Size,
    Age,
    Shutdown,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{int::IntSink, paths::UtcHour};

    fn batch(rows: &[(i64, u32, u32)]) -> IntBatch {
        let mut b = IntBatch::with_capacity(rows.len(), 0);
        for &(ts, sw, seq) in rows {
            let mut h = crate::int::HopRow::new(ts, sw);
            h.seq(Some(seq))
                .flow_key(Some(1))
                .hop_index(Some(0))
                .node_id(Some(sw));
            b.hops.push(h);
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
}
