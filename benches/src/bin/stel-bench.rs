//! stel-bench: benchmark runner. Prints progress on stderr and, as the last line on stdout,
//! exactly one JSON object with the figures (see DESIGN.md, "Benchmark contract"). Every figure
//! is the median of several runs and is compared with a baseline measured in the same run.
use std::{process::ExitCode, time::Instant};

use clap::{Parser, Subcommand};
use serde_json::json;
use stel_benches as w;
use stel_ingest::decode::{portable_bswap, select_bswap};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs stel's benchmarks. `--quick` finishes in under a minute on 2 cores.
///
/// Example: cargo run --release -p stel-benches --bin stel-bench -- decode --quick
#[derive(Debug, Parser)]
#[command(name = "stel-bench", version, verbatim_doc_comment)]
struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// IPFIX decode on one core: our decoder vs netflow_parser on the same design-rate messages
    /// (64 ports × 30 stats, 4 snapshots per message).
    ///
    /// Example: stel-bench decode --quick
    Decode {
        /// Fewer, shorter runs.
        #[arg(long)]
        quick: bool,
    },
    /// Through the kernel: emulator → NETLINK_USERSOCK multicast → eBPF filter → io_uring
    /// reader → decoders, paced at `--rate` × the design rate, and the plain recv loop as the
    /// baseline in the same run; plus each reader's drain rate. Needs root.
    ///
    /// Example: sudo stel-bench netlink --quick --rate 2
    Netlink {
        /// Fewer, shorter runs.
        #[arg(long)]
        quick: bool,
        /// Emulator rate as a multiple of the design rate (64 ports × 30 stats / 10 µs).
        #[arg(long, default_value_t = 2.0)]
        rate: f64,
    },
    /// The whole daemon: emulator → kernel → eBPF filter → io_uring → decoder → Parquet and
    /// COUNTERS_DB (a private redis-server), paced at `--rate` × the design rate. Needs root.
    ///
    /// Example: sudo stel-bench e2e --quick --rate 1
    E2e {
        /// A shorter run.
        #[arg(long)]
        quick: bool,
        /// Emulator rate as a multiple of the design rate.
        #[arg(long, default_value_t = 2.0)]
        rate: f64,
    },
    /// stel-query's `rates` scan vs DuckDB over the same Parquet files (64 ports × 30 stats at
    /// 10 µs). Runs `stel-query-bench` through cargo, so this binary never links DataFusion.
    ///
    /// Example: stel-bench query --quick
    Query {
        /// A short window (0.5 s of snapshots).
        #[arg(long)]
        quick: bool,
    },
    /// Fleet: 100 emulated switches (mixed templates, some with queues/PGs), one real
    /// stel-ingestd each uploading to a local S3 (moto), then the fleet questions (top ports by
    /// microburst time, per-switch drops) on Sail in local-cluster mode through stel-query
    /// --engine spark, checked against stel-query's local engine on the same lake. Needs root.
    ///
    /// Example: sudo stel-bench fleet --quick --switches 20
    Fleet {
        /// Less data per switch (the whole run under a minute once built).
        #[arg(long)]
        quick: bool,
        /// Switches in the fleet.
        #[arg(long, default_value_t = 100)]
        switches: usize,
    },
    /// OTLP sink: the design session's counters exported over OTLP/gRPC to a real local
    /// receiver (HTTP/2, every request's protobuf walked to its points), every point accounted
    /// for; plus the encoder alone on one core.
    ///
    /// Example: stel-bench otlp --quick --points-per-request 10000 --in-flight 2
    Otlp {
        /// Fewer, shorter runs.
        #[arg(long)]
        quick: bool,
        /// Data points per request.
        #[arg(long, default_value_t = 10_000)]
        points_per_request: usize,
        /// Requests in flight.
        #[arg(long, default_value_t = 2)]
        in_flight: usize,
    },
    /// Parquet sink end to end (queue → writer thread → wide transpose → encode → fsync →
    /// rename) on the emulator's design-rate counters, vs a raw 8 B/sample write in the same run.
    ///
    /// Example: stel-bench parquet --quick --sweep
    Parquet {
        /// Fewer, shorter runs.
        #[arg(long)]
        quick: bool,
        /// Also measure every encoding × codec × pattern and row-group size (the table in
        /// store/PERSISTENCE.md).
        #[arg(long)]
        sweep: bool,
    },
    /// Rollup tiers: the daemon's CPU with and without them (e2e, same run), what they shed,
    /// bytes per switch-day per tier on the emulator's steady, ramp and microburst loads, and
    /// queries on a day / week of tiers (stel-query vs DuckDB on the same files). Needs root.
    ///
    /// Example: sudo stel-bench rollup --quick
    Rollup {
        /// Shorter runs.
        #[arg(long)]
        quick: bool,
        /// Seconds of design-rate switch time per load for the byte figures.
        #[arg(long)]
        secs: Option<f64>,
    },
    /// INT report decode on one core (AmLight 5-hop reports) vs a plain per-report parse in
    /// the same run; the end-to-end figures come with the daemon's INT source.
    ///
    /// Example: stel-bench int --quick
    Int {
        /// Fewer, shorter runs.
        #[arg(long)]
        quick: bool,
    },
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn decode(quick: bool) -> Result<serde_json::Value, String> {
    let (runs, passes) = if quick { (7, 20) } else { (15, 40) };
    let (template, data, emu) = w::design_messages(400);
    let per_pass = (emu.truth.samples) as f64;
    eprintln!(
        "decode: {} messages, {:.1} MB, {:.2} M counters per pass; {runs} runs × {passes} passes",
        emu.truth.messages,
        data.len() as f64 / 1e6,
        per_pass / 1e6
    );
    let (best, best_name) = select_bswap();
    let mut results = Vec::new();
    for (name, f) in [(best_name, best), ("portable", portable_bswap as _)] {
        let mut d = w::design_decoder(&emu, Some(f));
        let mut spare = Vec::new();
        w::decode_pass(&mut d, &data, &mut spare); // warm-up: buffers allocated, caches warm
        let mut rates = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            let mut n = 0;
            for _ in 0..passes {
                n += w::decode_pass(&mut d, &data, &mut spare);
            }
            rates.push(n as f64 / t.elapsed().as_secs_f64());
        }
        if d.stats().counters != emu.truth.samples * (1 + runs * passes) as u64
            || d.stats().malformed_total() != 0
        {
            return Err(format!("decoder miscounted: {:?}", d.stats()));
        }
        let m = median(rates);
        eprintln!("decode: stel ({name}) {:.0} M counters/s", m / 1e6);
        results.push(m);
        if best_name == "portable" {
            results.push(m);
            break;
        }
    }
    // netflow_parser on a prefix of the same messages (it is ~50× slower).
    let msg_len = data.len() / emu.truth.messages as usize;
    let sub = &data[..msg_len * 40];
    let want = (emu.truth.samples / emu.truth.messages) * 40;
    let mut rates = Vec::new();
    for _ in 0..runs.min(5) {
        let mut p = w::netflow_parser_with_template(&template);
        let t = Instant::now();
        let n = w::netflow_parser_pass(&mut p, sub);
        let el = t.elapsed().as_secs_f64();
        if n != want {
            return Err(format!(
                "netflow_parser decoded {n} counters, expected {want}"
            ));
        }
        rates.push(n as f64 / el);
    }
    let nf = median(rates);
    eprintln!("decode: netflow_parser {:.1} M counters/s", nf / 1e6);
    let bytes_per_counter = data.len() as f64 / per_pass;
    Ok(json!({
        "bench": "decode",
        "counters_per_s": results[0].round(),
        "bytes_per_s": (results[0] * bytes_per_counter).round(),
        "netflow_parser_counters_per_s": nf.round(),
        "ratio_vs_netflow_parser": (results[0] / nf * 100.0).round() / 100.0,
        "bswap": best_name,
        "portable_counters_per_s": results[1].round(),
        "runs": runs,
        "counters_per_run": per_pass * passes as f64,
    }))
}

/// `query`: stel-query's rates scan vs DuckDB over the same files. The logic lives in stel-query
/// (`stel-query-bench`, a binary of the stel-query crate), which this spawns through cargo so that stel-bench itself never
/// links DataFusion.
fn query(quick: bool) -> Result<serde_json::Value, String> {
    // The bench runs the `stel-query` binary too (the CLI and `stel-query serve`): build both
    // binaries of the crate in the one profile, `release-query`, the one `deploy/demo.sh` and
    // the README build stel-query in, so after theirs this build only adds stel-query-bench.
    let st = stel_testkit::nested_cargo()
        .args([
            "build",
            "--profile",
            "release-query",
            "-q",
            "-p",
            "stel-query",
            "--bins",
        ])
        .status()
        .map_err(|e| format!("query: cannot run cargo: {e}"))?;
    if !st.success() {
        return Err(format!("query: building stel-query failed ({st})"));
    }
    let mut args = vec![
        "run",
        "--profile",
        "release-query",
        "-q",
        "-p",
        "stel-query",
        "--bin",
        "stel-query-bench",
        "--",
    ];
    if quick {
        args.push("--quick");
    }
    let out = stel_testkit::nested_cargo()
        .args(&args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("query: cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("query: stel-query-bench failed ({})", out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).map_err(|e| format!("query: bad result line {last:?}: {e}"))
}

fn main() -> ExitCode {
    let a = Args::parse();
    // As the daemon does (see the function): the Parquet writer faults in 2 MiB per column per
    // row group otherwise.
    stel_ingest::sys::disable_transparent_huge_pages();
    let r = match a.bench {
        Bench::Decode { quick } => decode(quick),
        Bench::Netlink { quick, rate } => w::netlink::bench(quick, rate),
        Bench::E2e { quick, rate } => w::e2e::bench(quick, rate),
        Bench::Parquet { quick, sweep } => w::parquet::bench(quick, sweep),
        Bench::Query { quick } => query(quick),
        Bench::Fleet { quick, switches } => w::fleet::bench(quick, switches),
        Bench::Otlp {
            quick,
            points_per_request,
            in_flight,
        } => w::otlp::bench(quick, points_per_request, in_flight),
        Bench::Int { quick } => w::int::bench(quick),
        Bench::Rollup { quick, secs } => w::rollup::bench(quick, secs),
    };
    match r {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stel-bench: {e}");
            ExitCode::from(2)
        }
    }
}
