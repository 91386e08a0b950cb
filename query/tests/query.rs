//! stel-query end to end: emulator patterns with known answers → decoder → Parquet files in the
//! daemon's layout → the `stel-query` binary, checked against the SONiC formulas computed
//! directly from the emulated counters. The object-store test runs against a real S3 server
//! (moto's server mode) started here; if it cannot start, the test fails.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};
use stel_emu::{default_stats, EmuConfig, Pattern};

use serde_json::Value;
use stel_ingest::decode::CounterBatch;
use stel_store::{
    parquet::{ParquetSink, ParquetSinkConfig},
    sai::ObjectType,
};
use stel_testkit::{s3_client_env, MotoS3};

const START: i64 = 1_700_000_000_000_000_000;

/// Emulates `snapshots` snapshots, decodes them, and writes them with the store's Parquet sink
/// (the daemon's writer) under `root`, one published file per `rows_per_file` snapshots.
/// Returns the decoded counters as one batch (ground truth).
fn write_emulated(
    root: &Path,
    cfg: EmuConfig,
    snapshots: u64,
    rows_per_file: usize,
) -> CounterBatch {
    let b = stel_ingest::decode::emulated(cfg, snapshots).expect("emulator round trip");
    publish(root, &b, 0, rows_per_file);
    b
}

/// Writes snapshots `from..` of `b` through the store's `ParquetSink`, one sink run (start,
/// submit, shutdown = publish) per `rows_per_file` snapshots, so file boundaries are known.
fn publish(root: &Path, b: &CounterBatch, from: usize, rows_per_file: usize) {
    let w = b.schema.width();
    let mut start = from;
    while start < b.ts.len() {
        let sink =
            ParquetSink::start(ParquetSinkConfig::for_test(root), None).expect("parquet sink");
        let end = (start + rows_per_file).min(b.ts.len());
        sink.submit(Arc::new(
            CounterBatch::new(
                Arc::clone(&b.schema),
                b.ts[start..end].to_vec(),
                b.values[start * w..end * w].to_vec(),
                Vec::new(),
            )
            .expect("batch shape"),
        ))
        .expect("submit");
        start = end;
        let stats = sink.shutdown().expect("shutdown");
        assert_eq!(stel_store::parquet::accounting::lost(&stats), 0);
    }
}

fn cfg(pattern: Pattern, ports: usize) -> EmuConfig {
    EmuConfig {
        ports,
        stats: default_stats(ObjectType::Port, 13),
        pattern,
        profile: "lab".into(),
        start_ns: START as u64,
        ..EmuConfig::design()
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
    fn rows(&self) -> Vec<Value> {
        self.json()
            .into_iter()
            .filter(|v| v["type"] == "row")
            .map(|v| v["data"].clone())
            .collect()
    }
}

fn query(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stel-query"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run stel-query");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    }
}

fn col(b: &CounterBatch, object: &str, stat: &str) -> usize {
    b.schema
        .column_index(object, stat)
        .unwrap_or_else(|| panic!("no {object}.{stat}"))
}

fn t(ns: i64) -> String {
    ns.to_string()
}

#[test]
fn rates_equal_the_sonic_formulas_on_a_ramp() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(Pattern::Ramp, 8);
    c.ramp_ns = 100_000_000;
    let truth = write_emulated(dir.path(), c, 20_000, 3000);
    let b = &truth;
    let d = dir.path().to_str().unwrap();
    // 10 ms buckets over [START + 1 ms, START + 181 ms).
    let (from, to) = (START + 1_000_000, START + 181_000_000);
    let o = query(
        &[
            "rates",
            "-d",
            d,
            "--from",
            &t(from),
            "--to",
            &t(to),
            "-r",
            "10ms",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rows = o.rows();
    assert_eq!(rows.len(), 19 * 8, "19 buckets × 8 ports");
    let rx = col(b, "Ethernet0", "IF_IN_OCTETS");
    let tx = col(b, "Ethernet0", "IF_OUT_OCTETS");
    let rxp = col(b, "Ethernet0", "IF_IN_UCAST_PKTS");
    let w = b.schema.width();
    let at = |i: usize, c: usize| b.values[i * w + c] as f64;
    // Polls: the first snapshot in the window, then the last snapshot of each 10 ms bucket
    // (buckets are aligned to 10 ms; --from cuts the first, --to the last: 19 buckets).
    let idx = |ns: i64| ((ns - START) / 10_000) as usize;
    let mut polls = vec![idx(from)];
    for k in 0..19i64 {
        polls.push(idx(START + (k + 1) * 10_000_000 - 1).min(idx(to - 1)));
    }
    let eth0: Vec<&Value> = rows.iter().filter(|r| r["iface"] == "Ethernet0").collect();
    assert_eq!(eth0.len(), 19);
    for (k, row) in eth0.iter().enumerate() {
        let (i0, i1) = (polls[k], polls[k + 1]);
        let dt = (b.ts[i1] - b.ts[i0]) as f64;
        let scale = 1e9 / dt;
        let want_rx = (at(i1, rx) - at(i0, rx)) * scale;
        let want_tx = (at(i1, tx) - at(i0, tx)) * scale;
        let want_pps = (at(i1, rxp) - at(i0, rxp)) * scale;
        assert_eq!(row["rx_bps"].as_f64().unwrap(), want_rx, "bucket {k}");
        assert_eq!(row["tx_bps"].as_f64().unwrap(), want_tx, "bucket {k}");
        assert_eq!(row["rx_pps"].as_f64().unwrap(), want_pps, "bucket {k}");
        assert_eq!(
            row["rx_ok"].as_u64().unwrap() as f64,
            at(i1, rxp) - at(i0, rxp)
        );
        // Known answer: the ramp's utilisation is (t mod 100 ms)/100 ms; over a 10 ms interval
        // the mean is its midpoint (bucket 9/10 straddles the wrap, skip it).
        let mid = ((b.ts[i0] + b.ts[i1]) / 2 - START) % 100_000_000;
        if (b.ts[i0] - START) / 100_000_000 == (b.ts[i1] - START) / 100_000_000 {
            let util = row["rx_util"].as_f64().unwrap();
            let want = mid as f64 / 1e6;
            assert!(
                (util - want).abs() < 0.5,
                "bucket {k}: util {util} want {want}"
            );
        }
    }
    // The whole window as one interval, and the portstat table format.
    let o = query(
        &[
            "rates",
            "-d",
            d,
            "--from",
            &t(from),
            "--to",
            &t(to),
            "-i",
            "Ethernet0",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(lines[0].starts_with("Rates over "), "{}", o.stdout);
    assert!(lines[1].contains("UTIL assumes 100G"), "{}", o.stdout);
    let h = lines.iter().position(|l| l.starts_with("IFACE")).unwrap();
    assert!(lines[h].contains("RX_BPS") && lines[h].contains("TX_UTIL"));
    assert!(
        lines[h + 2].starts_with("Ethernet0")
            && lines[h + 2].contains("MB/s")
            && lines[h + 2].contains('%'),
        "{}",
        o.stdout
    );
    // EMA: α = 2/11, first interval raw, then smoothed.
    let o = query(
        &[
            "rates",
            "-d",
            d,
            "--from",
            &t(from),
            "--to",
            &t(to),
            "-r",
            "10ms",
            "--ema",
            "-i",
            "Ethernet0",
            "--json",
        ],
        &[],
    );
    let ema = o.rows();
    let a = 2.0 / 11.0;
    let mut old = None;
    for (k, row) in ema.iter().enumerate() {
        let raw = eth0[k]["rx_bps"].as_f64().unwrap();
        let want = match old {
            None => raw,
            Some(o) => a * raw + (1.0 - a) * o,
        };
        assert!(
            (row["rx_bps"].as_f64().unwrap() - want).abs() <= 1e-9 * want.abs(),
            "ema bucket {k}"
        );
        old = Some(want);
    }
}

#[test]
fn bursts_find_the_microburst_of_known_length() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(Pattern::Microburst, 4);
    c.burst_ns = 50_000;
    c.burst_period_ns = 1_000_000;
    write_emulated(dir.path(), c, 2_000, 700);
    let d = dir.path().to_str().unwrap();
    let o = query(
        &[
            "bursts",
            "-d",
            d,
            "--from",
            &t(START + 300_000),
            "--to",
            &t(START + 20_000_000),
            "--threshold",
            "90",
            "--direction",
            "rx",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rows = o.rows();
    // One 50 µs burst per 1 ms period and port; with the emulator's per-port phases, the window
    // [0.3 ms, 20 ms) holds exactly 19 whole bursts of each of the 4 ports.
    assert_eq!(rows.len(), 4 * 19, "{}", o.stdout);
    for r in &rows {
        assert_eq!(r["dir"], "RX");
        assert_eq!(r["duration"].as_i64().unwrap(), 50_000, "{r}");
        let peak = r["peak_util"].as_f64().unwrap();
        assert!((peak - 100.0).abs() < 1.0, "{r}");
    }
    // Nothing above 200 %: exit 1, no rows.
    let o = query(
        &["bursts", "-d", d, "--threshold", "200", "--last", "10ms"],
        &[],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
}

#[test]
fn history_top_sql_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let truth = write_emulated(dir.path(), cfg(Pattern::Steady, 8), 3_000, 1000);
    let b = &truth;
    // A part still being written (the sink's temp name) is never read.
    std::fs::write(
        dir.path()
            .join("profile=lab/group=PORT/.part-00000000000000000001-000009.parquet.tmp"),
        b"junk",
    )
    .unwrap();
    let w = b.schema.width();
    let d = dir.path().to_str().unwrap();
    let c0 = col(b, "Ethernet4", "IF_IN_OCTETS");
    // Raw history equals what was sent.
    let o = query(
        &[
            "history",
            "-d",
            d,
            "-o",
            "Ethernet4",
            "-s",
            "SAI_PORT_STAT_IF_IN_OCTETS",
            "--from",
            &t(START),
            "--to",
            &t(START + 100_000),
            "--json",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rows = o.rows();
    assert_eq!(rows.len(), 10);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["object"], "Ethernet4");
        assert_eq!(r["stat"], "IF_IN_OCTETS");
        assert_eq!(r["value"].as_u64().unwrap(), b.values[i * w + c0]);
    }
    // --limit counts rows (object × stat × snapshot); a cut says so on stderr and in the
    // summary, an output that fits exactly does not.
    let raw = |limit: &str, extra: &[&str]| {
        let mut args = vec![
            "history",
            "-d",
            d,
            "-o",
            "Ethernet4,Ethernet0",
            "-s",
            "IF_IN_OCTETS",
            "--from",
        ];
        let (from, to) = (t(START), t(START + 100_000));
        args.extend([from.as_str(), "--to", to.as_str(), "--limit", limit]);
        args.extend(extra);
        query(&args, &[])
    };
    let o = raw("5", &["--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.rows().len(), 5);
    let summary = o
        .json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .unwrap();
    assert_eq!(summary["data"]["truncated"], true, "{summary}");
    let warning: Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert_eq!(warning["type"], "warning", "{}", o.stderr);
    assert!(
        warning["data"]["message"]
            .as_str()
            .unwrap()
            .contains("printed the first 5 rows only"),
        "{warning}"
    );
    let o = raw("5", &["--csv"]);
    assert_eq!(o.stdout.lines().count(), 6, "{}", o.stdout);
    assert!(o.stderr.contains("raise --limit"), "{}", o.stderr);
    for limit in ["20", "0"] {
        let o = raw(limit, &["--json"]);
        assert_eq!(o.rows().len(), 20, "--limit {limit}");
        assert!(o.stderr.is_empty(), "--limit {limit}: {}", o.stderr);
        let summary = o
            .json()
            .into_iter()
            .find(|v| v["type"] == "summary")
            .unwrap();
        assert_eq!(summary["data"]["truncated"], false, "{summary}");
    }
    // Bucketed: min/max/last of a 1 ms bucket.
    let o = query(
        &[
            "history",
            "-d",
            d,
            "-o",
            "Ethernet4",
            "-s",
            "IF_IN_OCTETS",
            "--from",
            &t(START),
            "--to",
            &t(START + 2_000_000),
            "-r",
            "1ms",
            "--json",
        ],
        &[],
    );
    let rows = o.rows();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["min"].as_u64().unwrap(), b.values[100 * w + c0]);
    assert_eq!(rows[1]["max"].as_u64().unwrap(), b.values[199 * w + c0]);
    assert_eq!(rows[1]["last"].as_u64().unwrap(), b.values[199 * w + c0]);
    // Top by rate: the port whose octets grew most over the window.
    let o = query(
        &[
            "top",
            "-d",
            d,
            "-n",
            "3",
            "--from",
            &t(START),
            "--to",
            &t(START + 30_000_000),
            "--json",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rows = o.rows();
    assert_eq!(rows.len(), 3);
    let grow = |obj: &str| {
        let (a, z) = (col(b, obj, "IF_IN_OCTETS"), col(b, obj, "IF_OUT_OCTETS"));
        let n = b.ts.len() - 1;
        (b.values[n * w + a] - b.values[a]) + (b.values[n * w + z] - b.values[z])
    };
    let mut objs: Vec<String> = (0..8).map(|p| format!("Ethernet{}", 4 * p)).collect();
    objs.sort_by_key(|o| std::cmp::Reverse(grow(o)));
    assert_eq!(rows[0]["iface"], objs[0].as_str());
    // SQL over the wide table and the long view.
    let o = query(
        &[
            "sql",
            "-d",
            d,
            "SELECT count(*) AS n FROM lab_port",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.rows()[0]["n"].as_u64().unwrap(), 3000);
    let o = query(
        &["sql", "-d", d, "SELECT max(value) AS v FROM counters WHERE object = 'Ethernet4' AND stat = 'IF_IN_OCTETS'", "--json"],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.rows()[0]["v"].as_u64().unwrap(), b.values[2999 * w + c0]);
    // The dashboards' rates(…) is the Flight SQL server's: sql says where it lives.
    let o = query(&["sql", "-d", d, "SELECT * FROM rates('PORT', '1s')"], &[]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("is a table function of `stel-query serve`"),
        "{}",
        o.stderr
    );
    // An empty window says which range exists; exit 1.
    let o = query(
        &[
            "rates",
            "-d",
            d,
            "--from",
            "2020-01-01T00:00:00Z",
            "--to",
            "2020-01-01T00:00:01Z",
        ],
        &[],
    );
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .starts_with("stel-query: no samples of lab/PORT in 2020-01-01T00:00:00"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr.contains(
            "data exists for 2023-11-14T22:13:20.000000000Z..2023-11-14T22:13:20.029990000Z"
        ),
        "{}",
        o.stderr
    );
    // Errors as one JSON line with --json; bad flags exit 2 — a data directory that is not
    // there, an object or a stat the data does not have included (a script tells a typo from
    // a quiet window).
    let o = query(&["rates", "-d", "/nonexistent/stel", "--json"], &[]);
    assert_eq!(o.code, 2);
    let e: Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["data"]["exit_code"], 2);
    assert!(e["data"]["message"]
        .as_str()
        .unwrap()
        .contains("--data-dir"));
    let o = query(&["rates", "-d", d, "--since", "ten minutes"], &[]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("is not a duration"), "{}", o.stderr);
    let o = query(&["rates", "-d", d, "-i", "Ethernet999"], &[]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("has no object Ethernet999"),
        "{}",
        o.stderr
    );
    let o = query(
        &["history", "-d", d, "-o", "Ethernet0", "-s", "IF_IN_OCTETZ"],
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("does not carry IF_IN_OCTETZ"),
        "{}",
        o.stderr
    );
    // Completions.
    let o = query(&["completions", "bash"], &[]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("stel-query"));
}

/// `rates -r stream` over a window without two snapshots names the range that exists, as the
/// same window without `-r stream` does, and with --json prints the begin record before the
/// error like it (it said "fewer than two snapshots …", no range, nothing on stdout).
#[test]
fn an_empty_window_names_the_range_with_and_without_stream() {
    let dir = tempfile::tempdir().unwrap();
    write_emulated(dir.path(), cfg(Pattern::Steady, 2), 100, 1000);
    let d = dir.path().to_str().unwrap();
    let exists = "data exists for 2023-11-14T22:13:20.000000000Z..2023-11-14T22:13:20.000990000Z";
    let (from, one) = (t(START), t(START + 5_000));
    let windows: [(&[&str], &str); 2] = [
        (
            &[
                "--from",
                "2020-01-01T00:00:00Z",
                "--to",
                "2020-01-01T00:00:01Z",
            ],
            "no samples of lab/PORT in 2020-01-01T00:00:00",
        ),
        (
            &["--from", &from, "--to", &one],
            "one snapshot of lab/PORT in ",
        ),
    ];
    for (window, said) in windows {
        for res in [&[][..], &["-r", "stream"][..]] {
            let mut args = vec!["rates", "-d", d];
            args.extend(window);
            args.extend(res);
            let o = query(&args, &[]);
            assert_eq!(o.code, 1, "{args:?}: {}", o.stderr);
            assert!(o.stderr.contains(exists), "{args:?}: {}", o.stderr);
            if !res.is_empty() || !said.starts_with("one") {
                assert!(o.stderr.contains(said), "{args:?}: {}", o.stderr);
            }
            args.push("--json");
            let o = query(&args, &[]);
            assert_eq!(o.code, 1, "{args:?}: {}", o.stderr);
            let begin = o.json().into_iter().find(|v| v["type"] == "begin");
            assert!(begin.is_some(), "{args:?}: no begin record: {}", o.stdout);
            let e: Value = serde_json::from_str(o.stderr.trim()).unwrap();
            assert_eq!(e["type"], "error", "{args:?}");
            assert!(
                e["data"]["message"].as_str().unwrap().contains(exists),
                "{args:?}: {e}"
            );
        }
    }
}

/// A group the history does not have is an error (exit 2) saying which groups it has, as an
/// object or a stat it does not have is: --profile cannot help (it said "no QUEUE session …;
/// sessions: lab/PORT (pick one with --profile)", exit 1).
#[test]
fn a_group_the_data_does_not_have_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_emulated(dir.path(), cfg(Pattern::Steady, 2), 100, 1000);
    let d = dir.path().to_str().unwrap();
    for args in [
        &["history", "-d", d, "--group", "QUEUE"][..],
        &["top", "-d", d, "--by", "occupancy", "--group", "QUEUE"][..],
        &["rates", "-d", d, "--rif"][..],
    ] {
        let o = query(args, &[]);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("this history has PORT only"),
            "{args:?}: {}",
            o.stderr
        );
        assert!(!o.stderr.contains("--profile"), "{args:?}: {}", o.stderr);
    }
}

#[test]
fn export_to_and_query_from_a_real_s3_server() {
    let dir = tempfile::tempdir().unwrap();
    write_emulated(dir.path(), cfg(Pattern::Ramp, 4), 5_000, 1000);
    let d = dir.path().to_str().unwrap();
    let (from, to) = (START + 5_000_000, START + 45_000_000);
    // Local export: the edge files are trimmed, the middle ones copied.
    let lake = tempfile::tempdir().unwrap();
    let l = lake.path().to_str().unwrap();
    let o = query(
        &[
            "export",
            "-d",
            d,
            l,
            "--from",
            &t(from),
            "--to",
            &t(to),
            "--json",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rows = o.rows();
    // Files of 1000 snapshots (10 ms): [0,10) and [40,50) straddle the window, 3 are inside.
    assert_eq!(
        rows.iter().filter(|r| r["action"] == "trimmed").count(),
        2,
        "{}",
        o.stdout
    );
    assert_eq!(
        rows.iter().filter(|r| r["action"] == "copied").count(),
        3,
        "{}",
        o.stdout
    );
    assert_eq!(
        rows.iter()
            .map(|r| r["rows"].as_u64().unwrap())
            .sum::<u64>(),
        4000
    );
    let o = query(
        &[
            "sql",
            "-d",
            l,
            "SELECT count(*) AS n FROM lab_port",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.rows()[0]["n"].as_u64().unwrap(), 4000);
    // S3.
    let moto = MotoS3::start("lake");
    let url = moto.url();
    let env = s3_client_env(&url);
    let o = query(
        &[
            "export",
            "-d",
            d,
            "s3://lake/stel",
            "--from",
            &t(from),
            "--to",
            &t(to),
            "--json",
        ],
        &env,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.rows().len(), 5);
    let o = query(
        &[
            "sql",
            "-d",
            "s3://lake/stel",
            "SELECT count(*) AS n, min(ts) AS a FROM lab_port",
            "--json",
        ],
        &env,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.rows()[0]["n"].as_u64().unwrap(), 4000);
    // The same rates from S3 as from the local files.
    let args = |src: &str| {
        vec![
            "rates".to_string(),
            "-d".into(),
            src.into(),
            "--from".into(),
            t(from),
            "--to".into(),
            t(to),
            "-r".into(),
            "10ms".into(),
            "--json".into(),
        ]
    };
    let local = query(&args(d).iter().map(String::as_str).collect::<Vec<_>>(), &[]).rows();
    let s3 = query(
        &args("s3://lake/stel")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &env,
    )
    .rows();
    assert_eq!(local.len(), 5 * 4);
    assert_eq!(local, s3);
}

/// An http:// endpoint without AWS_ALLOW_HTTP=true: object_store's HTTP client refuses the
/// URL ("HTTP error: builder error") before any connection; the message says what to set.
#[test]
fn an_http_endpoint_without_allow_http_says_what_to_set() {
    let o = Command::new(env!("CARGO_BIN_EXE_stel-query"))
        .args(["top", "--by", "drops", "-d", "s3://lake/fleet"])
        .env_remove("AWS_ALLOW_HTTP")
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .expect("run stel-query");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("builder error (an http:// AWS_ENDPOINT_URL needs AWS_ALLOW_HTTP=true)"),
        "{err}"
    );
}

#[test]
fn inspect_tails_newly_published_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let all = write_emulated(&root, cfg(Pattern::Steady, 2), 600, 600);
    // Keep only the first 500 snapshots on disk for now: rewrite the tree.
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    publish(
        &root,
        &CounterBatch::new(
            Arc::clone(&all.schema),
            all.ts[..500].to_vec(),
            all.values[..500 * all.schema.width()].to_vec(),
            Vec::new(),
        )
        .expect("batch shape"),
        0,
        500,
    );
    let d = root.to_str().unwrap().to_string();
    // Nothing new: the stored snapshot, then exit 1 with the hint.
    let o = query(
        &["inspect", "lab", "-d", &d, "--duration", "600ms", "--json"],
        &[],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("is stel-ingestd running"), "{}", o.stderr);
    assert!(!o.rows().is_empty());
    // A file published while inspect runs shows up with rates.
    let child = Command::new(env!("CARGO_BIN_EXE_stel-query"))
        .args([
            "inspect",
            "lab",
            "-d",
            &d,
            "--duration",
            "3s",
            "--every",
            "100ms",
            "--json",
            "-o",
            "Ethernet0",
            "-s",
            "IF_IN_OCTETS",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    // The continuation of the same counters, published by the sink while inspect watches.
    publish(&root, &all, 500, 100);
    let o = child.wait_with_output().unwrap();
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    };
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = out.rows();
    assert_eq!(rows.len(), 2, "{}", out.stdout);
    assert!(rows[1]["rate/s"].as_f64().unwrap() > 0.0, "{}", out.stdout);
}

/// A profile name the store percent-escapes in its directory (`lab 1` → `profile=lab%201`)
/// keeps exactly that directory name in the lake, local and S3 (rebuilding the key from a string
/// escaped the `%` a second time: `lab%25201`, which no reader maps back to `lab 1`).
#[test]
fn export_keeps_escaped_profile_directories() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(Pattern::Ramp, 2);
    c.profile = "lab 1".into();
    write_emulated(dir.path(), c, 2_000, 1000);
    let d = dir.path().to_str().unwrap();
    let src_dirs = |root: &Path| -> Vec<String> {
        std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("profile="))
            .collect()
    };
    assert_eq!(src_dirs(dir.path()), ["profile=lab%201"]);
    let lake = tempfile::tempdir().unwrap();
    let l = lake.path().to_str().unwrap();
    let o = query(&["export", "-d", d, l, "--json"], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(src_dirs(lake.path()), ["profile=lab%201"]);
    let count = |data: &str, env: &[(&str, &str)]| {
        let o = query(
            &[
                "sql",
                "-d",
                data,
                "SELECT count(*) AS n FROM lab_1_port",
                "--json",
            ],
            env,
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.rows()[0]["n"].as_u64().unwrap()
    };
    assert_eq!(count(l, &[]), 2000);
    let moto = MotoS3::start("lake");
    let url = moto.url();
    let env = s3_client_env(&url);
    let o = query(&["export", "-d", d, "s3://lake/x", "--json"], &env);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let keys = stel_testkit::python3(&format!(
        "import boto3; c = boto3.client('s3', endpoint_url='{url}', aws_access_key_id='k', aws_secret_access_key='s', region_name='us-east-1'); print('\\n'.join(o['Key'] for o in c.list_objects_v2(Bucket='lake')['Contents']))"
    ))
    .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&keys.stdout).into_owned();
    assert!(!keys.trim().is_empty(), "no objects in the bucket");
    for k in keys.lines() {
        assert!(k.starts_with("x/profile=lab%201/group=PORT/"), "{k}");
    }
    assert_eq!(count("s3://lake/x", &env), 2000);
}

/// `sql` only reads unless `--allow-writes`: COPY … TO (also under EXPLAIN ANALYZE), INSERT,
/// CREATE, DROP and SET are refused before anything runs, with a message naming the flag.
#[test]
fn sql_is_read_only_unless_writes_are_allowed() {
    let dir = tempfile::tempdir().unwrap();
    write_emulated(dir.path(), cfg(Pattern::Steady, 2), 200, 200);
    let d = dir.path().to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("copy.parquet");
    let tp = target.to_str().unwrap();
    let copy = format!("COPY (SELECT * FROM lab_port) TO '{tp}' STORED AS PARQUET");
    let refused = [
        copy.clone(),
        format!("EXPLAIN ANALYZE {copy}"),
        format!("CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{tp}'"),
        "CREATE TABLE t AS SELECT 1".to_string(),
        "INSERT INTO lab_port SELECT * FROM lab_port".to_string(),
        "DROP TABLE lab_port".to_string(),
        "SET datafusion.execution.batch_size = 1".to_string(),
    ];
    for q in &refused {
        let o = query(&["sql", "-d", d, q], &[]);
        assert_eq!(o.code, 2, "{q}: {}", o.stderr);
        assert!(
            o.stderr.starts_with("stel-query: read-only SQL")
                && o.stderr.contains("--allow-writes"),
            "{q}: {}",
            o.stderr
        );
        assert_eq!(
            std::fs::read_dir(out.path()).unwrap().count(),
            0,
            "{q} wrote"
        );
    }
    let o = query(&["sql", "-d", d, &copy, "--json"], &[]);
    assert_eq!(o.code, 2);
    let e: Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert!(
        e["data"]["message"].as_str().unwrap().contains("COPY"),
        "{e}"
    );
    // Reading statements still run.
    for q in [
        "SELECT count(*) AS n FROM lab_port",
        "SHOW TABLES",
        "EXPLAIN SELECT count(*) FROM lab_port",
        "DESCRIBE lab_port",
    ] {
        let o = query(&["sql", "-d", d, q], &[]);
        assert_eq!(o.code, 0, "{q}: {}", o.stderr);
    }
    // With the flag the COPY runs, and what it wrote is the table.
    let o = query(&["sql", "-d", d, &copy, "--allow-writes", "--json"], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let n = stel_testkit::python3_json(&format!(
        "import json, pyarrow.parquet as pq\nprint(json.dumps(pq.read_metadata({tp:?}).num_rows))"
    ));
    assert_eq!(n, 200);
}

/// One bad `.parquet` in the tree (a truncated copy, random bytes, an empty file, another
/// schema) does not break the commands: it is named in a warning, skipped, counted in the
/// summary; `--strict` fails on it instead, naming it.
#[test]
fn a_bad_file_is_named_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    write_emulated(dir.path(), cfg(Pattern::Steady, 8), 3_000, 1000);
    let d = dir.path().to_str().unwrap();
    let hour = dir
        .path()
        .join("profile=lab/group=PORT/date=2023-11-14/hour=22");
    let good: Vec<_> = std::fs::read_dir(&hour)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    assert_eq!(good.len(), 3);
    let original = std::fs::read(&good[0]).unwrap();
    let bad = hour.join("part-99999999999999999999-000000.parquet");
    let foreign = format!(
        "import pyarrow as pa, pyarrow.parquet as pq\n\
         pq.write_table(pa.table({{'ts': pa.array([1, 2], pa.int64()), 'note': ['a', 'b']}}), {:?})\n\
         print('{{}}')",
        bad.to_str().unwrap()
    );
    type Make = Box<dyn Fn()>;
    let kinds: Vec<(&str, Make)> = vec![
        ("truncated", {
            let (b, o) = (bad.clone(), original.clone());
            Box::new(move || std::fs::write(&b, &o[..o.len() / 2]).unwrap())
        }),
        ("random", {
            let b = bad.clone();
            Box::new(move || {
                let mut x: u64 = 7;
                let junk: Vec<u8> = (0..100_000)
                    .map(|_| {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        (x >> 56) as u8
                    })
                    .collect();
                std::fs::write(&b, junk).unwrap()
            })
        }),
        ("empty", {
            let b = bad.clone();
            Box::new(move || std::fs::write(&b, b"").unwrap())
        }),
        ("foreign", {
            let f = foreign.clone();
            Box::new(move || {
                stel_testkit::python3_json(&f);
            })
        }),
    ];
    let shown = bad.to_str().unwrap();
    for (kind, make) in &kinds {
        make();
        // Every command still answers, from the good files only.
        let o = query(
            &[
                "sql",
                "-d",
                d,
                "SELECT count(*) AS n FROM lab_port",
                "--json",
            ],
            &[],
        );
        assert_eq!(o.code, 0, "{kind}: {}", o.stderr);
        assert_eq!(o.rows()[0]["n"].as_u64(), Some(3000), "{kind}");
        let summary = o
            .json()
            .into_iter()
            .find(|v| v["type"] == "summary")
            .unwrap();
        assert_eq!(summary["data"]["files_skipped"], 1, "{kind}");
        let w: Value = serde_json::from_str(o.stderr.lines().next().unwrap())
            .unwrap_or_else(|e| panic!("{kind}: {e}: {}", o.stderr));
        assert_eq!(w["type"], "warning", "{kind}");
        assert_eq!(w["data"]["path"], shown, "{kind}");
        for args in [
            vec!["rates", "-d", d],
            vec!["history", "-d", d, "-o", "Ethernet0", "-s", "IF_IN_OCTETS"],
            vec!["top", "-d", d],
            vec!["bursts", "-d", d, "--threshold", "1"],
        ] {
            let o = query(&args, &[]);
            assert_eq!(o.code, 0, "{kind} {args:?}: {}", o.stderr);
            assert!(
                o.stderr
                    .contains(&format!("stel-query: warning: skipping {shown}: "))
                    && o.stderr
                        .contains("1 unreadable or foreign Parquet file skipped"),
                "{kind} {args:?}: {}",
                o.stderr
            );
        }
        // --strict: the file is the error.
        let o = query(&["rates", "-d", d, "--strict"], &[]);
        assert_eq!(o.code, 2, "{kind}: {}", o.stderr);
        assert!(
            o.stderr.starts_with(&format!("stel-query: {shown}: "))
                && o.stderr.contains("--strict"),
            "{kind}: {}",
            o.stderr
        );
        std::fs::remove_file(&bad).unwrap();
    }
}

/// A window holding a restart (counters back to 0 after a 10 s gap): the whole-window rate is
/// the traffic counted over the time the samples cover — what `-r 1s` shows and what pyarrow
/// computes from the files — and the answer says the window had a gap and a reset.
#[test]
fn a_restart_in_the_window_is_counted_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(Pattern::Steady, 4);
    c.interval_ns = 1_000_000; // 3 s per segment
    let a = write_emulated(dir.path(), c, 3_000, 1000);
    let w = a.schema.width();
    // The switch restarts 10 s after the last snapshot: same traffic, counters from 0.
    let gap = 10_000_000_000;
    let t2: Vec<i64> =
        a.ts.iter()
            .map(|t| t + (a.ts[2999] - a.ts[0]) + gap)
            .collect();
    let v2: Vec<u64> = (0..a.ts.len() * w)
        .map(|k| a.values[k] - a.values[k % w])
        .collect();
    let b = CounterBatch::new(Arc::clone(&a.schema), t2.clone(), v2, Vec::new()).unwrap();
    publish(dir.path(), &b, 0, 1000);
    let d = dir.path().to_str().unwrap();
    let (from, to) = (t(a.ts[0]), t(t2[2999] + 1));
    // pyarrow: per run of non-decreasing counter, (last - first) / (t_last - t_first), summed.
    let truth = stel_testkit::python3_json(&format!(
        "import json, pyarrow.dataset as ds\n\
         t = ds.dataset({d:?}, format='parquet', partitioning='hive').to_table(columns=['ts', 'Ethernet0.IF_IN_OCTETS']).sort_by('ts')\n\
         ts = [x.value for x in t.column('ts')]; v = t.column('Ethernet0.IF_IN_OCTETS').to_pylist()\n\
         runs = []; s = 0\n\
         for i in range(1, len(v) + 1):\n\
         \x20   if i == len(v) or v[i] < v[i - 1]:\n\
         \x20       runs.append((v[i - 1] - v[s], ts[i - 1] - ts[s])); s = i\n\
         print(json.dumps({{'bps': sum(r[0] for r in runs) / sum(r[1] for r in runs) * 1e9, 'runs': len(runs),\n\
         \x20 'naive': (v[-1] - v[0]) / (ts[-1] - ts[0]) * 1e9}}))"
    ));
    assert_eq!(truth["runs"], 2);
    let want = truth["bps"].as_f64().unwrap();
    let o = query(
        &[
            "rates",
            "-d",
            d,
            "--from",
            &from,
            "--to",
            &to,
            "-i",
            "Ethernet0",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rows = o.rows();
    assert_eq!(rows.len(), 1);
    let got = rows[0]["rx_bps"].as_f64().unwrap();
    assert!(
        (got / want - 1.0).abs() < 1e-3,
        "whole window {got} vs pyarrow {want}"
    );
    let naive = truth["naive"].as_f64().unwrap();
    assert!(
        (naive / want - 1.0).abs() > 0.3,
        "the case is a real one: naive {naive}"
    );
    let covered = rows[0]["covered"].as_i64().unwrap();
    assert!(
        covered < 6_000_000_000 && covered > 5_800_000_000,
        "{covered}"
    );
    let summary = o
        .json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .unwrap();
    let win = &summary["data"]["window"];
    assert_eq!(win["resets"], 1, "{win}");
    assert_eq!(win["gaps"].as_array().unwrap().len(), 1, "{win}");
    assert!(win["gap_ns"].as_i64().unwrap() >= gap, "{win}");
    // -r 1s: every interval's rate is the same traffic.
    let o = query(
        &[
            "rates",
            "-d",
            d,
            "--from",
            &from,
            "--to",
            &to,
            "-i",
            "Ethernet0",
            "-r",
            "1s",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let per_s: Vec<f64> = o
        .rows()
        .iter()
        .map(|r| r["rx_bps"].as_f64().unwrap())
        .collect();
    assert!(per_s.len() >= 4, "{per_s:?}");
    for v in &per_s {
        assert!(
            (v / got - 1.0).abs() < 1e-3,
            "-r 1s {v} vs whole window {got}"
        );
    }
    // The table says what the window held, before the answer.
    let o = query(&["rates", "-d", d, "--from", &from, "--to", &to], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let first_lines: Vec<&str> = o.stdout.lines().take(2).collect();
    assert!(first_lines[0].starts_with("Rates over "), "{}", o.stdout);
    assert!(
        first_lines[1].contains("1 gap without samples")
            && first_lines[1].contains("counters went back"),
        "{}",
        o.stdout
    );
}

/// The CLI speaks operator: a bare number is not a duration, CSV is raw numbers with units in
/// the header, ports come in natural order, `top --by drops` says there were none, `bursts`
/// leads with a per-port summary, `int --engine spark` refuses, `--version` names the tool.
#[test]
fn the_cli_speaks_operator() {
    // An example on every subcommand's help, and every flag described.
    for c in [
        "rates",
        "history",
        "top",
        "bursts",
        "inspect",
        "sql",
        "export",
        "int",
        "stat",
        "serve",
        "completions",
    ] {
        let o = query(&[c, "--help"], &[]);
        assert_eq!(o.code, 0, "{c}: {}", o.stderr);
        assert!(o.stdout.contains("Example"), "{c} --help:\n{}", o.stdout);
        let options = o
            .stdout
            .split("Options:")
            .nth(1)
            .expect("an Options section");
        let lines: Vec<&str> = options.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let flag = l.trim_start();
            let indent = l.len() - flag.len();
            if flag.starts_with('-') && (indent == 2 || indent == 6) {
                let next = lines.get(i + 1).map_or("", |n| n.trim());
                assert!(!next.is_empty(), "{c}: {flag} has no description");
            }
        }
    }
    // What SQL can name: the rollup tiers and the INT tables too; serve's table function.
    let o = query(&["sql", "--help"], &[]);
    for t in [
        "_1s",
        "_1m",
        "counters",
        "int_reports",
        "int_hops",
        "int_drops",
    ] {
        assert!(o.stdout.contains(t), "sql --help lacks {t}:\n{}", o.stdout);
    }
    let o = query(&["serve", "--help"], &[]);
    assert!(
        o.stdout
            .contains("rates(group, resolution, profile, speed)"),
        "{}",
        o.stdout
    );
    let dir = tempfile::tempdir().unwrap();
    write_emulated(dir.path(), cfg(Pattern::Steady, 8), 3_000, 3000);
    let d = dir.path().to_str().unwrap();
    let o = query(&["rates", "-d", d, "--last", "10"], &[]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("`10` has no unit") && o.stderr.contains("10s"),
        "{}",
        o.stderr
    );
    // CSV: raw numbers, units in the header, natural port order.
    let o = query(&["rates", "-d", d, "--csv"], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mut lines = o.stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        "IFACE,RX_OK (packets),RX_BPS (bytes/s),RX_PPS (packets/s),RX_UTIL (%),TX_OK (packets),TX_BPS (bytes/s),TX_PPS (packets/s),TX_UTIL (%),COVERED (ns)"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let ports: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    let want: Vec<String> = (0..8).map(|p| format!("Ethernet{}", 4 * p)).collect();
    assert_eq!(ports, want);
    for r in &rows {
        for v in &r[1..] {
            assert!(v.parse::<f64>().is_ok(), "not a raw number: {v} in {r:?}");
        }
    }
    let o = query(&["rates", "-d", d, "--csv", "--unit", "bits"], &[]);
    assert!(
        o.stdout
            .starts_with("IFACE,RX_OK (packets),RX_BPS (bits/s)"),
        "{}",
        o.stdout
    );
    let bits: f64 = o
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split(',')
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    let bytes: f64 = rows[0][2].parse().unwrap();
    assert!((bits / bytes - 8.0).abs() < 1e-9);
    let o = query(
        &["rates", "-d", d, "--unit", "bits", "-o", "Ethernet0"],
        &[],
    );
    assert!(o.stdout.contains(" Gb/s"), "{}", o.stdout);
    // No drops: said, not ranked.
    let o = query(&["top", "-d", d, "--by", "drops"], &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stdout.starts_with("No drops in "), "{}", o.stdout);
    assert!(!o.stdout.contains("RANK"), "{}", o.stdout);
    // --plot without -r: a chart over time at a round interval (~120 points over the data),
    // said on stderr; one point per port would draw nothing.
    let svg = dir.path().join("rx.svg");
    let o = query(
        &[
            "rates",
            "-d",
            d,
            "-o",
            "Ethernet0",
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("one point per 500µs"), "{}", o.stderr);
    let chart = std::fs::read_to_string(&svg).unwrap();
    // The longest line is the series (the others are axes and grid ticks).
    let points = chart
        .split("<polyline")
        .filter_map(|l| l.split("points=\"").nth(1))
        .map(|p| p.split('"').next().unwrap().split_whitespace().count())
        .max()
        .unwrap_or(0);
    assert!(points >= 50, "{points} points: {chart}");
    // No bursts: said too, with the rule that found none.
    let o = query(
        &["top", "-d", d, "--by", "bursts", "--threshold", "200"],
        &[],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stdout.starts_with("No bursts in "), "{}", o.stdout);
    assert!(
        o.stdout.contains("above 200% of its line rate for 10us"),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("RANK"), "{}", o.stdout);
    // Bursts: the per-interface summary first, then the bursts.
    let o = query(
        &["bursts", "-d", d, "--threshold", "1", "--limit", "2"],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let l: Vec<&str> = o.stdout.lines().collect();
    assert!(
        l[0].contains(" on 16 interface directions:"),
        "{}",
        o.stdout
    );
    assert!(l[1].starts_with("IFACE") && l[1].contains("BURSTS") && l[1].contains("LONGEST"));
    assert!(
        l[3].starts_with("Ethernet0 ") && l[5].starts_with("Ethernet4 "),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("\nThe first 2 of "), "{}", o.stdout);
    // int on Spark: refused, not run locally.
    let o = query(
        &[
            "int",
            "evc",
            "-d",
            d,
            "--engine",
            "spark",
            "--remote",
            "sc://127.0.0.1:1",
        ],
        &[],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("local engine only"), "{}", o.stderr);
    let o = query(&["--version"], &[]);
    assert!(o.stdout.starts_with("stel-query "), "{}", o.stdout);
}
