//! `stel-query-bench` (`stel-bench query` runs it through cargo): the `rates` question asked of
//! stel-query's engine and of DuckDB over the same Parquet files in the same run. A binary of
//! its own so the benchmark is not compiled into the `stel-query` library or the installed CLI.
//!
//! The contract's window is one hour of a 64-port × 30-stat PORT session at full resolution. At
//! the design interval (10 µs) that hour is 360 M snapshots, 691 G samples (~44 GB of rows in
//! memory before encoding) — more than a 2-core machine can generate inside a benchmark run. So
//! the bench generates the **whole hour** at a coarser stream interval (`--interval`, default
//! 10 ms → 360 k snapshots, 691 M samples; `--quick` 100 ms → 36 k snapshots, 69 M samples),
//! synthetic monotonic counters written with the store's Parquet sink (the daemon's writer:
//! production encoding, codec, row-group and page sizes; files rotate at the hour and at the
//! size limit only, so the layout does not depend on how fast the generator ran).
//!
//! Both engines then answer the same question over the whole hour at the stream's own
//! resolution (`stel-query rates -r stream`): per snapshot and port, RX/TX bytes/s and
//! packets/s (unicast + non-unicast) from the last snapshot of each interval. stel-query runs
//! [`stel_query::cmd::rates::compute`] (catalog open + stream-interval probe + scan + rate math, like
//! the CLI); DuckDB runs `read_parquet(…, hive_partitioning=true)`, `arg_max` per bucket and
//! `lag()`, through `python3 -c`, timing only the query (result fetched as Arrow, not as Python
//! objects). Each side runs `--runs` times; medians are reported, and one rate is compared
//! between the two to show they answered the same question.
//!
//! `samples` (and so `samples_scanned_per_s`) counts every sample in the window (snapshots ×
//! 1,920), as the contract's "window of 64 ports × 30 stats" does; `samples_read` counts only the
//! columns the rates question needs.

#![recursion_limit = "256"]

use std::{
    process::{Command, ExitCode, Stdio},
    sync::Arc,
    time::Instant,
};

use serde_json::json;

#[path = "../synth.rs"]
mod synth;
use synth::{bench_schema, generate, START_NS};

use stel_query::{
    catalog::Catalog,
    cmd::rates::{compute, plan_inputs, Inputs},
    engine::{resolve_resolution, Progress},
    error::{Error, Result},
    rates,
    settings::{parse_duration_ns, TimeRange},
};

/// Benchmark arguments.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "stel-query-bench",
    version,
    about = "The rates question asked of stel-query and of DuckDB over the same Parquet files (stel-bench query runs this; prints one JSON object)"
)]
pub struct Args {
    /// Coarser stream interval (100ms): under a minute end to end on 2 cores.
    #[arg(long)]
    pub quick: bool,
    /// Window length in seconds (default 3600, the contract's hour).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Stream interval of the generated session (default 10ms; --quick 100ms). The query runs at
    /// this (the stream's own) resolution.
    #[arg(long)]
    pub interval: Option<String>,
    #[arg(long, default_value_t = 64)]
    pub ports: usize,
    #[arg(long, default_value_t = 30)]
    pub stats: usize,
    /// Timed runs per engine (median reported).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Keep the generated files here instead of a temp dir (reused when it already holds the
    /// same session and window).
    #[arg(long)]
    pub dir: Option<String>,
    /// Time stel-query's computation only (no DuckDB, no Flight SQL, no CLI run): for profiling
    /// it with `perf record`; the JSON has the stel-query fields only.
    #[arg(long)]
    pub stel_only: bool,
}

/// Parquet files and bytes under `root`.
fn parquet_files(root: &std::path::Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                files += 1;
                bytes += std::fs::metadata(&p)?.len();
            }
        }
    }
    Ok((files, bytes))
}

/// The DuckDB side of the question: per bucket of `res_ns`, the last snapshot's value of each
/// rate input (`arg_max`), then per port RX/TX bytes/s and packets/s against the previous bucket
/// (`lag`), the same formulas as `stel_query::rates`. Output columns `rx_bps_<i>`,
/// `tx_bps_<i>`, `rx_pps_<i>`, `tx_pps_<i>` for the i-th object.
fn duckdb_sql(
    root: &str,
    cols: &[String],
    inputs: &[Inputs],
    r: &TimeRange,
    res_ns: i64,
) -> String {
    let agg: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(k, c)| format!("arg_max(\"{c}\", ts) AS c{k}"))
        .collect();
    let rate = |name: String, parts: Vec<usize>| -> Option<String> {
        if parts.is_empty() {
            return None;
        }
        let sum = parts
            .iter()
            .map(|k| format!("c{k}"))
            .collect::<Vec<_>>()
            .join(" + ");
        Some(format!(
            "(({sum}) - lag({sum}) OVER w) * 1e9 / (epoch_ns(t) - epoch_ns(lag(t) OVER w)) AS {name}"
        ))
    };
    let mut sel = Vec::new();
    for (i, inp) in inputs.iter().enumerate() {
        sel.extend(rate(
            format!("rx_bps_{i}"),
            inp.rx_octets.into_iter().collect(),
        ));
        sel.extend(rate(
            format!("tx_bps_{i}"),
            inp.tx_octets.into_iter().collect(),
        ));
        sel.extend(rate(format!("rx_pps_{i}"), inp.rx_pkts.clone()));
        sel.extend(rate(format!("tx_pps_{i}"), inp.tx_pkts.clone()));
    }
    format!(
        "WITH b AS (SELECT epoch_ns(ts) // {res_ns} AS bucket, max(ts) AS t, {} \
         FROM read_parquet('{root}/profile=bench/group=PORT/*/*/*.parquet', hive_partitioning = true, union_by_name = true) \
         WHERE {} GROUP BY 1) \
         SELECT bucket, {} FROM b WINDOW w AS (ORDER BY bucket) ORDER BY bucket",
        agg.join(", "),
        stel_query::catalog::time_filter_sql(r),
        sel.join(", ")
    )
}

const DUCK_PY: &str = r#"
import json, os, sys, time, duckdb
a = json.load(sys.stdin)
con = duckdb.connect()
con.execute("SET TimeZone = 'UTC'")
con.execute("SET enable_progress_bar = false")
def fetch(res):
    # The result as Arrow (not Python objects): what an engine-to-engine comparison should time.
    for m in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        f = getattr(res, m, None)
        if f is not None:
            return f()
    raise SystemExit("this duckdb has no Arrow result API")
times = []
tbl = None
for _ in range(a["runs"]):
    t = time.perf_counter()
    tbl = fetch(con.execute(a["sql"]))
    times.append(time.perf_counter() - t)
n = tbl.num_rows
last = {k: tbl.column(k)[n - 1].as_py() for k in a["check"]} if n else {}
print(json.dumps({"times": times, "buckets": n, "last": last,
                  "version": duckdb.__version__,
                  "threads": con.execute("SELECT current_setting('threads')").fetchone()[0]}))
# Skip interpreter teardown: DuckDB's and pyarrow's native thread pools can abort it
# ("terminate called without an active exception", apache/arrow#34314) after the answer is out.
sys.stdout.flush()
os._exit(0)
"#;

/// Timings of the rates question asked of the `stel-query` binary and of `stel-query serve`.
struct FlightRuns {
    cli: Vec<f64>,
    flight: Vec<f64>,
    rows: u64,
}

/// The `stel-query` binary beside this one (built by `cargo build -p stel-query --bins`).
fn stel_query_bin() -> Result<std::path::PathBuf> {
    let bin = std::env::current_exe()?.with_file_name("stel-query");
    if !bin.exists() {
        return Err(Error::Usage(format!(
            "{} is missing: build it with `cargo build --profile release-query -p stel-query --bins`",
            bin.display()
        )));
    }
    Ok(bin)
}

/// The rates question over `r` at stream resolution, `runs` times each, interleaved: the CLI
/// (`stel-query rates -r stream --csv`, its whole output read from a pipe) and a Flight SQL
/// client (arrow-flight's) fetching `rates('PORT', 'stream')` from `stel-query serve` over
/// loopback, every batch decoded. The server is started once (its catalog open is not timed);
/// each CLI run opens the catalog, as a user's would.
async fn flightsql(root: &str, r: &TimeRange, runs: usize, want_rows: u64) -> Result<FlightRuns> {
    use arrow_flight::sql::client::FlightSqlServiceClient;
    use futures::TryStreamExt;
    use std::io::{BufRead, Read};

    let bin = stel_query_bin()?;
    let mut server = Command::new(&bin)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--query-timeout",
            "10m",
            "-d",
            root,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(
        server
            .stdout
            .take()
            .ok_or_else(|| Error::Usage("no stdout".into()))?,
    )
    .read_line(&mut line)?;
    let addr = line
        .split("://")
        .nth(1)
        .and_then(|x| x.split_whitespace().next())
        .ok_or_else(|| Error::Usage(format!("stel-query serve printed no address: {line:?}")))?
        .to_string();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| Error::Usage(e.to_string()))?
        .connect()
        .await
        .map_err(|e| Error::Usage(format!("connecting to {addr}: {e}")))?;
    let mut client = FlightSqlServiceClient::new(channel);
    let (from, to) = (
        stel_query::settings::fmt_ts(r.from_ns),
        stel_query::settings::fmt_ts(r.to_ns),
    );
    let sql = format!("SELECT * FROM rates('PORT', 'stream') WHERE ts >= '{from}' AND ts < '{to}'");
    let mut out = FlightRuns {
        cli: Vec::new(),
        flight: Vec::new(),
        rows: 0,
    };
    let result = async {
        for i in 0..runs {
            let t = Instant::now();
            let mut child = Command::new(&bin)
                .args(["rates", "-r", "stream", "--csv", "--from", &from, "--to", &to, "-d", root])
                .stdout(Stdio::piped())
                .spawn()?;
            let mut sink = Vec::with_capacity(1 << 20);
            let mut bytes = 0u64;
            let mut stdout = child.stdout.take().ok_or_else(|| Error::Usage("no stdout".into()))?;
            loop {
                sink.clear();
                let n = (&mut stdout).take(1 << 20).read_to_end(&mut sink)?;
                if n == 0 {
                    break;
                }
                bytes += n as u64;
            }
            if !child.wait()?.success() {
                return Err(Error::Usage("stel-query rates failed".into()));
            }
            out.cli.push(t.elapsed().as_secs_f64());

            let t = Instant::now();
            let info = client
                .execute(sql.clone(), None)
                .await
                .map_err(|e| Error::Usage(format!("Flight SQL: {e}")))?;
            let mut rows = 0u64;
            for ep in info.endpoint {
                let ticket = ep.ticket.ok_or_else(|| Error::Usage("no ticket".into()))?;
                let mut stream = client
                    .do_get(ticket)
                    .await
                    .map_err(|e| Error::Usage(format!("Flight SQL: {e}")))?;
                while let Some(b) = stream
                    .try_next()
                    .await
                    .map_err(|e| Error::Usage(format!("Flight SQL: {e}")))?
                {
                    rows += b.num_rows() as u64;
                }
            }
            out.flight.push(t.elapsed().as_secs_f64());
            out.rows = rows;
            eprintln!(
                "stel-bench query: run {i}: stel-query rates {:.3} s ({bytes} bytes of CSV), Flight SQL {:.3} s ({rows} rows)",
                out.cli[i], out.flight[i]
            );
            if rows != want_rows {
                eprintln!("stel-bench query: Flight SQL answered {rows} rows, the engine {want_rows}");
            }
        }
        Ok(())
    }
    .await;
    // SIGTERM: the server prints its counts and exits.
    let _ = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let _ = server.wait();
    result.map(|()| out)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn agree(x: Option<f64>, y: Option<f64>) -> bool {
    match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-6 * y.abs().max(1.0),
        _ => false,
    }
}

/// # Errors
/// Generation, query or DuckDB failures (a missing `duckdb` Python module says how to install it).
async fn run(a: Args) -> Result<ExitCode> {
    let seconds = a.seconds.unwrap_or(3600.0);
    let interval = a
        .interval
        .clone()
        .unwrap_or_else(|| if a.quick { "100ms" } else { "10ms" }.to_string());
    let interval_ns = parse_duration_ns(&interval)?;
    let runs = a.runs.unwrap_or(if a.quick { 3 } else { 5 }).max(1);
    let rows = (seconds * 1e9 / interval_ns as f64).round() as usize;
    if rows < 2 {
        return Err(Error::Usage(format!(
            "a {seconds} s window at {interval} is fewer than two snapshots"
        )));
    }
    let tmp = tempfile::TempDir::new()?;
    let root = match &a.dir {
        Some(d) => std::path::PathBuf::from(d),
        None => tmp.path().to_path_buf(),
    };
    let schema = Arc::new(bench_schema(a.ports, a.stats));
    let width = schema.width();
    let manifest = json!({"ports": a.ports, "stats": a.stats, "rows": rows,
                          "interval_ns": interval_ns, "start_ns": START_NS, "v": 2});
    let manifest_path = root.join("bench.json");
    let reuse = std::fs::read(&manifest_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|m| m == manifest);
    let t0 = Instant::now();
    if reuse {
        eprintln!(
            "stel-bench query: reusing {} ({rows} snapshots × {width} counters at {interval})",
            root.display()
        );
    } else {
        eprintln!(
            "stel-bench query: generating {seconds} s of {} ports × {} stats at {interval} \
             ({rows} snapshots, {} samples; the design interval 10 µs would be {} samples) into {}",
            a.ports,
            width / a.ports.max(1),
            rows as u64 * width as u64,
            (seconds * 1e5) as u64 * width as u64,
            root.display()
        );
        if root.join("profile=bench").exists() {
            std::fs::remove_dir_all(root.join("profile=bench"))?;
        }
        generate(&root, &schema, rows, interval_ns).map_err(Error::Usage)?;
        std::fs::write(&manifest_path, manifest.to_string())?;
    }
    let generate_s = t0.elapsed().as_secs_f64();
    let (files, bytes) = parquet_files(&root)?;
    let samples = rows as u64 * width as u64;
    eprintln!(
        "stel-bench query: {files} Parquet files, {:.1} MB ({:.4} B/sample){}",
        bytes as f64 / 1e6,
        bytes as f64 / samples as f64,
        if reuse {
            String::new()
        } else {
            format!(", written in {generate_s:.1} s")
        }
    );
    let r = TimeRange {
        from_ns: START_NS,
        to_ns: START_NS + rows as i64 * interval_ns,
    };
    let objects: Vec<String> = (0..a.ports).map(|p| format!("Ethernet{}", 4 * p)).collect();
    let root_s = root.to_string_lossy().to_string();

    // stel-query: open the catalog (lists files, reads footers), find the stream's interval
    // and compute, like `stel-query rates -r stream` does.
    let mut ours = Vec::new();
    let mut our_last = (None, None);
    let mut scanned = 0;
    let mut rate_rows = 0u64;
    let mut res_ns = interval_ns;
    let mut cols_read = 0;
    let mut plan = None;
    for i in 0..runs {
        let t = Instant::now();
        let cat = Catalog::open(&root_s, true).await?;
        let s = cat.session(Some("bench"), "PORT")?;
        res_ns = resolve_resolution(&cat, s, &r, Some("stream"))
            .await?
            .unwrap_or(interval_ns);
        let progress = Progress::new("bench");
        let mut last = (None, None);
        let mut n_rows = 0u64;
        let c = compute(
            &cat,
            s,
            &objects,
            &rates::PORT,
            &r,
            Some(res_ns),
            None,
            &progress,
            |row| {
                n_rows += 1;
                if row.object == "Ethernet0" {
                    last = (row.rates.rx_bps, row.rates.rx_pps);
                }
                Ok(())
            },
        )
        .await?;
        let (n, nc) = (c.scanned, c.columns);
        ours.push(t.elapsed().as_secs_f64());
        eprintln!(
            "stel-bench query: stel-query run {i}: {:.3} s, {n} snapshots, {n_rows} rate rows",
            ours[i]
        );
        scanned = n;
        cols_read = nc;
        rate_rows = n_rows;
        our_last = last;
        if plan.is_none() {
            plan = Some(plan_inputs(s, &objects, &rates::PORT));
        }
    }
    if res_ns != interval_ns {
        return Err(Error::Usage(format!(
            "stel-query measured a stream interval of {res_ns} ns, generated {interval_ns} ns"
        )));
    }
    if a.stel_only {
        println!(
            "{}",
            json!({"bench": "query", "stel_only": true, "quick": a.quick, "runs": runs,
                   "stel_query_runs_s": ours, "stel_query_s": median(&ours),
                   "rate_rows": rate_rows, "snapshots": scanned, "columns_read": cols_read})
        );
        return Ok(ExitCode::SUCCESS);
    }

    // DuckDB: same files, same window, same buckets, same formulas.
    let (cols, inputs) = plan.unwrap_or_default();
    let sql = duckdb_sql(&root_s, &cols, &inputs, &r, res_ns);
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
        stdin.write_all(
            json!({"sql": sql, "runs": runs, "check": ["rx_bps_0", "rx_pps_0"]})
                .to_string()
                .as_bytes(),
        )?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(Error::Usage(format!(
            "DuckDB baseline failed (install it with `pip install duckdb pyarrow` or deploy/setup.sh --test): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    // The last line: DuckDB may print progress before it.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let duck: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .map_err(|e| Error::Usage(format!("DuckDB baseline output: {e}: {stdout}")))?;
    let dt: Vec<f64> = duck["times"]
        .as_array()
        .map(|v| v.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default();
    if dt.is_empty() {
        return Err(Error::Usage("DuckDB baseline reported no timings".into()));
    }
    for (i, t) in dt.iter().enumerate() {
        eprintln!("stel-bench query: duckdb run {i}: {t:.3} s");
    }
    let ours_med = median(&ours);
    let duck_med = median(&dt);
    let scanned_samples = scanned * width as u64;
    let duck_last = (
        duck["last"]["rx_bps_0"].as_f64(),
        duck["last"]["rx_pps_0"].as_f64(),
    );
    let answers_agree = agree(our_last.0, duck_last.0) && agree(our_last.1, duck_last.1);
    let flight = flightsql(&root_s, &r, runs, rate_rows).await?;
    let cli_med = median(&flight.cli);
    let fl_med = median(&flight.flight);
    eprintln!(
        "stel-bench query: the rates question end to end: `stel-query rates -r stream --csv` {cli_med:.3} s, Flight SQL `rates('PORT', 'stream')` {fl_med:.3} s ({} rows), ratio {:.2}",
        flight.rows,
        fl_med / cli_med
    );
    eprintln!(
        "stel-bench query: medians: stel-query {ours_med:.3} s ({:.0} M samples/s), DuckDB {duck_med:.3} s ({:.0} M samples/s), ratio {:.2}; answers agree: {answers_agree}",
        scanned_samples as f64 / ours_med / 1e6,
        scanned_samples as f64 / duck_med / 1e6,
        duck_med / ours_med
    );
    let v = json!({
        "bench": "query",
        "quick": a.quick,
        "window_s": seconds,
        "interval_ns": interval_ns,
        "resolution_ns": res_ns,
        "design_window_s": 3600,
        "design_interval_ns": 10_000,
        "ports": a.ports,
        "stats": width / a.ports.max(1),
        "snapshots": scanned,
        "samples": scanned_samples,
        "samples_read": scanned * cols_read as u64,
        "columns_read": cols_read + 1,
        "rate_rows": rate_rows,
        "duckdb_rate_rows": duck["buckets"].as_u64().map(|b| b.saturating_sub(1) * a.ports as u64),
        "parquet_files": files,
        "parquet_bytes": bytes,
        "bytes_per_sample": bytes as f64 / samples as f64,
        "generate_s": if reuse { None } else { Some(generate_s) },
        "runs": runs,
        "stel_query_runs_s": ours,
        "duckdb_runs_s": dt,
        "stel_query_s": ours_med,
        "duckdb_s": duck_med,
        "samples_scanned_per_s": scanned_samples as f64 / ours_med,
        "duckdb_samples_scanned_per_s": scanned_samples as f64 / duck_med,
        "ratio_vs_duckdb": duck_med / ours_med,
        "duckdb_version": duck["version"],
        "duckdb_threads": duck["threads"],
        "answers_agree": answers_agree,
        "stel_last_rx_bps_ethernet0": our_last.0,
        "duckdb_last_rx_bps_ethernet0": duck_last.0,
        "stel_last_rx_pps_ethernet0": our_last.1,
        "cli_runs_s": flight.cli,
        "flightsql_runs_s": flight.flight,
        "cli_s": cli_med,
        "flightsql_s": fl_med,
        "flightsql_ratio_vs_cli": fl_med / cli_med,
        "flightsql_ratio_vs_engine": fl_med / ours_med,
        "flightsql_rows": flight.rows,
        "flightsql_answers_agree": flight.rows == rate_rows,
        "duckdb_last_rx_pps_ethernet0": duck_last.1,
    });
    println!("{v}");
    Ok(ExitCode::SUCCESS)
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let a = <Args as clap::Parser>::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stel-query-bench: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(a)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stel-query-bench: {e}");
            ExitCode::from(2)
        }
    }
}
