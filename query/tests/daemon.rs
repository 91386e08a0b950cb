//! stel-query on data the daemon wrote: the real `stel-ingestd --demo` binary (its in-process
//! emulator through the real reader, decoders and Parquet sink, no root needed) fills a temp
//! directory, then every data command runs over it and is checked against what the demo's load
//! pattern implies — the ramp's known slope for rates, the microburst's known length for bursts,
//! and the emulator's own counters (regenerated here from the same config) for history and SQL.
//!
//! The daemon binary is taken from the target directory this test runs from (`cargo test
//! --workspace` builds it); when it is missing it is built with `cargo build -p stel-ingest --bin
//! stel-ingestd` first, and the test says so on stderr.

use std::{
    path::{Path, PathBuf},
    process::Command,
};
use stel_emu::{default_stats, EmuConfig, Pattern};

use serde_json::Value;
use stel_ingest::decode::CounterBatch;

/// Line rate of the demo's 100 G ports, bytes/s.
const LINE: f64 = 100e9 / 8.0;
/// The demo's ramp: 0 → 100 % over 10 s (EmuConfig::design().ramp_ns).
const RAMP_NS: f64 = 10e9;

/// `target/<profile>/stel-ingestd` next to this test's executable, built when missing.
fn daemon() -> PathBuf {
    stel_testkit::workspace_bin("stel-ingest", "stel-ingestd")
}

/// Runs the demo for 2 s into `dir/data`; returns the daemon's final counters (`--json`).
fn run_demo(dir: &Path, pattern: &str, extra: &[&str]) -> Value {
    run_demo_for(dir, pattern, "2s", extra)
}

/// Runs the demo for `duration` into `dir/data`; returns the daemon's final counters (`--json`).
fn run_demo_for(dir: &Path, pattern: &str, duration: &str, extra: &[&str]) -> Value {
    let data = dir.join("data");
    let out = Command::new(daemon())
        .args([
            "--demo",
            "--no-ebpf",
            "--pattern",
            pattern,
            "--duration",
            duration,
        ])
        .arg("--data-dir")
        .arg(&data)
        .arg("--status-file")
        .arg(dir.join("status.json"))
        .args(["--no-inspect", "--json"])
        .args(extra)
        .current_dir(dir)
        .output()
        .expect("run stel-ingestd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stel-ingestd failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let counters: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("daemon --json output: {e}: {stdout}\n{stderr}"));
    // The daemon must have written history: files, and every decoded snapshot in them.
    let files = stel_store::paths::published_parts(&data);
    assert!(
        !files.is_empty(),
        "stel-ingestd wrote no Parquet file under {}: {stderr}",
        data.display()
    );
    let records = stel_store::metrics::Snapshot::from_json(&counters["metrics"])
        .sum(stel_store::metrics::Metric::DecodeRecords);
    assert!(
        records >= 100,
        "the demo decoded only {records} snapshots: {stderr}"
    );
    counters
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn rows(&self) -> Vec<Value> {
        assert_eq!(self.code, 0, "{}", self.stderr);
        self.stdout
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|v| v["type"] == "row")
            .map(|v| v["data"].clone())
            .collect()
    }
}

fn query(d: &Path, args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_stel-query"))
        .args(args)
        .arg("-d")
        .arg(d)
        .output()
        .expect("run stel-query");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    }
}

fn sql_i64(d: &Path, q: &str) -> i64 {
    let rows = query(d, &["sql", q, "--json"]).rows();
    rows[0]["v"]
        .as_i64()
        .unwrap_or_else(|| panic!("{q}: {:?}", rows[0]))
}

/// What the daemon's history holds: every decoded snapshot once (rows), from `t0` to `t1`, one
/// snapshot per `interval_ns` without a gap.
fn history_span(d: &Path, counters: &Value, interval_ns: i64) -> (i64, i64, i64) {
    let records = stel_store::metrics::Snapshot::from_json(&counters["metrics"])
        .sum(stel_store::metrics::Metric::DecodeRecords);
    let n = sql_i64(d, "SELECT count(*) AS v FROM stel_demo_port");
    assert_eq!(n as u64, records, "rows in Parquet vs snapshots decoded");
    let t0 = sql_i64(d, "SELECT CAST(min(ts) AS BIGINT) AS v FROM stel_demo_port");
    let t1 = sql_i64(d, "SELECT CAST(max(ts) AS BIGINT) AS v FROM stel_demo_port");
    assert_eq!(
        t1 - t0,
        (n - 1) * interval_ns,
        "one snapshot per {interval_ns} ns, no gap"
    );
    (n, t0, t1)
}

/// The demo's emulator (same config as `stel-ingestd --demo` with these flags), decoded: the
/// counters the daemon was sent, snapshot by snapshot.
fn truth(pattern: Pattern, ports: usize, interval_ns: u64, start_ns: u64, n: u64) -> CounterBatch {
    let mut cfg = EmuConfig::design();
    cfg.ports = ports;
    cfg.stats = default_stats(cfg.group, 30);
    cfg.interval_ns = interval_ns;
    cfg.pattern = pattern;
    cfg.start_ns = start_ns;
    stel_ingest::decode::emulated(cfg, n).expect("emulator round trip")
}

fn col(b: &CounterBatch, object: &str, stat: &str) -> usize {
    b.schema
        .column_index(object, stat)
        .unwrap_or_else(|| panic!("no {object}.{stat}"))
}

#[test]
fn every_command_answers_correctly_on_the_daemons_ramp() {
    let dir = tempfile::tempdir().unwrap();
    let counters = run_demo(
        dir.path(),
        "ramp",
        &["--ports", "8", "--stats", "30", "--interval", "1ms"],
    );
    let d = dir.path().join("data");
    let (n, t0, t1) = history_span(&d, &counters, 1_000_000);
    let b = truth(Pattern::Ramp, 8, 1_000_000, t0 as u64, n as u64);
    assert_eq!(b.ts[0], t0);
    let w = b.schema.width();
    let (from, to) = (t0.to_string(), (t1 + 1).to_string());
    let win = ["--from", from.as_str(), "--to", to.as_str()];

    // rates, per 100 ms: the ramp's slope. Utilisation rises 10 %/s, so the mean rate over the
    // steps (t_a, t_b] of a bucket is LINE × mean(t)/10 s = LINE × (t_a + 1 ms + t_b)/2/10 s.
    let rows = query(
        &d,
        &[&["rates", "-r", "100ms", "--json"][..], &win[..]].concat(),
    )
    .rows();
    let eth0: Vec<&Value> = rows.iter().filter(|r| r["iface"] == "Ethernet0").collect();
    assert!(eth0.len() >= 10, "{} intervals", eth0.len());
    let mut prev_t = t0;
    for r in &eth0 {
        let t = chrono_ns(r["time"].as_str().unwrap());
        let mid_s = ((prev_t - t0) + 1_000_000 + (t - t0)) as f64 / 2.0 / 1e9;
        let want = LINE * mid_s / (RAMP_NS / 1e9);
        let got = r["rx_bps"].as_f64().unwrap();
        assert!(
            (got - want).abs() <= 0.002 * want + 800.0 * 1e9 / (t - prev_t) as f64,
            "RX_BPS at {t}: {got} want {want}"
        );
        // Below 100 % nothing queues: TX follows RX.
        let tx = r["tx_bps"].as_f64().unwrap();
        assert!((tx - got).abs() <= 0.002 * got + 1e6, "TX {tx} vs RX {got}");
        // Packets are octets / 800.
        let pps = r["rx_pps"].as_f64().unwrap();
        // Unicast packets are octets / 800; the non-unicast trickle adds one packet per port
        // every 1,000 snapshots (1 s here) without octets.
        let dt = (t - prev_t) as f64;
        let trickle = 800.0 * 1e9 / dt * (1.0 + dt / 1e9).floor();
        assert!(
            (pps * 800.0 - got).abs() <= 1e-6 * got + trickle,
            "PPS {pps} vs BPS {got}"
        );
        prev_t = t;
    }
    // Every port ramps the same way.
    assert_eq!(rows.len(), 8 * eth0.len());

    // history: the emulator's exact counters at the first ten snapshots.
    let c = col(&b, "Ethernet4", "IF_OUT_OCTETS");
    let ten = (t0 + 10_000_000).to_string();
    let rows = query(
        &d,
        &[
            "history",
            "-o",
            "Ethernet4",
            "-s",
            "SAI_PORT_STAT_IF_OUT_OCTETS",
            "--from",
            &from,
            "--to",
            &ten,
            "--json",
        ],
    )
    .rows();
    assert_eq!(rows.len(), 10);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["value"].as_u64().unwrap(), b.values[i * w + c], "row {i}");
        assert_eq!(chrono_ns(r["time"].as_str().unwrap()), b.ts[i]);
    }
    // history, bucketed: min/max/last of 100 ms buckets are the counters at the bucket's edges.
    let rows = query(
        &d,
        &[
            &[
                "history",
                "-o",
                "Ethernet4",
                "-s",
                "IF_OUT_OCTETS",
                "-r",
                "100ms",
                "--agg",
                "min,max,last",
                "--json",
            ][..],
            &win[..],
        ]
        .concat(),
    )
    .rows();
    assert!(rows.len() >= 10, "{} buckets", rows.len());
    for r in rows.iter().skip(1).take(rows.len().saturating_sub(2)) {
        let start = chrono_ns(r["time"].as_str().unwrap());
        // Snapshots are t0 + k ms: the bucket holds k in [⌈(start − t0)/1 ms⌉, ⌊(end − 1 − t0)/1 ms⌋].
        let first = ((start - t0) as u64).div_ceil(1_000_000) as usize;
        let last = ((start + 100_000_000 - 1 - t0) / 1_000_000) as usize;
        assert_eq!(r["min"].as_u64().unwrap(), b.values[first * w + c]);
        assert_eq!(r["max"].as_u64().unwrap(), b.values[last * w + c]);
        assert_eq!(r["last"].as_u64().unwrap(), b.values[last * w + c]);
    }

    // top by rate: the whole window's rate, the mean of the ramp.
    let rows = query(&d, &[&["top", "-n", "3", "--json"][..], &win[..]].concat()).rows();
    assert_eq!(rows.len(), 3);
    let rx = col(&b, "Ethernet0", "IF_IN_OCTETS");
    let last = n as usize - 1;
    let want = (b.values[last * w + rx] - b.values[rx]) as f64 * 1e9 / (t1 - t0) as f64;
    let got = rows[0]["rx_bps"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-9 * want,
        "top RX_BPS {got} want {want}"
    );
    let analytic = LINE * ((1_000_000 + (t1 - t0)) as f64 / 2.0 / 1e9) / (RAMP_NS / 1e9);
    assert!(
        (got - analytic).abs() <= 0.002 * analytic,
        "{got} vs ramp {analytic}"
    );

    // sql: wide table and long view agree with the emulator.
    let v = sql_i64(
        &d,
        "SELECT CAST(max(value) AS BIGINT) AS v FROM counters WHERE object = 'Ethernet0' AND stat = 'IF_IN_OCTETS'",
    );
    assert_eq!(v as u64, b.values[last * w + rx]);
    let v = sql_i64(
        &d,
        "SELECT CAST(count(*) AS BIGINT) AS v FROM counters WHERE stat = 'IF_IN_OCTETS'",
    );
    assert_eq!(v, 8 * n);
    let v = sql_i64(
        &d,
        "SELECT CAST(max(\"Ethernet4.IF_OUT_OCTETS\") AS BIGINT) AS v FROM stel_demo_port",
    );
    assert_eq!(v as u64, b.values[last * w + c]);

    // export: the copy answers the same.
    let lake = dir.path().join("lake");
    let lake_s = lake.to_str().unwrap();
    let o = query(&d, &["export", lake_s, "--json"]);
    assert!(!o.rows().is_empty());
    let n2 = sql_i64(&lake, "SELECT count(*) AS v FROM stel_demo_port");
    assert_eq!(n2, n);
    let a = query(&d, &[&["rates", "--json"][..], &win[..]].concat()).rows();
    let z = query(&lake, &[&["rates", "--json"][..], &win[..]].concat()).rows();
    assert_eq!(a, z);
    // A half window: only the rows inside, trimmed.
    let half = dir.path().join("half");
    let mid = (t0 + (t1 - t0) / 2).to_string();
    query(
        &d,
        &["export", half.to_str().unwrap(), "--from", &mid, "--json"],
    )
    .rows();
    let n3 = sql_i64(&half, "SELECT count(*) AS v FROM stel_demo_port");
    let first_kept = (((n - 1) * 1_000_000 / 2) as u64).div_ceil(1_000_000) as i64;
    assert_eq!(n3, n - first_kept);
}

/// `export --last 2s` of a demo history: the file that straddles the window's start is cut
/// through the history's own encoder (bytes per row of column data comparable to the
/// original's, not a PLAIN copy several times larger), its footer says what it holds (rows and
/// first/last ts equal to what pyarrow reads back, the original's other keys unchanged), and its
/// values are the original's rows inside the window.
#[test]
fn export_last_2s_cuts_through_the_history_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let counters = run_demo_for(
        dir.path(),
        "ramp",
        "3s",
        &["--ports", "8", "--stats", "30", "--interval", "1ms"],
    );
    let d = dir.path().join("data");
    let (n, _, t1) = history_span(&d, &counters, 1_000_000);
    assert!(n > 2_500, "a 3 s demo wrote only {n} snapshots");
    let lake = dir.path().join("lake");
    let o = query(
        &d,
        &["export", lake.to_str().unwrap(), "--last", "2s", "--json"],
    );
    let rows = o.rows();
    let trimmed: Vec<String> = rows
        .iter()
        .filter(|r| r["action"] == "trimmed")
        .map(|r| r["file"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !trimmed.is_empty(),
        "nothing straddles --last 2s: {}",
        o.stdout
    );
    // The raw snapshots: the window is [t1 + 1 − 2 s, t1 + 1), one snapshot per ms. The rollup
    // tiers' files that overlap it come whole.
    let raw = |r: &&Value| !r["file"].as_str().unwrap().starts_with("tier=");
    let exported: u64 = rows
        .iter()
        .filter(raw)
        .map(|r| r["rows"].as_u64().unwrap())
        .sum();
    assert_eq!(exported, 2_000, "{}", o.stdout);
    assert!(
        rows.iter()
            .filter(|r| !raw(r))
            .all(|r| r["action"] == "copied"),
        "{}",
        o.stdout
    );
    assert_eq!(
        sql_i64(&lake, "SELECT count(*) AS v FROM stel_demo_port"),
        2_000
    );
    let (lo, hi) = (t1 + 1 - 2_000_000_000, t1 + 1);
    let files: Vec<String> = trimmed.iter().map(|f| format!("{f:?}")).collect();
    let v = stel_testkit::python3_json(&format!(
        r#"
import json, pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
src_dir, dst_dir, lo, hi = {src:?}, {dst:?}, {lo}, {hi}
def data_bytes(md):
    return sum(md.row_group(i).column(j).total_compressed_size
               for i in range(md.num_row_groups) for j in range(md.num_columns))
def keys(md):
    return {{k.decode(): v.decode() for k, v in md.metadata.items() if k != b"ARROW:schema"}}
out = []
for rel in [{files}]:
    s, t = pq.ParquetFile(src_dir + "/" + rel), pq.ParquetFile(dst_dir + "/" + rel)
    st, tt = s.read(), t.read()
    ts = st["ts"].cast(pa.int64())
    want = st.filter(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)))
    got_ts = tt["ts"].cast(pa.int64())
    sk, tk = keys(s.metadata), keys(t.metadata)
    counts = ["stel.rows", "stel.first_ns", "stel.last_ns", "stel.samples", "stel.missing_samples"]
    out.append(dict(
        file=rel,
        rows=tt.num_rows, want_rows=want.num_rows,
        footer_rows=int(tk["stel.rows"]),
        first=pc.min(got_ts).as_py(), last=pc.max(got_ts).as_py(),
        footer_first=int(tk["stel.first_ns"]), footer_last=int(tk["stel.last_ns"]),
        samples=int(tk["stel.samples"]), width=tt.num_columns - 1,
        same_names=tt.column_names == want.column_names,
        same_values=all(tt.column(i).equals(want.column(i)) for i in range(tt.num_columns)),
        same_keys={{k: v for k, v in sk.items() if k not in counts}} == {{k: v for k, v in tk.items() if k not in counts}},
        encodings=sorted({{e for i in range(t.metadata.num_row_groups) for e in t.metadata.row_group(i).column(1).encodings}}),
        src_encodings=sorted({{e for i in range(s.metadata.num_row_groups) for e in s.metadata.row_group(i).column(1).encodings}}),
        bytes=data_bytes(t.metadata), src_bytes=data_bytes(s.metadata),
        per_row=data_bytes(t.metadata) / tt.num_rows,
        src_per_row=data_bytes(s.metadata) / st.num_rows,
    ))
print(json.dumps(out))
"#,
        src = d.to_str().unwrap(),
        dst = lake.to_str().unwrap(),
        files = files.join(", "),
    ));
    for f in v.as_array().unwrap() {
        eprintln!("{f}");
        let rows = f["rows"].as_u64().unwrap();
        assert!(rows > 0, "{f}");
        assert_eq!(rows, f["want_rows"].as_u64().unwrap(), "{f}");
        assert_eq!(rows, f["footer_rows"].as_u64().unwrap(), "{f}");
        assert_eq!(f["first"], f["footer_first"], "{f}");
        assert_eq!(f["last"], f["footer_last"], "{f}");
        assert_eq!(
            f["samples"].as_u64().unwrap(),
            rows * f["width"].as_u64().unwrap(),
            "{f}"
        );
        assert!(f["first"].as_i64().unwrap() >= lo, "{f}");
        assert!(f["last"].as_i64().unwrap() < hi, "{f}");
        assert_eq!(f["same_names"], true, "{f}");
        assert_eq!(f["same_values"], true, "{f}");
        assert_eq!(f["same_keys"], true, "{f}");
        assert_eq!(f["encodings"], f["src_encodings"], "{f}");
        // A subset of the original's rows in the same encoding is no larger than the original;
        // per row it carries the same per-column-chunk cost over fewer rows (here ~1.35×),
        // where a PLAIN copy would be several times the original.
        assert!(
            f["bytes"].as_u64().unwrap() <= f["src_bytes"].as_u64().unwrap(),
            "{f}"
        );
        let (got, was) = (
            f["per_row"].as_f64().unwrap(),
            f["src_per_row"].as_f64().unwrap(),
        );
        assert!(
            got <= 1.5 * was,
            "{got:.1} bytes of column data per row, the original {was:.1}: {f}"
        );
    }
}

#[test]
fn bursts_on_the_daemons_microbursts() {
    let dir = tempfile::tempdir().unwrap();
    // 10 µs snapshots: 50 µs bursts every 1 ms (phase 0 on Ethernet0): RX at line rate, the
    // egress queue offered 130 %.
    let counters = run_demo(
        dir.path(),
        "microburst",
        &["--ports", "2", "--stats", "13", "--interval", "10us"],
    );
    let d = dir.path().join("data");
    let (_, t0, t1) = history_span(&d, &counters, 10_000);
    let (from, to) = (t0.to_string(), (t1 + 1).to_string());
    let rows = query(
        &d,
        &[
            "bursts",
            "-i",
            "Ethernet0",
            "--threshold",
            "90",
            "--min-duration",
            "30us",
            "--from",
            &from,
            "--to",
            &to,
            "--json",
        ],
    )
    .rows();
    let ms = (t1 - t0) / 1_000_000;
    let rx: Vec<&Value> = rows.iter().filter(|r| r["dir"] == "RX").collect();
    let tx: Vec<&Value> = rows.iter().filter(|r| r["dir"] == "TX").collect();
    // One RX and one TX burst per millisecond of data.
    assert!(
        (rx.len() as i64 - ms - 1).abs() <= 1,
        "{} RX bursts in {ms} ms",
        rx.len()
    );
    assert_eq!(rx.len(), tx.len());
    for (k, r) in rx.iter().enumerate() {
        let start = chrono_ns(r["start"].as_str().unwrap());
        let dur = r["duration"].as_i64().unwrap();
        let peak = r["peak_util"].as_f64().unwrap();
        // The first burst starts with the data (no earlier snapshot to compare with).
        if k > 0 {
            // Bursts are the 5 snapshots from each millisecond on (phase 0), so the first
            // interval above 90 % starts 10 µs before it; 50 µs long, at line rate.
            assert_eq!(
                (start - t0 + 10_000) % 1_000_000,
                0,
                "burst {k} starts at {start}"
            );
            if start + 60_000 <= t1 {
                assert_eq!(dur, 50_000, "RX burst {k}");
            }
        }
        assert!((99.0..=101.0).contains(&peak), "RX peak {peak}");
    }
    // TX stays at line rate for the burst plus the queue's drain: 187.5 KB at 70 % of line
    // rate = 21.4 µs, i.e. two more 10 µs snapshots above 90 %: 70 µs.
    for (k, r) in tx.iter().enumerate().skip(1) {
        let start = chrono_ns(r["start"].as_str().unwrap());
        if start + 80_000 <= t1 {
            assert_eq!(r["duration"].as_i64().unwrap(), 70_000, "TX burst {k}");
        }
        let peak = r["peak_util"].as_f64().unwrap();
        assert!((99.0..=101.0).contains(&peak), "TX peak {peak}");
    }
    // Ethernet4's bursts are staggered (phase 7.919 ms mod 1 ms = 919 µs: the snapshots at 90…130 µs
    // of each millisecond) and as long.
    let rows = query(
        &d,
        &[
            "bursts",
            "-i",
            "Ethernet4",
            "--direction",
            "rx",
            "--min-duration",
            "30us",
            "--from",
            &from,
            "--to",
            &to,
            "--json",
        ],
    )
    .rows();
    assert!((rows.len() as i64 - ms).abs() <= 1, "{} bursts", rows.len());
    for r in rows.iter().skip(1) {
        let start = chrono_ns(r["start"].as_str().unwrap());
        assert_eq!(
            (start - t0) % 1_000_000,
            80_000,
            "Ethernet4 burst at {start}"
        );
        if start + 60_000 <= t1 {
            assert_eq!(r["duration"].as_i64().unwrap(), 50_000);
        }
    }
    // rates at stream resolution see the line-rate intervals too.
    let rows = query(
        &d,
        &[
            "rates",
            "-r",
            "stream",
            "-i",
            "Ethernet0",
            "--from",
            &from,
            "--to",
            &(t0 + 2_000_000).to_string(),
            "--json",
        ],
    )
    .rows();
    let over: usize = rows
        .iter()
        .filter(|r| r["rx_util"].as_f64().unwrap() > 95.0)
        .count();
    assert!(
        (9..=10).contains(&over),
        "{over} intervals at line rate in 2 ms"
    );
}

/// RFC 3339 (as the commands print times) → ns since the epoch.
fn chrono_ns(s: &str) -> i64 {
    stel_query::settings::parse_time_ns(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// UTIL uses each port's speed from SONiC: the daemon (with Redis) reads the PORT tables the
/// way portstat does and records them in every file's footer; stel-query divides by them, and
/// `--speed` overrides them for every port. Against a real redis-server.
#[test]
fn utilisation_uses_each_ports_speed_from_sonic() {
    let redis = stel_testkit::redis::TestRedis::start();
    let set = |db: i64, key: &str, fields: &[(&str, &str)]| {
        let mut c = redis.connect(db);
        for (f, v) in fields {
            redis::cmd("HSET")
                .arg(key)
                .arg(f)
                .arg(v)
                .query::<()>(&mut c)
                .unwrap();
        }
    };
    // Ethernet0: up, STATE_DB 25G. Ethernet4: STATE_DB says 100G but oper_status is down, so
    // APPL_DB's 40G (portstat's rule). Ethernet8: only CONFIG_DB, 50G. Ethernet12: nothing.
    set(
        0,
        "PORT_TABLE:Ethernet0",
        &[("speed", "25000"), ("oper_status", "up")],
    );
    set(6, "PORT_TABLE|Ethernet0", &[("speed", "25000")]);
    set(
        0,
        "PORT_TABLE:Ethernet4",
        &[("speed", "40000"), ("oper_status", "down")],
    );
    set(6, "PORT_TABLE|Ethernet4", &[("speed", "100000")]);
    set(4, "PORT|Ethernet8", &[("speed", "50000")]);
    let dir = tempfile::tempdir().unwrap();
    run_demo(dir.path(), "steady", &["--redis", redis.url()]);
    let data = dir.path().join("data");
    let file = stel_store::paths::published_parts(&data)[0].1.clone();
    let recorded = stel_testkit::python3_json(&format!(
        "import pyarrow.parquet as pq\nprint(pq.read_metadata({:?}).metadata[b'stel.port_speed_mbps'].decode())",
        file.to_str().unwrap()
    ));
    assert_eq!(recorded["Ethernet0"], 25000, "{recorded}");
    assert_eq!(recorded["Ethernet4"], 40000, "{recorded}");
    assert_eq!(recorded["Ethernet8"], 50000, "{recorded}");
    assert!(recorded.get("Ethernet12").is_none(), "{recorded}");
    let util = |args: &[&str]| -> Vec<(String, f64, f64)> {
        let mut a = vec![
            "rates",
            "-o",
            "Ethernet0,Ethernet4,Ethernet8,Ethernet12",
            "--json",
        ];
        a.extend_from_slice(args);
        query(&data, &a)
            .rows()
            .iter()
            .map(|r| {
                (
                    r["iface"].as_str().unwrap().to_string(),
                    r["rx_bps"].as_f64().unwrap(),
                    r["rx_util"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let rows = util(&[]);
    assert_eq!(rows.len(), 4);
    for ((port, bps, u), mbps) in rows.iter().zip([25_000.0, 40_000.0, 50_000.0, 100_000.0]) {
        let want = bps / (mbps * 1e6 / 8.0) * 100.0;
        assert!(
            (u - want).abs() < 1e-9 * want.max(1.0),
            "{port}: {u} vs {want}"
        );
    }
    for (port, bps, u) in util(&["--speed", "10G"]) {
        let want = bps / (10_000.0 * 1e6 / 8.0) * 100.0;
        assert!(
            (u - want).abs() < 1e-9 * want.max(1.0),
            "{port} --speed 10G: {u} vs {want}"
        );
    }
}

/// The commands `deploy/demo.sh` prints when the demo stops, run as printed (through bash, with
/// its `$data`) on history the demo wrote: each answers, none errors. The demo writes rollup
/// tiers next to its raw files, so a window ending at "the newest sample" must end at the
/// newest snapshot, not at the end of a tier's last interval.
#[test]
fn the_commands_the_demo_prints_answer() {
    let dir = tempfile::tempdir().unwrap();
    run_demo(dir.path(), "microburst", &[]);
    let data = dir.path().join("data");
    let script =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/demo.sh"))
            .unwrap();
    let commands: Vec<&str> = script
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("stel-query "))
        .collect();
    assert!(
        commands.len() >= 5,
        "demo.sh prints its commands: {commands:?}"
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_stel-query"))
        .parent()
        .unwrap();
    for c in commands {
        let o = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "set -eu; data={}; PATH={}:$PATH; {c}",
                data.display(),
                bin.display()
            ))
            .output()
            .expect("run bash");
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(o.status.success(), "{c}: {err}");
        assert!(
            out.lines().count() >= 2,
            "{c} printed no answer: {out}{err}"
        );
        assert!(!err.contains("stel-query:"), "{c}: {err}");
    }
}
