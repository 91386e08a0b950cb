//! stel-query over the rollup tiers: the same questions asked of a tree with tiers and of the
//! same raw files without them give the same rows, value for value (rates, top by rate, drops,
//! occupancy and bursts, history of levels, bursts at a tier's resolution), the summary says
//! which source answered, windows mixing a tier and raw history compose exactly, and a
//! resolution no remaining source holds is an error naming what exists.
//!
//! The data: the emulator's microbursts (3 ms at line rate every 20 ms, the egress queue
//! offered 130 %) on 4 ports × 13 stats every 1 ms for 200 s, decoded, written by the daemon's
//! Parquet sink and rollup writer.

use std::{path::Path, process::Command, sync::Arc};
use stel_emu::{default_stats, EmuConfig, Pattern};

use serde_json::Value;
use stel_ingest::decode::CounterBatch;
use stel_store::{
    parquet::{ParquetSink, ParquetSinkConfig},
    rollup::{RollupConfig, RollupWriter},
    sai::ObjectType,
    BudgetHandle,
};

/// 2023-11-14T22:13:20Z.
const START: i64 = 1_700_000_000_000_000_000;
const MS: i64 = 1_000_000;
const SNAPSHOTS: u64 = 200_000;
/// 22:14:00 and 22:16:00: two whole minutes.
const FROM: i64 = START + 40_000 * MS;
const TO: i64 = START + 160_000 * MS;

fn emulated() -> CounterBatch {
    let cfg = EmuConfig {
        ports: 4,
        stats: default_stats(ObjectType::Port, 13),
        pattern: Pattern::Microburst,
        interval_ns: MS as u64,
        burst_ns: 3 * MS as u64,
        burst_period_ns: 20 * MS as u64,
        profile: "lab".into(),
        start_ns: START as u64,
        ..EmuConfig::design()
    };
    stel_ingest::decode::emulated(cfg, SNAPSHOTS).expect("emulator round trip")
}

/// Rows `from..to` of `b` as a batch.
fn slice(b: &CounterBatch, from: usize, to: usize) -> CounterBatch {
    let w = b.schema.width();
    CounterBatch::new(
        Arc::clone(&b.schema),
        b.ts[from..to].to_vec(),
        b.values[from * w..to * w].to_vec(),
        Vec::new(),
    )
    .expect("batch shape")
}

/// Raw files of rows `from..` under `root`, a file per 20,000 snapshots.
fn raw(root: &Path, b: &CounterBatch, from: usize) {
    let mut s = from;
    while s < b.ts.len() {
        let e = (s + 20_000).min(b.ts.len());
        let sink = ParquetSink::start(ParquetSinkConfig::for_test(root), None).expect("sink");
        sink.submit(Arc::new(slice(b, s, e))).expect("submit");
        assert_eq!(
            stel_store::parquet::accounting::lost(&sink.shutdown().expect("shutdown")),
            0
        );
        s = e;
    }
}

/// Tiers (1 s, 1 min) of rows `..to` under `root`, by the daemon's rollup writer.
fn tiers(root: &Path, b: &CounterBatch, to: usize) {
    let mut w = RollupWriter::new(
        &RollupConfig::for_test(),
        root.to_path_buf(),
        "sw".into(),
        BudgetHandle::default(),
    )
    .expect("rollup writer");
    let mut s = 0;
    while s < to {
        let e = (s + 997).min(to);
        w.push(&slice(b, s, e));
        s = e;
    }
    w.finish();
    assert_eq!(w.totals().write_errors, 0);
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn query(dir: &Path, args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_stel-query"))
        .args(args)
        .arg("--json")
        .arg("-d")
        .arg(dir)
        .output()
        .expect("run stel-query");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    }
}

/// (rows, summary) of a successful run.
fn rows(dir: &Path, args: &[&str]) -> (Vec<Value>, Value) {
    let o = query(dir, args);
    assert!(
        o.code == 0 || o.code == 1,
        "{args:?} on {}: exit {}: {}",
        dir.display(),
        o.code,
        o.stderr
    );
    let mut rows = Vec::new();
    let mut summary = Value::Null;
    for l in o.stdout.lines() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        match v["type"].as_str() {
            Some("row") => rows.push(v["data"].clone()),
            Some("summary") => summary = v["data"].clone(),
            _ => {}
        }
    }
    (rows, summary)
}

/// Asks `args` of `tiered` and of `raw_only`: same rows; returns the source that answered
/// from tiers.
fn same(tiered: &Path, raw_only: &Path, args: &[&str]) -> String {
    let (a, sa) = rows(tiered, args);
    let (b, sb) = rows(raw_only, args);
    assert!(!b.is_empty(), "{args:?}: the raw answer has rows");
    assert_eq!(a, b, "{args:?}: tier and raw answers differ");
    assert_eq!(sb["tier"], "raw", "{args:?}: {sb}");
    sa["tier"].as_str().unwrap_or_default().to_string()
}

fn window() -> Vec<String> {
    vec![
        "--from".into(),
        FROM.to_string(),
        "--to".into(),
        TO.to_string(),
    ]
}

fn args<'a>(w: &'a [String], rest: &[&'a str]) -> Vec<&'a str> {
    let mut v: Vec<&str> = rest.to_vec();
    v.extend(w.iter().map(String::as_str));
    v
}

#[test]
fn tier_answers_equal_raw_answers() {
    let b = emulated();
    let dir = tempfile::tempdir().unwrap();
    let (full, raw_only, mixed, late) = (
        dir.path().join("full"),
        dir.path().join("raw"),
        dir.path().join("mixed"),
        dir.path().join("late"),
    );
    raw(&full, &b, 0);
    tiers(&full, &b, SNAPSHOTS as usize);
    raw(&raw_only, &b, 0);
    // Tiers for the first 100 s only (up to 22:15:00); raw for everything.
    raw(&mixed, &b, 0);
    tiers(&mixed, &b, 100_000);
    // Raw for the last 50 s only; tiers for everything.
    raw(&late, &b, 150_000);
    tiers(&late, &b, SNAPSHOTS as usize);
    let w = window();

    // Rates at the tiers' resolutions and over the whole window.
    assert_eq!(
        same(&full, &raw_only, &args(&w, &["rates", "-r", "1m"])),
        "1m"
    );
    assert_eq!(
        same(&full, &raw_only, &args(&w, &["rates", "-r", "1s"])),
        "1s"
    );
    assert_eq!(
        same(&full, &raw_only, &args(&w, &["rates", "-r", "2m"])),
        "1m"
    );
    // The whole window is cut into a thousand sub-intervals (query::cmd::rates): 120 ms here,
    // finer than any tier.
    assert_eq!(same(&full, &raw_only, &args(&w, &["rates"])), "raw");
    // Finer than every tier: raw.
    assert_eq!(
        same(&full, &raw_only, &args(&w, &["rates", "-r", "100ms"])),
        "raw"
    );
    // top: rate, drops, occupancy, bursts at both thresholds.
    for (by, src) in [("rate", "raw"), ("drops", "1m"), ("occupancy", "1m")] {
        assert_eq!(
            same(
                &full,
                &raw_only,
                &args(&w, &["top", "--by", by, "-n", "100"])
            ),
            src,
            "{by}"
        );
    }
    for thr in ["50", "90"] {
        let a = args(
            &w,
            &["top", "--by", "bursts", "--threshold", thr, "-n", "100"],
        );
        assert_eq!(same(&full, &raw_only, &a), "1m", "{thr}");
    }
    // A threshold the tiers do not hold, a minimum duration longer than a snapshot interval:
    // raw answers (and still equals).
    let a = args(
        &w,
        &["top", "--by", "bursts", "--threshold", "70", "-n", "100"],
    );
    assert_eq!(same(&full, &raw_only, &a), "raw");
    let a = args(
        &w,
        &[
            "top",
            "--by",
            "bursts",
            "--min-duration",
            "2500us",
            "-n",
            "100",
        ],
    );
    assert_eq!(same(&full, &raw_only, &a), "raw");
    // history: levels from the tier, a counter's min from raw.
    let a = args(
        &w,
        &[
            "history",
            "-o",
            "Ethernet4",
            "-s",
            "IN_CURR_OCCUPANCY_BYTES",
            "-r",
            "1m",
            "--agg",
            "min,max,avg,last",
        ],
    );
    assert_eq!(same(&full, &raw_only, &a), "1m");
    let a = args(
        &w,
        &[
            "history",
            "-o",
            "Ethernet4",
            "-s",
            "IF_IN_OCTETS",
            "-r",
            "1s",
            "--agg",
            "last",
        ],
    );
    assert_eq!(same(&full, &raw_only, &a), "1s");
    let a = args(
        &w,
        &[
            "history",
            "-o",
            "Ethernet4",
            "-s",
            "IF_IN_OCTETS",
            "-r",
            "1s",
            "--agg",
            "min",
        ],
    );
    assert_eq!(same(&full, &raw_only, &a), "raw");
    // Bursts at a tier's resolution (from its last values).
    let a = args(&w, &["bursts", "-r", "1s", "--threshold", "40"]);
    assert_eq!(same(&full, &raw_only, &a), "1s");

    // A window half in the tiers, half only in raw: composed exactly.
    assert_eq!(
        same(&mixed, &raw_only, &args(&w, &["rates", "-r", "1m"])),
        "1m+raw"
    );
    for thr in ["50", "90"] {
        let a = args(
            &w,
            &["top", "--by", "bursts", "--threshold", thr, "-n", "100"],
        );
        assert_eq!(same(&mixed, &raw_only, &a), "1m+raw", "{thr}");
    }
    assert_eq!(
        same(&mixed, &raw_only, &args(&w, &["rates", "-r", "1s"])),
        "1s+raw"
    );

    // Raw kept only for the last 50 s: a finer resolution over the older part is an error that
    // says what exists.
    let o = query(&late, &args(&w, &["rates", "-r", "100ms"]));
    assert_eq!(o.code, 1, "{}", o.stderr);
    for part in [
        "raw kept",
        "the finest tier there is 1s",
        "tiers: 1m",
        "resolution 100ms",
    ] {
        assert!(o.stderr.contains(part), "{part}: {}", o.stderr);
    }
    // Over the part raw still holds, the same question is answered from raw.
    let tail = vec![
        "--from".to_string(),
        (START + 160_000 * MS).to_string(),
        "--to".to_string(),
        (START + 170_000 * MS).to_string(),
    ];
    assert_eq!(
        same(&late, &raw_only, &args(&tail, &["rates", "-r", "100ms"])),
        "raw"
    );
    // And the tiers answer the old part at their resolutions.
    assert_eq!(
        same(&late, &raw_only, &args(&w, &["rates", "-r", "1s"])),
        "1s"
    );
    // An export of the window carries the tiers that overlap it (whole files), so the copy
    // answers the old part as its source does.
    let exported = dir.path().join("exported");
    let o = query(
        &late,
        &[
            &["export", exported.to_str().unwrap()][..],
            &w.iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("\"file\":\"tier=1s/"), "{}", o.stdout);
    assert!(o.stdout.contains("\"file\":\"tier=1m/"), "{}", o.stdout);
    for q in [&["rates", "-r", "1s"][..], &["rates", "-r", "1m"]] {
        let ((a, sa), (b, sb)) = (rows(&exported, &args(&w, q)), rows(&late, &args(&w, q)));
        assert_eq!(a.len(), b.len(), "{q:?}: {sa} / {sb}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x, y, "{q:?}");
        }
        assert_eq!(sa["segments"], sb["segments"], "{q:?}");
    }
    // --verbose says where each part came from.
    let o = query(
        &mixed,
        &[&args(&w, &["rates", "-r", "1m", "--verbose"])[..]].concat(),
    );
    assert!(
        o.stderr.contains("1m 2023-11-14T22:14:00.000000000Z..2023-11-14T22:15:00.000000000Z, raw 2023-11-14T22:15:00"),
        "{}",
        o.stderr
    );
}

/// Rollup tiers without the raw stream — a data dir of `tier=` directories, and a lake of
/// `_tiers/` only (what `[upload] raw = false` uploads) — on the local engine and on Sail: every
/// question says what the root holds and exits 2, instead of "no Parquet files" or "not a stel
/// lake". Missing Sail fails the test.
#[test]
fn tiers_without_the_raw_stream_say_so() {
    let b = emulated();
    let dir = tempfile::tempdir().unwrap();
    tiers(dir.path(), &b, b.ts.len());
    for q in [
        &["rates"][..],
        &["top", "--by", "bursts"],
        &["sql", "SHOW TABLES"],
    ] {
        let o = query(dir.path(), q);
        assert_eq!(o.code, 2, "{q:?}: {}", o.stderr);
        assert!(
            o.stderr
                .contains("holds rollup tiers only (1m, 1s under tier=<t>/) and no raw stream"),
            "{q:?}: {}",
            o.stderr
        );
    }
    // The same files as a lake's: `_tiers/tier=<t>/switch=<s>/profile=…`.
    let lake = tempfile::tempdir().unwrap();
    for t in ["1s", "1m"] {
        let to = lake.path().join(format!("_tiers/tier={t}"));
        std::fs::create_dir_all(&to).unwrap();
        std::fs::rename(dir.path().join(format!("tier={t}")), to.join("switch=sw")).unwrap();
    }
    let sail = stel_testkit::SailServer::start(1, &[]);
    let remote = sail.remote();
    for engine in [&[][..], &["--engine", "spark", "--remote", remote.as_str()]] {
        let q: Vec<&str> = ["top", "--by", "bursts"]
            .into_iter()
            .chain(engine.iter().copied())
            .collect();
        let o = query(lake.path(), &q);
        assert_eq!(o.code, 2, "{q:?}: {}", o.stderr);
        assert!(
            o.stderr.contains(
                "holds rollup tiers only (1m, 1s under _tiers/tier=<t>/switch=<s>/) and no raw stream"
            ),
            "{q:?}: {}",
            o.stderr
        );
    }
}

/// A lake of one switch with its tiers (`switch=sw/…` raw, `_tiers/tier=<t>/switch=sw/…`) on
/// Sail: `top --by bursts` on whole minutes reads the 1m tier; a window over ten minutes off
/// them reads the raw stream (Spark joins no raw edges to a tier, unlike the local engine) and
/// a note says so, and how many files, before the question runs. Missing Sail fails the test.
#[test]
fn spark_reads_a_tier_on_its_intervals_only_and_says_so() {
    let b = emulated();
    let lake = tempfile::tempdir().unwrap();
    raw(&lake.path().join("switch=sw"), &b, 0);
    let t = tempfile::tempdir().unwrap();
    tiers(t.path(), &b, b.ts.len());
    for tier in ["1s", "1m"] {
        let to = lake.path().join(format!("_tiers/tier={tier}"));
        std::fs::create_dir_all(&to).unwrap();
        std::fs::rename(t.path().join(format!("tier={tier}")), to.join("switch=sw")).unwrap();
    }
    let sail = stel_testkit::SailServer::start(1, &[]);
    let remote = sail.remote();
    let spark = ["--engine", "spark", "--remote", remote.as_str()];
    let note = "spark: the window is not whole minutes, so this reads the raw stream (";
    let q = ["top", "--by", "bursts", "--threshold", "90", "-n", "100"];

    let w = window();
    let o = query(lake.path(), &[&q[..], &spark, &args(&w, &[])].concat());
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains(r#""tier":"1m""#), "{}", o.stdout);
    assert!(!o.stderr.contains(note), "{}", o.stderr);

    // 22:13:20 to 22:24:20.5: eleven minutes, off the minutes.
    let (from, to) = (START.to_string(), (START + 660_500 * MS).to_string());
    let w = ["--from", from.as_str(), "--to", to.as_str()];
    let o = query(lake.path(), &[&q[..], &spark, &w].concat());
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains(r#""tier":"raw""#), "{}", o.stdout);
    let files = walk(&lake.path().join("switch=sw"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .count();
    assert!(
        o.stderr.contains(&format!(
            "{note}{files} files); --from/--to on whole minutes reads the 1m tier"
        )),
        "{}",
        o.stderr
    );
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
