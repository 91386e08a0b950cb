//! `stel-bench e2e`: emulator → NETLINK_USERSOCK → eBPF filter → io_uring reader → decoder →
//! Parquet history **and** COUNTERS_DB/RATES in a private `redis-server`, paced at `rate ×`
//! the design rate (default 2×: 384 M counters/s), everything on this machine's 2 cores.
//!
//! - `counters_per_s`: counters persisted in published Parquet files per second of the run.
//! - `lost`: counters the daemon counted as lost (kernel drops, truncation, shedding, Parquet
//!   shed/write loss); `unaccounted` = sent − persisted − lost, must be 0.
//! - `parquet_bytes_per_sample`: published bytes / counters in them (realistic microburst
//!   counters: 2,000 distinct messages = 80 ms of switch time, timestamps continued per cycle).
//! - `counters_db_lag_p99_ms`: a batch's arrival at the writer → its values acknowledged by
//!   Redis, p99 over the run.
//! - `daemon_cpu_s_per_g_counters`: CPU seconds of the daemon's threads (reader, decoder,
//!   Parquet writer and encoders, COUNTERS_DB writer: this process less the emulator's sender
//!   thread, from `/proc/self/stat` and the sender's `/proc/thread-self/stat`) per 10⁹ counters
//!   persisted; `emulator_cpu_share` is the sender thread's share of the process's CPU in the
//!   run (redis-server is another process and counted in neither).
//! - `STEL_BENCH_PARQUET_DELAY_US=<µs>` slows the Parquet writer by that much per batch (the
//!   sink's test knob): the decoders must not wait, COUNTERS_DB must stay fresh, every shed batch
//!   is counted.
//! - `counters_db_lag_p50_ms` / `_max_ms`, `counters_db_write_rounds` and `redis_cpu_s`
//!   (redis-server's own CPU over the run, from `INFO cpu`) show what the live view costs;
//!   `STEL_BENCH_CDB_FLUSH_US=<µs>` overrides the COUNTERS_DB writer's `flush_interval_us`.
//! - `daemon_cpu_s_per_g_by_thread`: the daemon's CPU per thread name (`/proc/self/task`, from
//!   start to the end of sending; the drain is in the total only), per 10⁹ counters persisted.
//!   `STEL_BENCH_BATCH_BYTES`, `STEL_BENCH_SLOTS`, `STEL_BENCH_BATCH_WAIT_US` and
//!   `STEL_BENCH_ENCODE_THREADS` override the decoder's `batch_bytes`, the reader's `slots` and
//!   `batch_wait_us` and the sink's `encode_threads` (to compare settings in the same build).
//! - Rollup tiers (`[rollup]`) are off here unless `STEL_BENCH_ROLLUPS=1`, so this figure stays
//!   the raw path's; `stel-bench rollup` runs this bench with and without them
//!   (`daemon_cpu_s_per_g_added`).
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use stel_emu::Pattern;

use serde_json::json;
use stel_ingest::{
    config::{DaemonConfig, SourceKind},
    sources::fixture,
    topology::Topology,
};
use stel_store::{parquet::ParquetSinkConfig, sonic::CountersDbConfig};
use stel_testkit::redis::TestRedis;

use crate::netlink::{send, Workload};

/// Runs the benchmark; returns the contract's JSON object.
///
/// # Errors
/// Not root, redis-server missing, or a run failing.
pub fn bench(quick: bool, rate: f64) -> Result<serde_json::Value, String> {
    run(
        quick,
        rate,
        env_usize("STEL_BENCH_ROLLUPS").unwrap_or(0) != 0,
    )
}

/// One e2e run, with or without the rollup tiers.
///
/// # Errors
/// As [`bench`].
pub fn run(quick: bool, rate: f64, rollups: bool) -> Result<serde_json::Value, String> {
    // --quick stays under a minute even when the Parquet writer is the bound (it sheds, counted).
    let secs = if quick { 2.0 } else { 20.0 };
    let w = Workload::new(2000, Pattern::Microburst);
    let redis = TestRedis::start_private();
    fixture::publish(redis.url(), &w.emu, &fixture::FixtureOptions::default())
        .map_err(|e| format!("redis fixture: {e}"))?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;

    let group = 29;
    let delay_us = std::env::var("STEL_BENCH_PARQUET_DELAY_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // The daemon as stel-ingestd builds it (ingest::topology): usersock source, one decoder,
    // Parquet history and COUNTERS_DB; no status file, inspect socket or metrics endpoint.
    let mut cfg = DaemonConfig::default();
    cfg.source.kind = SourceKind::Usersock;
    cfg.source.usersock_group = group;
    cfg.pipeline.decoders = 1;
    if let Some(b) = env_usize("STEL_BENCH_BATCH_BYTES") {
        cfg.pipeline.decode.batch_bytes = b;
    }
    if let Some(n) = env_usize("STEL_BENCH_SLOTS") {
        cfg.reader.slots = n as u16;
    }
    if let Some(us) = env_usize("STEL_BENCH_BATCH_WAIT_US") {
        cfg.reader.batch_wait_us = us as u32;
    }
    cfg.status.file = Some(Default::default()); // none
    cfg.inspect.enabled = false;
    cfg.rollup.enabled = rollups;
    cfg.parquet = Some(ParquetSinkConfig {
        dir: dir.path().to_path_buf(),
        test_write_delay_us: delay_us,
        encode_threads: env_usize("STEL_BENCH_ENCODE_THREADS").unwrap_or(0),
        ..ParquetSinkConfig::default()
    });
    let mut cdb = CountersDbConfig {
        url: redis.url().to_string(),
        ..CountersDbConfig::default()
    };
    if let Some(us) = std::env::var("STEL_BENCH_CDB_FLUSH_US")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cdb.flush_interval_us = us;
    }
    let cdb_flush_us = cdb.flush_interval_us;
    cfg.counters_db = Some(cdb);
    let mut topo = Topology::build(cfg, None)?;
    topo.daemon
        .register(w.emu.session_spec(), w.emu.session_config())?;
    let history = Arc::clone(topo.history().ok_or("no Parquet history")?);
    let counters = Arc::clone(topo.counters_db().ok_or("no COUNTERS_DB writer")?);

    let period = w.message_period().div_f64(rate);
    let count = (secs / period.as_secs_f64()) as u64;
    eprintln!(
        "e2e: {secs} s at {rate}× the design rate ({:.0} M counters/s) → Parquet in {} and COUNTERS_DB in {}",
        rate * w.emu.cfg.counters_per_s() / 1e6,
        dir.path().display(),
        redis.url()
    );
    let stop = AtomicBool::new(false);
    let received = AtomicU64::new(0);
    let emu_cpu = std::sync::Mutex::new(0.0f64);
    let cpu0 = crate::parquet::process_cpu_s();
    let threads0 = thread_cpu_s();
    let redis_cpu0 = redis_cpu_s(&redis);
    let t0 = Instant::now();
    let (sent, st) = std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name("stel-bench-emu".into())
            .spawn_scoped(s, || {
                let c0 = stel_ingest::demo::thread_cpu_s();
                let r = send(&w, group, count, Some(period), &stop);
                if let Ok(mut c) = emu_cpu.lock() {
                    *c = stel_ingest::demo::thread_cpu_s() - c0;
                }
                r
            })
            .map_err(|e| e.to_string());
        let h = match h {
            Ok(h) => h,
            Err(e) => return (Err(e), None),
        };
        let mut last = Instant::now();
        while !h.is_finished() {
            if let Err(e) = topo.daemon.step() {
                stop.store(true, Ordering::Relaxed);
                return (Err(e), None);
            }
            if last.elapsed() >= Duration::from_secs(1) {
                let st = topo.daemon.status();
                eprintln!(
                    "e2e: {:.1} s: {} M counters decoded, parquet {} M written, lag p99 {:.1} ms",
                    t0.elapsed().as_secs_f64(),
                    st.pipeline.decode.counters / 1_000_000,
                    stel_store::parquet::accounting::written(&history.stats()) / 1_000_000,
                    lag_p99_ms(&counters.stats())
                );
                received.store(st.recv.datagrams, Ordering::Relaxed);
                last = Instant::now();
            }
        }
        let sent = h.join().unwrap_or_else(|_| Err("sender panicked".into()));
        let threads1 = thread_cpu_s();
        let n = *sent.as_ref().unwrap_or(&0);
        let drained = move |r: &stel_ingest::sys::uring::RecvStats| r.datagrams > n;
        // The lag before the writer stops; the clones go so the topology owns its sinks alone.
        let lag = counters.stats();
        drop((history, counters));
        let fin = topo.finish(Some(&drained), Duration::from_secs(5));
        (sent, Some((fin, lag, threads1)))
    });
    let sent = sent?;
    let (fin, lag, threads1) = st.ok_or("daemon failed")?;
    let st = fin.status;
    let (rollup_shed, rolled_up) = fin.rollup.as_ref().map_or((0, 0), |s| {
        (
            stel_store::rollup::accounting::shed(s),
            stel_store::rollup::accounting::rolled_up(s),
        )
    });
    let cdb_lag = lag
        .histogram(stel_store::metrics::Metric::CountersDbLag)
        .cloned()
        .unwrap_or_default();
    let cdb_lag_p99 = cdb_lag.p99_ms;
    let p = crate::parquet::ParquetStats::of(
        fin.parquet
            .as_ref()
            .ok_or("the Parquet history's final flush failed")?,
    );
    let elapsed = t0.elapsed().as_secs_f64();
    let process_cpu = crate::parquet::process_cpu_s() - cpu0;
    let emu_cpu = emu_cpu.into_inner().unwrap_or(0.0);
    let redis_cpu = redis_cpu_s(&redis) - redis_cpu0;
    let daemon_cpu = (process_cpu - emu_cpu).max(0.0);

    let sent_counters = sent * w.counters_per_message;
    let lost_msgs =
        st.kernel_drops + st.recv.truncated + st.pipeline.dispatch.shed_decoder_full_messages;
    let lost = lost_msgs * w.counters_per_message + p.shed_samples() + p.lost_samples();
    let persisted = p.samples_written;
    let unaccounted = sent_counters as i64 - persisted as i64 - lost as i64;
    let cps = persisted as f64 / elapsed;
    let per_g = daemon_cpu / (persisted.max(1) as f64 / 1e9);
    let emu_share = emu_cpu / process_cpu.max(1e-9);
    let mut by_thread = serde_json::Map::new();
    for (name, c1) in &threads1 {
        if name == "stel-bench-emu" {
            continue;
        }
        let c = c1 - threads0.get(name).copied().unwrap_or(0.0);
        let per = c / (persisted.max(1) as f64 / 1e9);
        by_thread.insert(name.clone(), json!((per * 100.0).round() / 100.0));
    }
    eprintln!(
        "e2e: sent {sent_counters} counters, persisted {persisted} in {} files ({:.3} B/sample), lost {lost} (kernel drops {} msgs, parquet shed {} samples), unaccounted {unaccounted}, COUNTERS_DB lag p99 {cdb_lag_p99:.1} ms",
        p.files_published,
        p.bytes_published as f64 / persisted.max(1) as f64,
        st.kernel_drops,
        p.shed_samples()
    );
    eprintln!(
        "e2e: CPU: daemon threads {daemon_cpu:.2} s ({per_g:.2} CPU-s per G counters persisted), emulator sender {emu_cpu:.2} s ({:.0} % of the process)",
        emu_share * 100.0
    );
    Ok(json!({
        "bench": "e2e",
        "counters_per_s": cps.round(),
        "design_rate_ratio": (cps / w.emu.cfg.counters_per_s() * 100.0).round() / 100.0,
        "lost": lost,
        "unaccounted": unaccounted,
        "parquet_bytes_per_sample": (p.bytes_published as f64 / persisted.max(1) as f64 * 1000.0).round() / 1000.0,
        "counters_db_lag_p99_ms": (cdb_lag_p99 * 10.0).round() / 10.0,
        "counters_db_lag_p50_ms": (cdb_lag.p50_ms * 10.0).round() / 10.0,
        "counters_db_lag_max_ms": (cdb_lag.max_ms * 10.0).round() / 10.0,
        "counters_db_write_rounds": lag.sum(stel_store::metrics::Metric::CountersDbWriteRounds),
        "counters_db_flush_interval_us": cdb_flush_us,
        "daemon_cpu_s_per_g_counters": (per_g * 100.0).round() / 100.0,
        "emulator_cpu_share": (emu_share * 100.0).round() / 100.0,
        "daemon_cpu_s_per_g_by_thread": by_thread,
        "daemon_cpu_s": (daemon_cpu * 100.0).round() / 100.0,
        "emulator_cpu_s": (emu_cpu * 100.0).round() / 100.0,
        "redis_cpu_s": (redis_cpu * 100.0).round() / 100.0,
        "parquet_shed_batches": p.shed_batches,
        "parquet_shed_samples": p.shed_samples(),
        "parquet_write_delay_us": delay_us,
        "sent_counters": sent_counters,
        "persisted_counters": persisted,
        "files": p.files_published,
        "target_rate": rate,
        "seconds": elapsed,
        "counters_db_fields_written": lag.get(stel_store::metrics::Metric::CountersDbWrittenFields),
        "rollups": rollups,
        "rollup_shed_samples": rollup_shed,
        "rollup_samples": rolled_up,
    }))
}

/// CPU seconds (user + system) redis-server has used so far (`INFO cpu`); 0 when unreadable.
fn redis_cpu_s(redis: &TestRedis) -> f64 {
    let mut c = redis.connect(0);
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query(&mut c)
        .unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            matches!(k, "used_cpu_sys" | "used_cpu_user").then(|| v.trim().parse::<f64>().ok())?
        })
        .sum()
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// CPU seconds (user + system) of this process's live threads, summed by thread name (the main
/// thread is named after the binary).
fn thread_cpu_s() -> std::collections::BTreeMap<String, f64> {
    let mut m = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return m;
    };
    for e in dir.flatten() {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let (Some((head, rest)), Some(open)) = (stat.rsplit_once(')'), stat.find('(')) else {
            continue;
        };
        let name = head[open + 1..].to_string();
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ut: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let st: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *m.entry(name).or_insert(0.0) += (ut + st) / 100.0;
    }
    m
}

/// COUNTERS_DB write lag p99 from the sink's registry snapshot (`stel_counters_db_lag_seconds`).
fn lag_p99_ms(s: &stel_store::metrics::Snapshot) -> f64 {
    s.histogram(stel_store::metrics::Metric::CountersDbLag)
        .map_or(0.0, |h| h.p99_ms)
}
