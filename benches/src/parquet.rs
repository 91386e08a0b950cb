//! Parquet workloads: realistic counter batches (emulator → IPFIX → decoder → `CounterBatch`),
//! the encoding sweep behind the sink's defaults, and the sink's end-to-end throughput.
//!
//! Everything here goes through the real path: the emulator's load model (steady, ramp,
//! microburst) encoded as seed-format IPFIX, decoded by `ingest::decode`, written by the same
//! `to_wide()` + `ArrowWriter` the sink uses (`ParquetSinkConfig::writer_properties`).

use std::{
    io::Write,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};
use stel_emu::{EmuConfig, Emulator, Pattern};

use parquet::arrow::ArrowWriter;
use stel_ingest::decode::CounterBatch;
use stel_store::{
    metrics::{Label, Metric, Snapshot},
    parquet::{accounting, Codec, CounterEncoding, ParquetSink, ParquetSinkConfig},
};

/// About `snapshots` design-rate snapshots (64 ports × 30 stats every 10 µs) of `pattern`,
/// decoded into batches as the daemon's decoder cuts them.
pub fn pattern_batches(pattern: Pattern, snapshots: usize) -> Vec<Arc<CounterBatch>> {
    let cfg = EmuConfig {
        pattern,
        ..EmuConfig::design()
    };
    let mut emu = Emulator::new(cfg).expect("design config is valid");
    let mut d = crate::design_decoder(&emu, None);
    let mut out = Vec::new();
    let mut msg = Vec::new();
    let mut made = 0;
    while made < snapshots {
        msg.clear();
        for _ in 0..64 {
            made += emu.data_message(&mut msg);
        }
        d.decode(&msg, &mut |b: CounterBatch| out.push(b));
    }
    d.flush(&mut |b: CounterBatch| out.push(b));
    out.into_iter().map(Arc::new).collect()
}

/// A copy of `b` with every timestamp moved by `shift_ns` (to feed the same counters again as
/// later time).
pub fn shifted(b: &CounterBatch, shift_ns: i64) -> CounterBatch {
    CounterBatch {
        schema: Arc::clone(&b.schema),
        ts: b.ts.iter().map(|t| t + shift_ns).collect(),
        values: b.values.clone(),
        part_masks: b.part_masks.clone(),
    }
}

/// Samples (counter values) in `batches`.
pub fn samples(batches: &[Arc<CounterBatch>]) -> u64 {
    batches.iter().map(|b| b.samples() as u64).sum()
}

/// One row of the encoding table.
#[derive(Debug, Clone)]
pub struct EncodeResult {
    pub label: String,
    pub pattern: Pattern,
    /// Bytes of the file less its fixed cost ([`fixed_file_bytes`]).
    pub bytes: u64,
    pub samples: u64,
    /// Single-thread encode rate (transpose + Parquet encode + compress), samples/s.
    pub samples_per_s: f64,
}

impl EncodeResult {
    pub fn bytes_per_sample(&self) -> f64 {
        self.bytes as f64 / self.samples as f64
    }
}

/// Encodes `batches` into one in-memory Parquet file with `cfg`'s writer properties; returns
/// (bytes, seconds).
pub fn encode_once(batches: &[Arc<CounterBatch>], cfg: &ParquetSinkConfig) -> (u64, f64) {
    let t = Instant::now();
    let buf = stel_store::parquet::encode_in_memory(batches, cfg).expect("in-memory encode");
    (buf.len() as u64, t.elapsed().as_secs_f64())
}

/// The same with parquet's generic `ArrowWriter` (what the sink used before its own column-chunk
/// encoder): the baseline for `ratio_vs_arrow_writer`.
pub fn encode_once_arrow_writer(
    batches: &[Arc<CounterBatch>],
    cfg: &ParquetSinkConfig,
) -> (u64, f64) {
    let schema = batches[0].schema.wide_arrow_schema();
    let t = Instant::now();
    let mut w = ArrowWriter::try_new(Vec::new(), schema, Some(cfg.writer_properties()))
        .expect("writer for a valid schema");
    for b in batches {
        w.write(&b.to_wide().expect("consistent batch"))
            .expect("in-memory write");
    }
    let buf = w.into_inner().expect("in-memory close");
    (buf.len() as u64, t.elapsed().as_secs_f64())
}

/// Bytes of a file that holds one row: the fixed cost of a file (footer with 1,921 column
/// chunks' metadata, `ARROW:schema` with every field's `stel.*` metadata, key-value metadata).
pub fn fixed_file_bytes(batches: &[Arc<CounterBatch>], cfg: &ParquetSinkConfig) -> u64 {
    let b = &batches[0];
    let one = Arc::new(CounterBatch {
        schema: Arc::clone(&b.schema),
        ts: b.ts[..1].to_vec(),
        values: b.values[..b.schema.width()].to_vec(),
        part_masks: Vec::new(),
    });
    encode_once(std::slice::from_ref(&one), cfg).0
}

/// CPU seconds the calling thread has run so far (`/proc/thread-self/schedstat`, ns).
pub fn thread_cpu_s() -> f64 {
    // The runtime in schedstat is brought up to date at scheduler events only (a tick: ~4 ms):
    // a yield is one, so the figure is the thread's CPU time to the microsecond.
    std::thread::yield_now();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat`.
pub fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = 100.0; // USER_HZ on Linux
    let ut: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let st: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    (ut + st) / tick
}

/// The encodings and codecs compared in the table (label, config).
pub fn sweep_configs() -> Vec<(String, ParquetSinkConfig)> {
    let base = ParquetSinkConfig {
        encode_threads: 1,
        ..ParquetSinkConfig::default()
    };
    let mut v = Vec::new();
    for (enc, en) in [
        (CounterEncoding::Plain, "plain"),
        (CounterEncoding::DeltaBinaryPacked, "delta"),
        (CounterEncoding::ByteStreamSplit, "bss"),
    ] {
        for (codec, level, cn) in [
            (Codec::None, 0, "none"),
            (Codec::Lz4, 0, "lz4"),
            (Codec::Zstd, 1, "zstd1"),
            (Codec::Zstd, 3, "zstd3"),
            (Codec::Zstd, 9, "zstd9"),
        ] {
            v.push((
                format!("{en}+{cn}"),
                ParquetSinkConfig {
                    encoding: enc,
                    compression: codec,
                    compression_level: level.max(1),
                    ..base.clone()
                },
            ));
        }
    }
    v
}

/// The row-group sizes compared, with the default encoding and codec.
pub fn row_group_configs(max_rows: usize) -> Vec<(String, ParquetSinkConfig)> {
    [1024, 4096, 16384, 65536]
        .into_iter()
        .filter(|r| *r <= max_rows)
        .map(|rows| {
            (
                format!("default, row_group_rows={rows}"),
                ParquetSinkConfig {
                    row_group_rows: rows,
                    page_rows: ParquetSinkConfig::default().page_rows.min(rows),
                    ..ParquetSinkConfig::default()
                },
            )
        })
        .collect()
}

/// Runs `configs` over `batches` (best of `runs` for speed; size is deterministic).
pub fn measure(
    pattern: Pattern,
    batches: &[Arc<CounterBatch>],
    configs: &[(String, ParquetSinkConfig)],
    runs: usize,
) -> Vec<EncodeResult> {
    let n = samples(batches);
    configs
        .iter()
        .map(|(label, cfg)| {
            let fixed = fixed_file_bytes(batches, cfg);
            let mut best = f64::MAX;
            let mut bytes = 0;
            for _ in 0..runs.max(1) {
                let (b, s) = encode_once(batches, cfg);
                bytes = b;
                best = best.min(s);
            }
            EncodeResult {
                label: label.clone(),
                pattern,
                bytes: bytes.saturating_sub(fixed),
                samples: n,
                samples_per_s: n as f64 / best,
            }
        })
        .collect()
}

/// The Parquet sink's counters one run reports, read from its registry snapshot.
#[derive(Debug, Clone, Copy)]
pub struct ParquetStats {
    pub samples_submitted: u64,
    pub samples_written: u64,
    pub shed: u64,
    pub lost: u64,
    pub files_published: u64,
    pub bytes_published: u64,
    pub budget_row_group_flushes: u64,
    pub writer_bytes_peak: u64,
    pub queued_bytes_peak: u64,
    pub shed_batches: u64,
}

impl ParquetStats {
    pub fn of(s: &Snapshot) -> Self {
        Self {
            samples_submitted: accounting::submitted(s),
            samples_written: accounting::written(s),
            shed: accounting::shed(s),
            lost: accounting::lost(s),
            files_published: s.sum(Metric::SinkPublishedFiles),
            bytes_published: s.sum(Metric::ParquetPublishedBytes),
            budget_row_group_flushes: s.sum(Metric::ParquetBudgetFlushes),
            writer_bytes_peak: s.sum(Metric::ParquetBufferedBytesPeak),
            queued_bytes_peak: s.sum_where(Metric::SinkQueuedBytesPeak, Label::Sink, "parquet"),
            shed_batches: s
                .series(Metric::SinkDroppedBatches)
                .filter(|x| x.label(Label::Sink) == "parquet")
                .map(|x| x.value)
                .sum(),
        }
    }
    pub fn lost_samples(&self) -> u64 {
        self.lost
    }
    pub fn shed_samples(&self) -> u64 {
        self.shed
    }
}

/// What one run of the sink did.
#[derive(Debug, Clone, Copy)]
pub struct SinkRun {
    pub stats: ParquetStats,
    pub secs: f64,
    /// Process CPU seconds (writer thread + the feeding thread's copies) during the run.
    pub cpu_s: f64,
}

impl SinkRun {
    pub fn samples_per_s(&self) -> f64 {
        self.stats.samples_written as f64 / self.secs
    }

    pub fn bytes_per_sample(&self) -> f64 {
        self.stats.bytes_published as f64 / self.stats.samples_written as f64
    }
}

/// Feeds `pool` `loops` times (timestamps shifted so time keeps going forward) through a real
/// [`ParquetSink`] writing under `dir`, from the calling thread, and waits for every file to be
/// published (fsync + rename). Time includes the copies that stand in for the decoder's
/// batches.
///
/// # Errors
/// A sink that failed to start, or any shed/lost sample (the bench must not hide loss).
pub fn sink_run(
    dir: &Path,
    pool: &[Arc<CounterBatch>],
    loops: usize,
    cfg: ParquetSinkConfig,
) -> Result<SinkRun, String> {
    let span = pool
        .last()
        .and_then(|b| b.ts.last())
        .zip(pool.first().and_then(|b| b.ts.first()))
        .map(|(l, f)| l - f + 10_000)
        .unwrap_or(0);
    let cfg = ParquetSinkConfig {
        dir: dir.to_path_buf(),
        ..cfg
    };
    let sink = ParquetSink::start(cfg, None).map_err(|e| e.to_string())?;
    let cpu0 = process_cpu_s();
    let t = Instant::now();
    for l in 0..loops {
        for b in pool {
            sink.submit(Arc::new(shifted(b, span * l as i64)))
                .map_err(|e| e.to_string())?;
        }
    }
    let stats = ParquetStats::of(&sink.shutdown().map_err(|e| e.to_string())?);
    let secs = t.elapsed().as_secs_f64();
    let cpu_s = process_cpu_s() - cpu0;
    if stats.lost_samples() + stats.shed_samples() != 0
        || stats.samples_written != stats.samples_submitted
    {
        return Err(format!("parquet sink lost samples: {stats:?}"));
    }
    Ok(SinkRun { stats, secs, cpu_s })
}

/// The baseline a write-ahead log would pay: the raw counters (8 B/sample) written
/// sequentially to a file under `dir` in 8 MiB chunks and fsynced every `sync_every` bytes.
/// Returns samples/s.
pub fn raw_write_samples_per_s(dir: &Path, samples: u64, sync_every: u64) -> std::io::Result<f64> {
    let path = dir.join("raw-wal-baseline.bin");
    let chunk = vec![0x5au8; 8 << 20];
    let mut f = std::fs::File::create(&path)?;
    let total = samples * 8;
    let t = Instant::now();
    let (mut written, mut since_sync) = (0u64, 0u64);
    while written < total {
        let n = (total - written).min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        written += n as u64;
        since_sync += n as u64;
        if since_sync >= sync_every {
            f.sync_data()?;
            since_sync = 0;
        }
    }
    f.sync_data()?;
    let secs = t
        .elapsed()
        .as_secs_f64()
        .max(Duration::from_micros(1).as_secs_f64());
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(samples as f64 / secs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

const PATTERNS: [Pattern; 3] = [Pattern::Steady, Pattern::Ramp, Pattern::Microburst];

fn pattern_name(p: Pattern) -> &'static str {
    match p {
        Pattern::Steady => "steady",
        Pattern::Ramp => "ramp",
        Pattern::Microburst => "microburst",
    }
}

/// The encoding table (markdown on stderr, rows in the returned JSON): every encoding × codec
/// on every pattern, then row-group sizes on the steady pattern.
pub fn sweep(snapshots: usize) -> serde_json::Value {
    let mut rows = Vec::new();
    eprintln!("| pattern | config | bytes/sample | encode M samples/s (1 core) |");
    eprintln!("|---|---|---:|---:|");
    let mut emit = |r: &EncodeResult| {
        eprintln!(
            "| {} | {} | {:.3} | {:.0} |",
            pattern_name(r.pattern),
            r.label,
            r.bytes_per_sample(),
            r.samples_per_s / 1e6
        );
        rows.push(serde_json::json!({
            "pattern": pattern_name(r.pattern),
            "config": r.label,
            "bytes_per_sample": (r.bytes_per_sample() * 1000.0).round() / 1000.0,
            "encode_samples_per_s": r.samples_per_s.round(),
        }));
    };
    for p in PATTERNS {
        let batches = pattern_batches(p, snapshots);
        for r in measure(p, &batches, &sweep_configs(), 1) {
            emit(&r);
        }
        if p == Pattern::Steady {
            for r in measure(p, &batches, &row_group_configs(snapshots), 1) {
                emit(&r);
            }
        }
    }
    serde_json::Value::Array(rows)
}

/// `stel-bench parquet`: the sink end to end (queue → writer thread → transpose → encode →
/// fsync → rename) on the emulator's design-rate counters, against a raw sequential write of
/// the same samples (what a write-ahead log would cost) measured in the same run.
///
/// # Errors
/// Any loss in the sink, or an I/O error of the baseline.
pub fn bench(quick: bool, with_sweep: bool) -> Result<serde_json::Value, String> {
    let (snapshots, loops, runs) = if quick { (8192, 4, 3) } else { (16384, 8, 5) };
    let base = std::env::var_os("STEL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("stel-bench-parquet-")
        .tempdir_in(&base)
        .map_err(|e| format!("temp dir under {}: {e}", base.display()))?;
    let cfg = ParquetSinkConfig::default();
    // Per core: one encoding thread, timed by its own CPU time (this box is shared; wall time
    // is reported beside it).
    let one = ParquetSinkConfig {
        encode_threads: 1,
        ..cfg.clone()
    };
    let mut per_pattern = serde_json::Map::new();
    let mut steady = Vec::new();
    let mut fixed = 0;
    let mut encode_rates = Vec::new();
    let mut encode_wall = Vec::new();
    let mut ratios_vs_arrow = Vec::new();
    eprintln!(
        "parquet: DELTA kernel {}, {} encode threads by default",
        stel_store::parquet::kernel_name(),
        cfg.encode_threads()
    );
    for p in PATTERNS {
        let pool = pattern_batches(p, snapshots);
        let n = samples(&pool) as f64;
        fixed = fixed_file_bytes(&pool, &one); // also warms allocator and caches
        let mut cpu = f64::MAX;
        let mut wall = f64::MAX;
        let mut bytes = 0;
        for _ in 0..3 {
            let c0 = thread_cpu_s();
            let (b, secs) = encode_once(&pool, &one);
            cpu = cpu.min(thread_cpu_s() - c0);
            wall = wall.min(secs);
            bytes = b;
        }
        let bps = bytes.saturating_sub(fixed) as f64 / n;
        // Baseline in the same run: parquet's generic ArrowWriter on the same batches and
        // properties (what the sink used before its column-chunk encoder), same clock.
        let c0 = thread_cpu_s();
        let (abytes, _) = encode_once_arrow_writer(&pool, &one);
        let acpu = thread_cpu_s() - c0;
        let abps = abytes.saturating_sub(fixed) as f64 / n;
        eprintln!(
            "parquet: {} {:.3} bytes/sample (data, without the fixed per-file cost), encode {:.0} M samples per CPU-second ({:.0} M/s wall) on one thread; ArrowWriter {:.3} bytes/sample, {:.0} M samples per CPU-second ({:.1}x)",
            pattern_name(p),
            bps,
            n / cpu / 1e6,
            n / wall / 1e6,
            abps,
            n / acpu / 1e6,
            acpu / cpu
        );
        encode_rates.push(n / cpu);
        encode_wall.push(n / wall);
        ratios_vs_arrow.push(acpu / cpu);
        per_pattern.insert(
            format!("bytes_per_sample_{}", pattern_name(p)),
            serde_json::json!((bps * 1000.0).round() / 1000.0),
        );
        if p == Pattern::Steady {
            steady = pool;
        }
    }
    // Scaling of the column-chunk pool (wall time, steady pattern): 1 and 2 threads here.
    let mut scaling = serde_json::Map::new();
    for threads in [1, 2] {
        let c = ParquetSinkConfig {
            encode_threads: threads,
            ..cfg.clone()
        };
        let best = (0..3)
            .map(|_| encode_once(&steady, &c).1)
            .fold(f64::MAX, f64::min);
        let rate = samples(&steady) as f64 / best;
        eprintln!(
            "parquet: steady, {threads} encode thread(s): {:.0} M samples/s wall",
            rate / 1e6
        );
        scaling.insert(format!("{threads}"), serde_json::json!(rate.round()));
    }
    let per_run = samples(&steady) * loops as u64;
    eprintln!(
        "parquet: sink runs: {runs} × {:.1} M samples ({} snapshots × {loops} loops), dir {}",
        per_run as f64 / 1e6,
        snapshots,
        tmp.path().display()
    );
    let mut rates = Vec::new();
    let mut bps = Vec::new();
    let mut raw = Vec::new();
    let mut per_cpu = Vec::new();
    let mut last = None;
    for i in 0..runs {
        let dir = tmp.path().join(format!("run{i}"));
        let r = sink_run(&dir, &steady, loops, cfg.clone())?;
        std::fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
        let w = raw_write_samples_per_s(tmp.path(), per_run, 64 << 20)
            .map_err(|e| format!("raw write baseline: {e}"))?;
        eprintln!(
            "parquet: run {i}: sink {:.1} M samples/s, {:.3} bytes/sample, {} files; raw 8 B/sample write+fsync {:.1} M samples/s",
            r.samples_per_s() / 1e6,
            r.bytes_per_sample(),
            r.stats.files_published,
            w / 1e6
        );
        rates.push(r.samples_per_s());
        per_cpu.push(r.stats.samples_written as f64 / r.cpu_s.max(1e-3));
        bps.push(r.bytes_per_sample());
        raw.push(w);
        last = Some(r);
    }
    let (rate, bps, raw, per_cpu) = (median(rates), median(bps), median(raw), median(per_cpu));
    eprintln!(
        "parquet: median {:.1} M samples/s wall, {:.1} M samples per CPU-second; fixed cost per file {} bytes",
        rate / 1e6,
        per_cpu / 1e6,
        fixed
    );
    let mut v = serde_json::json!({
        "bench": "parquet",
        "samples_per_s": rate.round(),
        "bytes_per_sample": (bps * 1000.0).round() / 1000.0,
        "samples_per_cpu_s": per_cpu.round(),
        "encode_samples_per_s": median(encode_rates).round(),
        "encode_wall_samples_per_s": median(encode_wall).round(),
        "encode_kernel": stel_store::parquet::kernel_name(),
        "encode_wall_samples_per_s_by_threads": scaling,
        "encode_ratio_vs_arrow_writer": (median(ratios_vs_arrow) * 100.0).round() / 100.0,
        "fixed_bytes_per_file": fixed,
        "raw_write_samples_per_s": raw.round(),
        "ratio_vs_raw_write": (rate / raw * 100.0).round() / 100.0,
        "design_rate_ratio": (rate / 192e6 * 100.0).round() / 100.0,
        "runs": runs,
        "samples_per_run": per_run,
        "files_per_run": last.map(|r| r.stats.files_published),
        "budget_row_group_flushes": last.map(|r| r.stats.budget_row_group_flushes),
        "writer_bytes_peak": last.map(|r| r.stats.writer_bytes_peak),
        "queued_bytes_peak": last.map(|r| r.stats.queued_bytes_peak),
        "config": {
            "encoding": cfg.encoding,
            "compression": cfg.compression,
            "compression_level": cfg.compression_level,
            "row_group_rows": cfg.row_group_rows,
        },
    });
    if let Some(m) = v.as_object_mut() {
        m.extend(per_pattern);
        if with_sweep {
            m.insert("sweep".into(), sweep(snapshots));
        }
    }
    Ok(v)
}
