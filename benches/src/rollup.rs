//! `stel-bench rollup`: what the rollup tiers cost and what they buy.
//!
//! - `daemon_cpu_s_per_g_added`: `stel-bench e2e` (the whole daemon through the kernel at
//!   `--rate` × the design rate) with `[rollup]` on minus the same without, runs interleaved in
//!   this process, medians; `shed`: counter values the rollup sink shed in those runs.
//! - `bytes_per_switch_day` (by tier, the largest over the loads; `bytes_per_switch_day_by_load`
//!   has each): the emulator's steady, ramp and microburst loads at the design rate (64 ports ×
//!   30 counters every 10 µs, IPFIX decoded by the daemon's decoder), `--secs` of switch time
//!   each, through the real accumulator; then whole files as the daemon writes them by the real
//!   tier writer — an hour of 1 s rows (24 a day) and a day of 1 min rows (built by the real
//!   `absorb`) — made of the measured seconds repeated (the loads are periodic, so the seconds
//!   repeat with time and counter offsets).
//! - `query_24h_rates_s`, `query_7d_bursts_s`: a week of 1 min tiers (synthetic 64 × 30 counters
//!   every `--interval`, fed as batches through the real rollup writer, faster than real time)
//!   ending now, plus a minute of raw files; then the `stel-query` binary (release-query build)
//!   answers `rates --last 24h -r 1m` and `top --by bursts --since 7d`, wall time including the
//!   process and its catalog; `duckdb_24h_rates_s`: DuckDB (Python) answers the same 24 h rates
//!   over the same tier files (the query only, like `stel-bench query`).
//! - `exact`: the microburst load's raw files and tiers vs the same raw files alone: `stel-query
//!   rates -r 1s` and `top --by bursts` give identical rows.
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::Instant,
};
use stel_emu::{EmuConfig, Emulator, Pattern};

use serde_json::{json, Value};
use stel_ingest::decode::{CounterBatch, DecodeConfig, Decoder};
use stel_store::{
    parquet::{Codec, ParquetSink, ParquetSinkConfig, WhenFull},
    rollup::{
        config::NS_PER_DAY,
        writer::{FileIdentity, Layout, TierFile},
        Accumulator, IntervalRow, Plan, RollupConfig, RollupWriter, TierConfig,
    },
    BudgetHandle,
};

use crate::parquet::thread_cpu_s;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Feeds `secs` of switch time of the design session under `pattern` into `sink`, batch by
/// batch as the decoder emits them. Returns counters fed.
pub fn design_stream(pattern: Pattern, secs: f64, mut sink: impl FnMut(&CounterBatch)) -> u64 {
    let mut emu = Emulator::new(EmuConfig {
        pattern,
        ..EmuConfig::design()
    })
    .expect("design config");
    let mut dec = Decoder::new(DecodeConfig::default());
    let mut spare: Vec<CounterBatch> = Vec::new();
    dec.register_session(
        emu.session_spec(),
        &emu.session_config(),
        &mut |_: CounterBatch| {},
    )
    .expect("design session");
    let snapshots = (secs * 1e9 / emu.cfg.interval_ns as f64) as u64;
    let mut buf = Vec::new();
    let mut n = 0u64;
    while emu.snapshots() < snapshots {
        buf.clear();
        for _ in 0..64 {
            emu.data_message(&mut buf);
        }
        dec.decode(&buf, &mut |b: CounterBatch| spare.push(b));
        for b in spare.drain(..) {
            n += b.samples() as u64;
            sink(&b);
            dec.recycle(b);
        }
    }
    dec.flush(&mut |b: CounterBatch| spare.push(b));
    for b in spare.drain(..) {
        n += b.samples() as u64;
        sink(&b);
    }
    n
}

/// The measured intervals `rows` (consecutive, one finest-tier interval each) repeated as a
/// cycle: row `k` of the endless sequence is `rows[k % n]` moved `k / n` cycles on.
struct Cycle<'a> {
    rows: &'a [IntervalRow],
    cycle_ns: i64,
    inc: Vec<u64>,
    level: Vec<bool>,
}

impl Cycle<'_> {
    fn row(&self, k: usize) -> IntervalRow {
        let n = self.rows.len();
        shifted(
            &self.rows[k % n],
            (k / n) as i64,
            self.cycle_ns,
            &self.inc,
            &self.level,
        )
    }
}

/// Bytes of one tier file (the real tier writer; removed again) of `count` rows from
/// `start_ns`, `interval_ns` apart, each absorbing `per` consecutive rows of `cycle`.
#[expect(clippy::too_many_arguments, reason = "one file's shape, spelled out")]
fn file_bytes(
    plan: &Arc<Plan>,
    layout: &Arc<Layout>,
    id: &Arc<FileIdentity>,
    cycle: &Cycle<'_>,
    count: usize,
    per: usize,
    start_ns: i64,
    interval_ns: i64,
) -> Result<u64, String> {
    let mut f = TierFile::new(
        Arc::clone(plan),
        Arc::clone(layout),
        Arc::clone(id),
        start_ns,
    );
    let mut k = 0;
    for m in 0..count {
        let mut r = cycle.row(k);
        for j in 1..per {
            r.absorb(&cycle.row(k + j));
        }
        k += per;
        r.start_ns = start_ns + m as i64 * interval_ns;
        f.push(&r);
    }
    let mut seq = 0;
    let p = f
        .publish(&mut seq)
        .map_err(|e| e.to_string())?
        .ok_or("empty tier file")?;
    let _ = std::fs::remove_file(&p.path);
    Ok(p.bytes)
}

/// `row` moved `k` cycles of `cycle_ns` later, its counters `k` cycles of `inc` further.
fn shifted(row: &IntervalRow, k: i64, cycle_ns: i64, inc: &[u64], level: &[bool]) -> IntervalRow {
    let mut r = row.clone();
    let dt = k * cycle_ns;
    let add = |t: i64| if t == i64::MIN { t } else { t + dt };
    r.start_ns += dt;
    r.first_ts = add(r.first_ts);
    r.last_ts = add(r.last_ts);
    for c in 0..r.width() {
        r.hi_t[c] = add(r.hi_t[c]);
        r.lo_t[c] = add(r.lo_t[c]);
        if !level[c] {
            let off = inc[c].wrapping_mul(k as u64);
            r.first[c] = r.first[c].wrapping_add(off);
            r.last[c] = r.last[c].wrapping_add(off);
        }
    }
    r
}

/// Per load: (1 s tier bytes per switch-day, 1 min tier bytes per switch-day, counters per
/// CPU-second of the rollup writer's per-sample work).
fn load_bytes(pattern: Pattern, secs: f64, dir: &Path) -> Result<(f64, f64, f64), String> {
    let cfg = RollupConfig::default();
    let (tiers, rule) = cfg.resolve().map_err(|e| e.join("; "))?;
    let mut acc: Option<Accumulator> = None;
    let mut rows: Vec<IntervalRow> = Vec::new();
    let mut cpu = 0.0;
    let n = design_stream(pattern, secs, |b| {
        let a = acc.get_or_insert_with(|| {
            Accumulator::new(Arc::new(Plan::new(&b.schema)), tiers[0].interval_ns, &rule)
        });
        let c0 = thread_cpu_s();
        a.push(b, &mut |r| rows.push(r));
        cpu += thread_cpu_s() - c0;
    });
    let mut acc = acc.ok_or("no batch")?;
    // The last (partial) interval is left out: every row measured is a whole second.
    let plan = Arc::clone(acc.plan());
    acc.close(&mut |_| {});
    if rows.len() < 3 {
        return Err(format!(
            "{secs} s gave {} whole 1 s rows; use --secs 4 or more",
            rows.len()
        ));
    }
    let layout = Arc::new(Layout::new(&plan, &rule));
    let id = |t: usize| {
        Arc::new(FileIdentity {
            root: dir.to_path_buf(),
            tier: tiers[t].clone(),
            switch: "bench".into(),
            rule: rule.clone(),
            codec: Codec::Lz4,
            compression_level: 1,
        })
    };
    // Whole files as the daemon writes them: an hour of 1 s rows and a day of 1 min rows, made
    // of the measured seconds repeated (the loads are periodic).
    let inc: Vec<u64> = (0..plan.width())
        .map(|c| {
            let (a, z) = (&rows[0], &rows[rows.len() - 1]);
            // Over a cycle a counter rises by its last value's rise plus one entry step.
            z.last[c]
                .wrapping_sub(a.last[c])
                .wrapping_add(a.last[c].wrapping_sub(a.first[c]) / a.samples.max(1))
        })
        .collect();
    let cycle = Cycle {
        rows: &rows,
        cycle_ns: rows.len() as i64 * tiers[0].interval_ns,
        inc,
        level: plan.level.clone(),
    };
    let day_start = rows[0].start_ns.div_euclid(NS_PER_DAY) * NS_PER_DAY;
    let mut per_day = [0.0; 2];
    for (t, d) in per_day.iter_mut().enumerate() {
        let span = tiers[t].file_span_ns;
        let iv = tiers[t].interval_ns;
        let count = usize::try_from(span / iv).map_err(|e| e.to_string())?;
        let per = usize::try_from(iv / tiers[0].interval_ns).map_err(|e| e.to_string())?;
        let b = file_bytes(&plan, &layout, &id(t), &cycle, count, per, day_start, iv)?;
        *d = b as f64 * (NS_PER_DAY / span) as f64;
    }
    let [one_s, one_m] = per_day;
    Ok((one_s, one_m, n as f64 / cpu))
}

/// The e2e pair: `daemon_cpu_s_per_g_counters` with and without rollups, and what the rollup
/// sink shed.
fn cpu_added(quick: bool, rate: f64, runs: usize) -> Result<(f64, f64, u64, Vec<Value>), String> {
    let (mut with, mut without, mut shed, mut raw) = (Vec::new(), Vec::new(), 0u64, Vec::new());
    for i in 0..runs {
        for on in [false, true] {
            let v = crate::e2e::run(quick, rate, on)?;
            let per_g = v["daemon_cpu_s_per_g_counters"]
                .as_f64()
                .unwrap_or(f64::NAN);
            eprintln!(
                "rollup: e2e run {i} rollups {on}: {per_g:.2} daemon CPU-s per G counters, lost {}, rollup shed {}",
                v["lost"], v["rollup_shed_samples"]
            );
            if on {
                with.push(per_g);
                shed += v["rollup_shed_samples"].as_u64().unwrap_or(0);
            } else {
                without.push(per_g);
            }
            raw.push(v);
        }
    }
    let (w, wo) = (median(with), median(without));
    Ok((w - wo, wo, shed, raw))
}

/// The `stel-query` binary of the release-query build (built when missing).
fn stel_query() -> Result<PathBuf, String> {
    // Through nested_cargo: cargo's environment for this process would make the nested build
    // rerun ring's build script and rebuild all of DataFusion.
    let out = stel_testkit::nested_cargo()
        .args([
            "build",
            "--profile",
            "release-query",
            "-q",
            "-p",
            "stel-query",
            "--bin",
            "stel-query",
            "--message-format=json",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err("building stel-query (release-query) failed".into());
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .find(|p| p.ends_with("stel-query"))
        .ok_or_else(|| "cargo did not say where stel-query is".into())
}

/// `cfg` made to take every batch, for raw files the bench compares with tiers: the data is
/// generated faster than real time, so the feeder waits for room in a short queue (8 decoder
/// batches, ~70 MB at the design session) for as long as the writer needs, under a memory budget
/// far above what that queue holds; one file per hour.
fn lossless(cfg: ParquetSinkConfig) -> ParquetSinkConfig {
    ParquetSinkConfig {
        flush_interval_ms: 3_600_000,
        queue_batches: 8,
        when_full: WhenFull::Block,
        block_timeout_ms: 600_000,
        memory_budget_bytes: 4 << 30,
        ..cfg
    }
}

/// Runs `stel-query args --json -d dir`; (wall seconds, rows, summary).
fn ask(bin: &Path, dir: &Path, args: &[&str]) -> Result<(f64, Vec<Value>, Value), String> {
    let t = Instant::now();
    let o = Command::new(bin)
        .args(args)
        .arg("--json")
        .arg("-d")
        .arg(dir)
        .output()
        .map_err(|e| e.to_string())?;
    let wall = t.elapsed().as_secs_f64();
    if !matches!(o.status.code(), Some(0 | 1)) {
        return Err(format!(
            "stel-query {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let mut rows = Vec::new();
    let mut summary = Value::Null;
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let v: Value = serde_json::from_str(l).map_err(|e| format!("{e}: {l}"))?;
        match v["type"].as_str() {
            Some("row") => rows.push(v["data"].clone()),
            Some("summary") => summary = v["data"].clone(),
            _ => {}
        }
    }
    Ok((wall, rows, summary))
}

/// A week of synthetic 64 × 30 PORT counters every `interval_ns`, ending now, through the real
/// rollup writer (1 min tier), and the last minute as raw files. Returns counters rolled up and
/// the end of the data.
fn write_week(dir: &Path, interval_ns: i64) -> Result<(u64, i64), String> {
    let schema = stel_ingest::decode::emulated(EmuConfig::design(), 2)?.schema;
    let w = schema.width();
    let plan = Plan::new(&schema);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_nanos() as i64;
    let end = now.div_euclid(interval_ns) * interval_ns;
    let start = end - 7 * NS_PER_DAY;
    let cfg = RollupConfig {
        tiers: vec![TierConfig::new("1m")],
        ..RollupConfig::for_test()
    };
    let mut rw = RollupWriter::new(
        &cfg,
        dir.to_path_buf(),
        "bench".into(),
        BudgetHandle::default(),
    )
    .map_err(|e| e.to_string())?;
    let raw_cfg = ParquetSinkConfig {
        switch_name: Some("bench".into()),
        ..ParquetSinkConfig::for_test(dir)
    };
    let raw = ParquetSink::start(lossless(raw_cfg), None).map_err(|e| e.to_string())?;
    let raw_from = end - 60_000_000_000;
    #[derive(Clone, Copy, PartialEq)]
    enum Kind {
        Level,
        Octets,
        Packets,
        Other,
    }
    let kinds: Vec<Kind> = (0..w)
        .map(|c| {
            let stat = &plan.stats[plan.stat_of[c]].0;
            if plan.level[c] {
                Kind::Level
            } else if stat.ends_with("OCTETS") {
                Kind::Octets
            } else if stat.ends_with("PKTS") {
                Kind::Packets
            } else {
                Kind::Other
            }
        })
        .collect();
    let mut state = vec![0u64; w];
    let speed_bytes = 100e9 / 8.0 * interval_ns as f64 / 1e9;
    let mut octets = vec![0u64; plan.objects.len()];
    let mut t = start;
    let mut n = 0u64;
    let rows_per_batch = 4096usize;
    let mut lcg: u64 = 0x9E37_79B9_7F4A_7C15;
    while t < end {
        let rows = rows_per_batch.min(((end - t) / interval_ns) as usize);
        let mut ts = Vec::with_capacity(rows);
        let mut values = Vec::with_capacity(rows * w);
        for r in 0..rows {
            let tt = t + r as i64 * interval_ns;
            ts.push(tt);
            // Ports at 20–80 %, each with a 95 % minute every 17 minutes.
            let minute = tt / 60_000_000_000;
            for (o, x) in octets.iter_mut().enumerate() {
                let util = if (minute + o as i64 * 5) % 17 == 0 {
                    0.95
                } else {
                    0.2 + 0.6 * (o % 7) as f64 / 6.0
                };
                *x = (util * speed_bytes) as u64 / 800 * 800;
            }
            lcg = lcg
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            for (c, v) in state.iter_mut().enumerate() {
                let o = octets[plan.object_of[c]];
                match kinds[c] {
                    Kind::Level => *v = (lcg >> 44).wrapping_add(c as u64 * 7919) % 2_000_000,
                    Kind::Octets => *v += o,
                    Kind::Packets => *v += o / 800,
                    Kind::Other => *v += u64::from((lcg >> (c % 60)) & 0xF == 0),
                }
            }
            values.extend_from_slice(&state);
        }
        let b = CounterBatch::new(Arc::clone(&schema), ts, values, Vec::new())
            .map_err(|e| e.to_string())?;
        rw.push(&b);
        n += b.samples() as u64;
        if b.ts.last().is_some_and(|l| *l >= raw_from) {
            raw.submit(Arc::new(b)).map_err(|e| format!("raw: {e:?}"))?;
        }
        t += rows as i64 * interval_ns;
    }
    rw.finish();
    raw.shutdown().map_err(|e| e.to_string())?;
    if rw.totals().write_errors > 0 {
        return Err("tier writes failed".into());
    }
    Ok((n, end))
}

/// DuckDB's 24 h per-minute rates over the 1 min tier files: seconds of the query.
fn duckdb_rates(dir: &Path, from_ns: i64, to_ns: i64) -> Result<(f64, u64), String> {
    let script = format!(
        r#"
import json, time, duckdb
con = duckdb.connect()
q = """
with t as (
  select object, ts, epoch_ns(last_ts) as lt,
         "IF_IN_OCTETS.last"::BIGINT as rxo, "IF_OUT_OCTETS.last"::BIGINT as txo,
         "IF_IN_UCAST_PKTS.last"::BIGINT as rxp, "IF_OUT_UCAST_PKTS.last"::BIGINT as txp
  from read_parquet('{dir}/tier=1m/*/*/*/*.parquet', hive_partitioning = true)
  where epoch_ns(ts) >= {from_ns} and epoch_ns(ts) < {to_ns})
select object, ts,
  (rxo - lag(rxo) over w) / ((lt - lag(lt) over w) / 1e9) as rx_bps,
  (txo - lag(txo) over w) / ((lt - lag(lt) over w) / 1e9) as tx_bps,
  (rxp - lag(rxp) over w) / ((lt - lag(lt) over w) / 1e9) as rx_pps,
  (txp - lag(txp) over w) / ((lt - lag(lt) over w) / 1e9) as tx_pps
from t window w as (partition by object order by ts)"""
def fetch(res):
    # The result as Arrow; the method's name depends on the DuckDB version.
    for m in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        f = getattr(res, m, None)
        if f is not None:
            return f()
    raise SystemExit("this duckdb has no Arrow result API")
times = []
for _ in range(3):
    t = time.perf_counter()
    rows = fetch(con.execute(q)).num_rows
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({{"s": times[1], "rows": rows}}))
"#,
        dir = dir.display()
    );
    let v = stel_testkit::python3_json(&script);
    Ok((
        v["s"].as_f64().ok_or("duckdb: no time")?,
        v["rows"].as_u64().unwrap_or(0),
    ))
}

/// Runs the benchmark; returns the contract's JSON object.
///
/// # Errors
/// Not root (e2e), a run failing, stel-query or DuckDB failing.
pub fn bench(quick: bool, secs: Option<f64>) -> Result<Value, String> {
    let secs = secs.unwrap_or(if quick { 4.0 } else { 30.0 });
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;

    // 1. Bytes per switch-day, per load.
    let mut by_load = serde_json::Map::new();
    let (mut b1, mut b60, mut acc_rates) = (0.0f64, 0.0f64, Vec::new());
    for pattern in [Pattern::Steady, Pattern::Ramp, Pattern::Microburst] {
        let t = Instant::now();
        let (one_s, one_m, rate) = load_bytes(pattern, secs, scratch.path())?;
        eprintln!(
            "rollup: {pattern:?}: {secs} s of design-rate switch time in {:.1} s: 1s tier {:.0} MB/switch-day, 1m tier {:.1} MB/switch-day; accumulator {:.0} M counters per CPU-s",
            t.elapsed().as_secs_f64(),
            one_s / 1e6,
            one_m / 1e6,
            rate / 1e6
        );
        b1 = b1.max(one_s);
        b60 = b60.max(one_m);
        acc_rates.push(rate);
        by_load.insert(
            format!("{pattern:?}").to_lowercase(),
            json!({"1s": one_s.round(), "1m": one_m.round()}),
        );
    }

    // 2. Exactness: the microburst load's raw files with and without tiers.
    let exact_dir = scratch.path().join("exact");
    let raw_dir = scratch.path().join("raw");
    {
        let raw = ParquetSink::start(lossless(ParquetSinkConfig::for_test(&exact_dir)), None)
            .map_err(|e| e.to_string())?;
        let mut rw = RollupWriter::new(
            &RollupConfig::for_test(),
            exact_dir.clone(),
            "bench".into(),
            BudgetHandle::default(),
        )
        .map_err(|e| e.to_string())?;
        // Raw and tiers must hold the same samples: a batch the raw sink refuses is an error.
        let mut refused = 0u64;
        design_stream(Pattern::Microburst, if quick { 3.0 } else { 10.0 }, |b| {
            rw.push(b);
            let copy = CounterBatch::new(
                Arc::clone(&b.schema),
                b.ts.clone(),
                b.values.clone(),
                b.part_masks.clone(),
            )
            .expect("same shape");
            if raw.submit(Arc::new(copy)).is_err() {
                refused += 1;
            }
        });
        rw.finish();
        raw.shutdown().map_err(|e| e.to_string())?;
        if refused > 0 || rw.totals().write_errors > 0 {
            return Err(format!(
                "exactness data: the raw sink refused {refused} batches, {} tier write errors",
                rw.totals().write_errors
            ));
        }
        std::fs::create_dir_all(&raw_dir).map_err(|e| e.to_string())?;
        let st = Command::new("cp")
            .arg("-rl")
            .arg(exact_dir.join("profile=stel_demo"))
            .arg(&raw_dir)
            .status()
            .map_err(|e| e.to_string())?;
        if !st.success() {
            return Err("cp -rl of the raw tree failed".into());
        }
    }
    let bin = stel_query()?;
    let mut exact = true;
    for q in [
        vec!["rates", "-r", "1s"],
        vec!["top", "--by", "bursts", "-n", "1000", "--last", "1h"],
        vec![
            "top",
            "--by",
            "bursts",
            "--threshold",
            "50",
            "-n",
            "1000",
            "--last",
            "1h",
        ],
    ] {
        let mut args = q.clone();
        if q[0] == "rates" {
            args.extend(["--last", "1h"]);
        }
        let (_, a, sa) = ask(&bin, &exact_dir, &args)?;
        let (_, b, sb) = ask(&bin, &raw_dir, &args)?;
        let same = a == b && !a.is_empty();
        eprintln!(
            "rollup: exact: stel-query {} on tiers ({}) vs raw ({}): {} rows, {}",
            args.join(" "),
            sa["tier"],
            sb["tier"],
            a.len(),
            if same { "identical" } else { "DIFFERENT" }
        );
        if !same {
            if let Some((x, y)) = a.iter().zip(&b).find(|(x, y)| x != y) {
                eprintln!("rollup: exact: first difference: tiers {x} vs raw {y}");
            }
        }
        exact &= same;
    }

    // 3. A week of 1 min tiers; the questions; DuckDB.
    let week = scratch.path().join("week");
    let interval = if quick { 1_000_000_000 } else { 100_000_000 };
    let t = Instant::now();
    let (n, end) = write_week(&week, interval)?;
    eprintln!(
        "rollup: a week of tiers: {:.2} G counters every {} ms through the rollup writer in {:.1} s",
        n as f64 / 1e9,
        interval / 1_000_000,
        t.elapsed().as_secs_f64()
    );
    let runs = 3;
    let mut q24 = Vec::new();
    let mut q7 = Vec::new();
    let mut tiers24 = Value::Null;
    let mut rows24 = 0;
    for _ in 0..runs {
        let (s, rows, sum) = ask(&bin, &week, &["rates", "--last", "24h", "-r", "1m"])?;
        q24.push(s);
        rows24 = rows.len();
        tiers24 = sum["tier"].clone();
        let (s7, rows7, sum7) = ask(&bin, &week, &["top", "--by", "bursts", "--since", "7d"])?;
        q7.push(s7);
        if rows7.is_empty() || sum7["tier"].as_str().is_none_or(|t| !t.contains("1m")) {
            return Err(format!(
                "top --by bursts --since 7d: {} rows from {}",
                rows7.len(),
                sum7["tier"]
            ));
        }
    }
    let (q24, q7) = (median(q24), median(q7));
    eprintln!("rollup: stel-query rates --last 24h -r 1m: {q24:.3} s ({rows24} rows from {tiers24}); top --by bursts --since 7d: {q7:.3} s");
    // The same window: the last 24 h of data, on whole minutes.
    let to = end.div_euclid(60_000_000_000) * 60_000_000_000;
    let (duck, duck_rows) = duckdb_rates(&week, to - NS_PER_DAY, to)?;
    eprintln!("rollup: DuckDB, the same 24 h per-minute rates on the same tier files: {duck:.3} s ({duck_rows} rows)");

    // 4. The daemon's CPU with and without rollups.
    let (added, base, shed, runs_json) = cpu_added(quick, 1.0, if quick { 2 } else { 3 })?;
    eprintln!(
        "rollup: daemon CPU added by rollups: {added:.2} CPU-s per G counters (base {base:.2}), rollup sink shed {shed}"
    );
    Ok(json!({
        "bench": "rollup",
        "daemon_cpu_s_per_g_added": (added * 100.0).round() / 100.0,
        "daemon_cpu_s_per_g_base": (base * 100.0).round() / 100.0,
        "shed": shed,
        "bytes_per_switch_day": {"1s": b1.round(), "1m": b60.round()},
        "bytes_per_switch_day_by_load": by_load,
        "query_24h_rates_s": (q24 * 1000.0).round() / 1000.0,
        "query_7d_bursts_s": (q7 * 1000.0).round() / 1000.0,
        "duckdb_24h_rates_s": (duck * 1000.0).round() / 1000.0,
        "query_24h_rates_tier": tiers24,
        "exact": exact,
        "accumulate_counters_per_cpu_s": acc_rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "design_secs_per_load": secs,
        "e2e_runs": runs_json.len(),
    }))
}
