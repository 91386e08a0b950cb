//! `stel-query bench` (hidden; `stel-bench query` runs it): the `rates` question asked of this
//! crate's engine and of DuckDB over the same Parquet files in the same run.
//!
//! It writes a 64-port × 30-stat PORT session at 10 µs (synthetic, monotonic counters) with the
//! store's Parquet sink — the daemon's writer, production settings — then asks both engines for per-port RX/TX byte rates at `window / 10`
//! resolution over the whole window: stel-query through [`crate::cmd::rates::compute`] (catalog
//! open + scan + rate math), DuckDB through `python3 -c` with `read_parquet(…,
//! hive_partitioning=true)`, `arg_max` per bucket and `lag()` — timing only the query, not the
//! interpreter start. Each side runs `--runs` times; medians are reported, and one rate is
//! compared between the two to show they answered the same question.
//!
//! A full-design window (1 h at 10 µs = 360 M snapshots, 691 G samples) cannot be generated on a
//! 2-core machine in a benchmark run; the default window is 5 s (`--seconds` to change it) and
//! the JSON says exactly what was scanned.

use std::{
    process::{Command, ExitCode, Stdio},
    sync::Arc,
    time::Instant,
};

use serde_json::json;
use stel_store::{
    parquet::{ParquetSink, ParquetSinkConfig},
    sai::{ObjectType, StatKey},
    CounterBatch, CounterColumn, SessionSchema,
};

use crate::{
    catalog::Catalog,
    cmd::rates::compute,
    engine::Progress,
    error::{Error, Result},
    rates,
    settings::TimeRange,
};

/// Benchmark arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A short window (under a minute end to end on 2 cores).
    #[arg(long)]
    pub quick: bool,
    /// Window length in seconds (default 5; --quick 0.5).
    #[arg(long)]
    pub seconds: Option<f64>,
    #[arg(long, default_value_t = 64)]
    pub ports: usize,
    #[arg(long, default_value_t = 30)]
    pub stats: usize,
    /// Timed runs per engine (median reported).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Keep the generated files here instead of a temp dir.
    #[arg(long)]
    pub dir: Option<String>,
}

const INTERVAL_NS: i64 = 10_000;
const START_NS: i64 = 1_700_000_000_000_000_000;
/// Snapshots per submitted batch (the decoder's default maximum).
const ROWS_PER_BATCH: usize = 8192;

/// The bench session's schema: `ports` PORT objects × the first `stats` PORT stats, which
/// include the rate inputs.
pub fn bench_schema(ports: usize, stats: usize) -> SessionSchema {
    let wanted = [
        "IF_IN_OCTETS",
        "IF_IN_UCAST_PKTS",
        "IF_IN_NON_UCAST_PKTS",
        "IF_OUT_OCTETS",
        "IF_OUT_UCAST_PKTS",
    ];
    let mut ids: Vec<u32> = wanted
        .iter()
        .filter_map(|n| ObjectType::Port.stat_by_name(n).map(|s| s.id))
        .collect();
    for s in ObjectType::Port.stats() {
        if ids.len() >= stats {
            break;
        }
        if !ids.contains(&s.id) {
            ids.push(s.id);
        }
    }
    ids.truncate(stats);
    let mut columns = Vec::new();
    for p in 0..ports {
        for id in &ids {
            columns.push(CounterColumn {
                label: p as u16 + 1,
                object: format!("Ethernet{}", 4 * p),
                key: StatKey {
                    object_type: ObjectType::Port as u32,
                    stat_id: *id,
                },
            });
        }
    }
    SessionSchema {
        profile: "bench".into(),
        group: "PORT".into(),
        domain: 0,
        template_ids: vec![256],
        part_offsets: vec![0],
        columns,
        generation: 1,
    }
}

/// Writes `rows` snapshots of `schema` under `root` with the store's Parquet sink (the daemon's
/// writer, production encoding and codec). Returns the bytes written.
fn generate(root: &std::path::Path, schema: &Arc<SessionSchema>, rows: usize) -> Result<u64> {
    let cfg = ParquetSinkConfig {
        dir: root.to_path_buf(),
        block_timeout_ms: 600_000,
        memory_budget_bytes: 1 << 30,
        switch_name: Some("bench".into()),
        ..ParquetSinkConfig::default()
    };
    let sink = ParquetSink::start(cfg).map_err(|e| Error::Usage(format!("parquet sink: {e}")))?;
    let w = schema.width();
    let stat_names: Vec<String> = schema.columns.iter().map(|c| c.key.short_name()).collect();
    let mut state = vec![0u64; w];
    let mut lcg: u64 = 0x9E37_79B9_7F4A_7C15;
    let per_port = schema
        .columns
        .iter()
        .filter(|x| x.label == 1)
        .count()
        .max(1);
    let mut row = 0usize;
    while row < rows {
        let n = ROWS_PER_BATCH.min(rows - row);
        let mut ts = Vec::with_capacity(n);
        let mut values = Vec::with_capacity(n * w);
        for r in 0..n {
            ts.push(START_NS + (row + r) as i64 * INTERVAL_NS);
            for (c, name) in stat_names.iter().enumerate() {
                lcg = lcg
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let jitter = lcg >> 60;
                let port = c / per_port;
                let pkts = 10 + (port as u64 % 7) * 4 + jitter / 4;
                state[c] += match name.as_str() {
                    n if n.ends_with("OCTETS") => pkts * 800,
                    n if n.contains("PKTS") => pkts,
                    _ => u64::from(jitter == 0),
                };
                values.push(state[c]);
            }
        }
        sink.submit(Arc::new(CounterBatch {
            schema: Arc::clone(schema),
            ts,
            values,
            part_masks: Vec::new(),
        }))
        .map_err(|e| Error::Usage(format!("parquet sink shed a batch: {e:?}")))?;
        row += n;
    }
    let stats = sink
        .shutdown()
        .map_err(|e| Error::Usage(format!("parquet sink: {e}")))?;
    if stats.lost_samples() > 0 {
        return Err(Error::Usage(format!(
            "parquet sink lost {} samples",
            stats.lost_samples()
        )));
    }
    let mut bytes = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                bytes += std::fs::metadata(&p)?.len();
            }
        }
    }
    Ok(bytes)
}

fn duckdb_sql(root: &str, objects: &[String], r: &TimeRange, res_ns: i64) -> String {
    let mut agg = Vec::new();
    let mut sel = Vec::new();
    let mut k = 0;
    for o in objects {
        for st in ["IF_IN_OCTETS", "IF_OUT_OCTETS"] {
            agg.push(format!("arg_max(\"{o}.{st}\", ts) AS c{k}"));
            sel.push(format!(
                "(c{k} - lag(c{k}) OVER w) * 1e9 / (epoch_ns(t) - epoch_ns(lag(t) OVER w)) AS r{k}"
            ));
            k += 1;
        }
    }
    format!(
        "WITH b AS (SELECT epoch_ns(ts) // {} AS bucket, max(ts) AS t, {} \
         FROM read_parquet('{root}/profile=bench/group=PORT/*/*/*.parquet', hive_partitioning = true, union_by_name = true) \
         WHERE {} GROUP BY 1) \
         SELECT bucket, {} FROM b WINDOW w AS (ORDER BY bucket) ORDER BY bucket",
        res_ns,
        agg.join(", "),
        crate::catalog::time_filter_sql(r),
        sel.join(", ")
    )
}

const DUCK_PY: &str = r#"
import json, sys, time, duckdb
a = json.load(sys.stdin)
con = duckdb.connect()
con.execute("SET TimeZone = 'UTC'")
times = []
rows = None
for _ in range(a["runs"]):
    t = time.perf_counter()
    rows = con.execute(a["sql"]).fetchall()
    times.append(time.perf_counter() - t)
last = rows[-1] if rows else None
print(json.dumps({"times": times, "buckets": len(rows), "last_r0": (last[1] if last else None), "version": duckdb.__version__}))
"#;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// # Errors
/// Generation, query or DuckDB failures (a missing `duckdb` Python module says how to install it).
pub async fn run(a: Args) -> Result<ExitCode> {
    let seconds = a.seconds.unwrap_or(if a.quick { 0.5 } else { 5.0 });
    let runs = a.runs.unwrap_or(if a.quick { 3 } else { 5 }).max(1);
    let rows = (seconds * 1e9 / INTERVAL_NS as f64) as usize;
    let tmp = tempfile::TempDir::new()?;
    let root = match &a.dir {
        Some(d) => std::path::PathBuf::from(d),
        None => tmp.path().to_path_buf(),
    };
    let schema = Arc::new(bench_schema(a.ports, a.stats));
    eprintln!(
        "stel-bench query: writing {rows} snapshots × {} counters ({seconds} s at 10 µs) to {}",
        schema.width(),
        root.display()
    );
    let t0 = Instant::now();
    let bytes = generate(&root, &schema, rows)?;
    eprintln!(
        "stel-bench query: wrote {:.1} MB in {:.1} s",
        bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    let r = TimeRange {
        from_ns: START_NS,
        to_ns: START_NS + rows as i64 * INTERVAL_NS,
    };
    let res_ns = (r.len_ns() / 10).max(INTERVAL_NS);
    let objects: Vec<String> = (0..a.ports).map(|p| format!("Ethernet{}", 4 * p)).collect();
    let root_s = root.to_string_lossy().to_string();

    // stel-query: open the catalog (lists files, reads footers) and compute, like the CLI does.
    let mut ours = Vec::new();
    let mut our_last = None;
    let mut scanned = 0;
    for i in 0..runs {
        let t = Instant::now();
        let cat = Catalog::open(&root_s).await?;
        let s = cat.session(Some("bench"), "PORT")?;
        let progress = Progress::new("bench");
        let mut last = None;
        let (n, _) = compute(
            &cat,
            s,
            &objects,
            &rates::PORT,
            &r,
            Some(res_ns),
            None,
            &progress,
            |row| {
                if row.object == "Ethernet0" {
                    last = row.rates.rx_bps;
                }
                Ok(())
            },
        )
        .await?;
        ours.push(t.elapsed().as_secs_f64());
        eprintln!(
            "stel-bench query: stel-query run {i}: {:.3} s, {n} snapshots",
            ours[i]
        );
        scanned = n;
        our_last = last;
    }

    // DuckDB: same files, same window, same buckets.
    let sql = duckdb_sql(&root_s, &objects, &r, res_ns);
    let mut child = Command::new("python3")
        .args(["-c", DUCK_PY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Usage(format!("cannot run python3 for the DuckDB baseline: {e}")))?;
    {
        use std::io::Write;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| Error::Usage("no stdin".into()))?;
        stdin.write_all(json!({"sql": sql, "runs": runs}).to_string().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(Error::Usage(format!(
            "DuckDB baseline failed (install it with `pip install duckdb` or deploy/setup.sh --test): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let duck: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::Usage(format!("DuckDB baseline output: {e}")))?;
    let mut dt: Vec<f64> = duck["times"]
        .as_array()
        .map(|v| v.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default();
    if dt.is_empty() {
        return Err(Error::Usage("DuckDB baseline reported no timings".into()));
    }
    for (i, t) in dt.iter().enumerate() {
        eprintln!("stel-bench query: duckdb run {i}: {t:.3} s");
    }
    let ours_med = median(&mut ours);
    let duck_med = median(&mut dt);
    let samples = scanned * schema.width() as u64;
    let duck_last = duck["last_r0"].as_f64();
    let agree = match (our_last, duck_last) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-6 * y.abs().max(1.0),
        _ => false,
    };
    let v = json!({
        "bench": "query",
        "quick": a.quick,
        "window_s": seconds,
        "design_window_s": 3600,
        "ports": a.ports,
        "stats": schema.width() / a.ports.max(1),
        "snapshots": scanned,
        "samples_in_window": samples,
        "columns_read": a.ports * 5 + 1,
        "parquet_bytes": bytes,
        "resolution_ns": res_ns,
        "runs": runs,
        "stel_query_s": ours_med,
        "duckdb_s": duck_med,
        "samples_scanned_per_s": samples as f64 / ours_med,
        "duckdb_samples_scanned_per_s": samples as f64 / duck_med,
        "ratio_vs_duckdb": duck_med / ours_med,
        "duckdb_version": duck["version"],
        "answers_agree": agree,
        "stel_last_rx_bps_ethernet0": our_last,
        "duckdb_last_rx_bps_ethernet0": duck_last,
    });
    println!("{v}");
    Ok(ExitCode::SUCCESS)
}
