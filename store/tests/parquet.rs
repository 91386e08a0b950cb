//! The Parquet sink against real files, read back by an independent reader (pyarrow, DuckDB).
//!
//! Needs `python3` with `pyarrow` and `duckdb` (`deploy/setup.sh --test` installs them): a test
//! fails loudly when they are missing, it never skips. The disk-full test mounts a 2 MiB tmpfs
//! and so needs root (the README's test command runs as root).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use stel_store::{
    parquet::{accounting, keys, Codec, ParquetSink, ParquetSinkConfig, ShedReason},
    paths::{classify, LayoutEntry},
    sai::StatKey,
    BatchBuilder, CounterBatch, CounterColumn, SessionSchema,
};

/// 2023-11-14T22:13:20Z
const T0: i64 = 1_700_000_000_000_000_000;
const INTERVAL: i64 = 10_000;
const HOUR: i64 = 3_600_000_000_000;

fn schema(profile: &str, objects: usize, stats: &[u32], generation: u64) -> Arc<SessionSchema> {
    let mut columns = Vec::new();
    for o in 0..objects {
        for s in stats {
            columns.push(CounterColumn {
                label: (o + 1) as u16,
                object: format!("Ethernet{}", 4 * o),
                key: StatKey {
                    object_type: 1,
                    stat_id: *s,
                },
            });
        }
    }
    Arc::new(SessionSchema {
        profile: profile.into(),
        group: "PORT".into(),
        domain: 7,
        template_ids: vec![256 + generation as u16],
        part_offsets: vec![0],
        columns,
        generation,
    })
}

/// The value every test writes for (ts, column): exact and easy to recompute anywhere.
fn value(ts: i64, col: usize) -> u64 {
    let i = ((ts - T0) / INTERVAL) as u64;
    i * 1000 + col as u64 * 7 + (i * i) % 13
}

/// `rows` snapshots starting at `ts0`, every `INTERVAL`, filled with [`value`] (or `f`).
fn batch_with(
    s: &Arc<SessionSchema>,
    ts0: i64,
    rows: usize,
    f: &dyn Fn(i64, usize) -> u64,
) -> CounterBatch {
    let mut b = BatchBuilder::new(Arc::clone(s), rows);
    for r in 0..rows {
        let ts = ts0 + r as i64 * INTERVAL;
        for (c, v) in b.part_mut(ts, 0).unwrap().iter_mut().enumerate() {
            *v = f(ts, c);
        }
    }
    b.finish()
}

fn batch(s: &Arc<SessionSchema>, ts0: i64, rows: usize) -> CounterBatch {
    batch_with(s, ts0, rows, &value)
}

/// The sink's counters under the names this file's assertions use, read from the registry
/// snapshot (`stel_sink_*{sink="parquet"}`, `stel_parquet_*`).
#[derive(Debug)]
struct ParquetStats {
    samples_submitted: u64,
    samples_written: u64,
    shed: u64,
    lost: u64,
    in_flight: u64,
    batches_queued: u64,
    batches_dequeued: u64,
    rows_written: u64,
    missing_samples_written: u64,
    files_published: u64,
    bytes_published: u64,
    write_errors: u64,
    disk_full_errors: u64,
    disk_full_episodes: u64,
    recoveries: u64,
    rotations_schema: u64,
    rotations_hour: u64,
    rotations_size: u64,
    memory_budget_bytes: u64,
    shed_memory_budget_batches: u64,
    shed_memory_budget_samples: u64,
    shed_queue_full_batches: u64,
    shed_queue_full_samples: u64,
    lost_disk_full_samples: u64,
    lost_write_error_samples: u64,
    stale_temp_files_removed: u64,
    retention_files_deleted: u64,
    retention_bytes_deleted: u64,
    history_bytes: u64,
}

impl ParquetStats {
    fn shed_samples(&self) -> u64 {
        self.shed
    }
    fn lost_samples(&self) -> u64 {
        self.lost
    }
    fn in_flight_samples(&self) -> u64 {
        self.in_flight
    }
}

fn parquet_stats(s: stel_store::metrics::Snapshot) -> ParquetStats {
    use stel_store::metrics::{Label, Metric as M};
    let sink = |m| s.sum_where(m, Label::Sink, "parquet");
    let why = |m, r| s.sum_where(m, Label::Reason, r);
    let dropped_batches = |r: &str| {
        s.series(M::SinkDroppedBatches)
            .filter(|x| x.label(Label::Sink) == "parquet" && x.label(Label::Reason) == r)
            .map(|x| x.value)
            .sum()
    };
    ParquetStats {
        samples_submitted: accounting::submitted(&s),
        samples_written: accounting::written(&s),
        shed: accounting::shed(&s),
        lost: accounting::lost(&s),
        in_flight: accounting::in_flight(&s),
        batches_queued: sink(M::SinkQueuedBatches),
        batches_dequeued: sink(M::SinkDequeuedBatches),
        rows_written: s.sum(M::ParquetWrittenRows),
        missing_samples_written: s.sum(M::ParquetMissingSamples),
        files_published: s.sum(M::SinkPublishedFiles),
        bytes_published: s.sum(M::ParquetPublishedBytes),
        write_errors: s.sum(M::ParquetWriteErrors),
        disk_full_errors: why(M::ParquetWriteErrors, "disk_full"),
        disk_full_episodes: why(M::ParquetErrorEpisodes, "disk_full"),
        recoveries: s.sum(M::ParquetRecoveries),
        rotations_schema: why(M::ParquetRotations, "schema"),
        rotations_hour: why(M::ParquetRotations, "hour"),
        rotations_size: why(M::ParquetRotations, "size"),
        memory_budget_bytes: s.sum(M::ParquetMemoryBudgetBytes),
        shed_memory_budget_batches: dropped_batches("memory_budget"),
        shed_memory_budget_samples: accounting::dropped(&s, "memory_budget"),
        shed_queue_full_batches: dropped_batches("queue_full"),
        shed_queue_full_samples: accounting::dropped(&s, "queue_full"),
        lost_disk_full_samples: accounting::dropped(&s, "disk_full"),
        lost_write_error_samples: accounting::dropped(&s, "write_error"),
        stale_temp_files_removed: s.sum(M::ParquetStaleTempFiles),
        retention_files_deleted: s.sum(M::ParquetRetentionFiles),
        retention_bytes_deleted: s.sum(M::ParquetRetentionBytes),
        history_bytes: s.sum(M::ParquetHistoryBytes),
    }
}

fn assert_accounted(st: &ParquetStats) {
    assert_eq!(
        st.samples_submitted,
        st.samples_written + st.shed_samples() + st.lost_samples(),
        "every submitted sample is written, shed or lost: {st:?}"
    );
    assert_eq!(st.in_flight_samples(), 0);
    assert_eq!(st.batches_queued, st.batches_dequeued);
}

/// Runs `script` under python3 with `args`; returns its stdout parsed as JSON. Panics (never
/// skips) when python3/pyarrow is missing.
fn python(script: &str, args: &[&str]) -> serde_json::Value {
    let out = stel_testkit::python3(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("python3 is required for the Parquet read-back tests (bash deploy/setup.sh --test installs it): {e}")
        });
    assert!(
        out.status.success(),
        "python3 failed (pyarrow and duckdb are required; bash deploy/setup.sh --test installs them):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "python3 printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Reads one file with pyarrow: rows, column names, ts (as int ns), every column's values,
/// footer key-value metadata, field metadata of column 1, and the ts type.
const READ_FILE: &str = r#"
import json, sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
md = pq.read_metadata(sys.argv[1]).metadata
cols = {}
for name in t.column_names[1:]:
    cols[name] = t.column(name).to_pylist()
f1 = t.schema.field(1)
print(json.dumps({
    "rows": t.num_rows,
    "names": t.column_names,
    "ts_type": str(t.schema.field(0).type),
    "ts": t.column(0).cast("int64").to_pylist(),
    "cols": cols,
    "kv": {k.decode(): v.decode() for k, v in md.items() if k != b"ARROW:schema"},
    "field1_md": {k.decode(): v.decode() for k, v in (f1.metadata or {}).items()},
}))
"#;

fn published(root: &Path) -> Vec<PathBuf> {
    files(root, |e| matches!(e, LayoutEntry::Part { .. }))
}

fn temps(root: &Path) -> Vec<PathBuf> {
    files(root, |e| matches!(e, LayoutEntry::Temp { .. }))
}

fn files(root: &Path, want: impl Fn(&LayoutEntry) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if want(&classify(root, &p)) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn files_read_back_by_pyarrow_with_exact_values_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema("lab 1/a", 4, &[0, 1, 9], 3);
    let sink = ParquetSink::start(ParquetSinkConfig::for_test(dir.path()), None).unwrap();
    assert_eq!(sink.recovery().published_files, 0);
    for i in 0..5 {
        sink.submit(Arc::new(batch(&s, T0 + i * 100 * INTERVAL, 100)))
            .unwrap();
    }
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_accounted(&st);
    assert_eq!(st.samples_written, 5 * 100 * 12);
    assert_eq!(st.files_published, 1);
    assert_eq!(st.rows_written, 500);
    let files = published(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let rel = files[0].strip_prefix(dir.path()).unwrap();
    assert_eq!(
        rel.to_str().unwrap(),
        "profile=lab%201%2Fa/group=PORT/date=2023-11-14/hour=22/part-01700000000000000000-000000.parquet"
    );
    assert_eq!(
        std::fs::metadata(&files[0]).unwrap().len(),
        st.bytes_published
    );

    let got = python(READ_FILE, &[files[0].to_str().unwrap()]);
    assert_eq!(got["rows"], 500);
    assert_eq!(got["ts_type"], "timestamp[ns, tz=UTC]");
    let names: Vec<&str> = got["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 13);
    assert_eq!(
        &names[..4],
        &[
            "ts",
            "Ethernet0.IF_IN_OCTETS",
            "Ethernet0.IF_IN_UCAST_PKTS",
            "Ethernet0.IF_OUT_OCTETS"
        ]
    );
    for (r, ts) in got["ts"].as_array().unwrap().iter().enumerate() {
        assert_eq!(ts.as_i64().unwrap(), T0 + r as i64 * INTERVAL);
    }
    for (c, name) in names[1..].iter().enumerate() {
        let vals = got["cols"][name].as_array().unwrap();
        assert_eq!(vals.len(), 500);
        for (r, v) in vals.iter().enumerate() {
            assert_eq!(
                v.as_u64().unwrap(),
                value(T0 + r as i64 * INTERVAL, c),
                "{name} row {r}"
            );
        }
    }
    let kv = &got["kv"];
    assert_eq!(kv[keys::PROFILE], "lab 1/a");
    assert_eq!(kv[keys::GROUP], "PORT");
    assert_eq!(kv[keys::DOMAIN], "7");
    assert_eq!(kv[keys::TEMPLATE_IDS], "259");
    assert_eq!(kv[keys::GENERATION], "3");
    assert_eq!(kv[keys::SWITCH], "test-switch");
    assert_eq!(kv[keys::VERSION], env!("CARGO_PKG_VERSION"));
    assert_eq!(kv[keys::FIRST_NS], T0.to_string());
    assert_eq!(kv[keys::LAST_NS], (T0 + 499 * INTERVAL).to_string());
    assert_eq!(kv[keys::ROWS], "500");
    assert_eq!(kv[keys::SAMPLES], "6000");
    assert_eq!(kv[keys::MISSING_SAMPLES], "0");
    let objects: serde_json::Value =
        serde_json::from_str(kv[keys::OBJECTS].as_str().unwrap()).unwrap();
    assert_eq!(objects["1"], "Ethernet0");
    assert_eq!(objects["4"], "Ethernet12");
    let sai: serde_json::Value =
        serde_json::from_str(kv[keys::SAI_NAMES].as_str().unwrap()).unwrap();
    assert_eq!(sai["IF_IN_OCTETS"], "SAI_PORT_STAT_IF_IN_OCTETS");
    let f1 = &got["field1_md"];
    assert_eq!(f1["stel.object"], "Ethernet0");
    assert_eq!(f1["stel.label"], "1");
    assert_eq!(f1["stel.sai_name"], "SAI_PORT_STAT_IF_IN_OCTETS");

    // The tree as a Hive dataset: partition values decoded, a temp file next to the part
    // ignored (pyarrow and DuckDB).
    let part_dir = files[0].parent().unwrap();
    std::fs::write(
        part_dir.join(".part-01700000000000000001-000000.parquet.tmp"),
        b"half a file",
    )
    .unwrap();
    let ds = python(
        r#"
import json, sys
import pyarrow.dataset as ds
import duckdb
d = ds.dataset(sys.argv[1], format="parquet", partitioning="hive")
t = d.to_table(columns=["profile", "group", "date", "hour", "Ethernet4.IF_OUT_OCTETS"])
n = duckdb.sql(f"select count(*), sum(\"Ethernet0.IF_IN_OCTETS\") from read_parquet('{sys.argv[1]}/**/*.parquet', hive_partitioning=true)").fetchall()[0]
print(json.dumps({"rows": t.num_rows, "profile": t.column("profile")[0].as_py(),
  "group": t.column("group")[0].as_py(), "date": str(t.column("date")[0].as_py()),
  "hour": int(t.column("hour")[0].as_py()), "duck_rows": n[0], "duck_sum": int(n[1])}))
"#,
        &[dir.path().to_str().unwrap()],
    );
    assert_eq!(ds["rows"], 500);
    assert_eq!(ds["profile"], "lab 1/a");
    assert_eq!(ds["group"], "PORT");
    assert_eq!(ds["date"], "2023-11-14");
    assert_eq!(ds["hour"], 22);
    assert_eq!(ds["duck_rows"], 500);
    let sum: u64 = (0..500).map(|r| value(T0 + r * INTERVAL, 0)).sum();
    assert_eq!(ds["duck_sum"].as_u64().unwrap(), sum);

    // The next start removes the stray temp file and reports it.
    let sink = ParquetSink::start(ParquetSinkConfig::for_test(dir.path()), None).unwrap();
    let rep = sink.recovery().clone();
    assert_eq!(rep.stale_temp_files, 1);
    assert_eq!(rep.published_files, 1);
    assert_eq!(rep.sessions.len(), 1);
    assert_eq!(rep.sessions[0].profile, "lab 1/a");
    assert_eq!(rep.sessions[0].last_durable_ns, Some(T0 + 499 * INTERVAL));
    assert_eq!(rep.sessions[0].lost_from_ns, Some(T0 + 1));
    assert!(temps(dir.path()).is_empty());
    assert_eq!(
        parquet_stats(sink.shutdown().unwrap()).stale_temp_files_removed,
        1
    );
}

#[test]
fn schema_change_starts_a_new_file_and_no_file_mixes_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let g1 = schema("p", 2, &[0, 1], 1);
    let g2 = schema("p", 3, &[0, 1, 9], 2);
    let sink = ParquetSink::start(ParquetSinkConfig::for_test(dir.path()), None).unwrap();
    sink.submit(Arc::new(batch(&g1, T0, 10))).unwrap();
    sink.submit(Arc::new(batch(&g1, T0 + 10 * INTERVAL, 10)))
        .unwrap();
    sink.submit(Arc::new(batch(&g2, T0 + 20 * INTERVAL, 10)))
        .unwrap();
    // Same generation number but a different template: still a different schema.
    let mut g1b = (*g1).clone();
    g1b.template_ids = vec![999];
    let g1b = Arc::new(g1b);
    sink.submit(Arc::new(batch(&g1b, T0 + 30 * INTERVAL, 10)))
        .unwrap();
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_accounted(&st);
    assert_eq!(st.rotations_schema, 2);
    assert_eq!(st.files_published, 3);
    let files = published(dir.path());
    assert_eq!(files.len(), 3);
    let want = [
        (20, 5, "1", "257"),
        (10, 10, "2", "258"),
        (10, 5, "1", "999"),
    ];
    for (f, (rows, cols, generation, tid)) in files.iter().zip(want) {
        let got = python(READ_FILE, &[f.to_str().unwrap()]);
        assert_eq!(got["rows"], rows, "{f:?}");
        assert_eq!(got["names"].as_array().unwrap().len(), cols, "{f:?}");
        assert_eq!(got["kv"][keys::GENERATION], generation);
        assert_eq!(got["kv"][keys::TEMPLATE_IDS], tid);
    }
}

#[test]
fn batches_split_at_hour_boundaries_into_their_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema("p", 1, &[0], 1);
    // T0 is 22:13:20; start 5 intervals before 23:00:00.
    let next_hour = (T0 / HOUR + 1) * HOUR;
    let start = next_hour - 5 * INTERVAL;
    let sink = ParquetSink::start(ParquetSinkConfig::for_test(dir.path()), None).unwrap();
    sink.submit(Arc::new(batch_with(&s, start, 12, &|ts, _| ts as u64)))
        .unwrap();
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_accounted(&st);
    assert_eq!(st.rotations_hour, 1);
    let files = published(dir.path());
    assert_eq!(files.len(), 2);
    let rels: Vec<String> = files
        .iter()
        .map(|f| {
            f.strip_prefix(dir.path())
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(rels[0].contains("/date=2023-11-14/hour=22/"), "{rels:?}");
    assert!(rels[1].contains("/date=2023-11-14/hour=23/"), "{rels:?}");
    assert!(
        rels[1].ends_with(&format!("part-{next_hour:020}-000001.parquet")),
        "{rels:?}"
    );
    let a = python(READ_FILE, &[files[0].to_str().unwrap()]);
    let b = python(READ_FILE, &[files[1].to_str().unwrap()]);
    assert_eq!(a["rows"], 5);
    assert_eq!(b["rows"], 7);
    assert_eq!(b["ts"][0].as_i64().unwrap(), next_hour);
}

#[test]
fn size_rotation_keeps_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema("p", 8, &[0, 1, 2, 3], 1);
    let cfg = ParquetSinkConfig {
        max_file_bytes: 8 << 10,
        row_group_rows: 64,
        page_rows: 64,
        compression: Codec::None,
        ..ParquetSinkConfig::for_test(dir.path())
    };
    let sink = ParquetSink::start(cfg, None).unwrap();
    for i in 0..40 {
        sink.submit(Arc::new(batch_with(
            &s,
            T0 + i * 64 * INTERVAL,
            64,
            &|ts, c| (ts as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ c as u64,
        )))
        .unwrap();
    }
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_accounted(&st);
    assert!(st.rotations_size >= 2, "{st:?}");
    let files = published(dir.path());
    assert_eq!(files.len() as u64, st.files_published);
    let got = python(
        r#"
import json, sys
import pyarrow.dataset as ds
t = ds.dataset(sys.argv[1], format="parquet", partitioning="hive").to_table(columns=["ts"])
v = sorted(t.column("ts").cast("int64").to_pylist())
print(json.dumps({"rows": len(v), "first": v[0], "last": v[-1], "distinct": len(set(v))}))
"#,
        &[dir.path().to_str().unwrap()],
    );
    assert_eq!(got["rows"], 40 * 64);
    assert_eq!(got["distinct"], 40 * 64);
    assert_eq!(got["first"].as_i64().unwrap(), T0);
    assert_eq!(got["last"].as_i64().unwrap(), T0 + (40 * 64 - 1) * INTERVAL);
}

#[test]
fn retention_deletes_oldest_first_by_bytes_and_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema("p", 4, &[0, 1], 1);
    // One file per hour: 6 files, oldest first.
    let sink = ParquetSink::start(ParquetSinkConfig::for_test(dir.path()), None).unwrap();
    for h in 0..6 {
        sink.submit(Arc::new(batch(&s, T0 + h * HOUR, 50))).unwrap();
    }
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_eq!(st.files_published, 6);
    let files = published(dir.path());
    let sizes: Vec<u64> = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .collect();
    let total: u64 = sizes.iter().sum();

    // Keep room for about 3.5 files: the 3 oldest go, at start.
    let keep = sizes[3..].iter().sum::<u64>() + sizes[2] / 2;
    let cfg = ParquetSinkConfig {
        retention_max_bytes: keep,
        ..ParquetSinkConfig::for_test(dir.path())
    };
    let sink = ParquetSink::start(cfg, None).unwrap();
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_eq!(st.retention_files_deleted, 3, "{st:?}");
    assert_eq!(st.retention_bytes_deleted, sizes[..3].iter().sum::<u64>());
    assert_eq!(published(dir.path()), files[3..].to_vec());
    assert_eq!(st.history_bytes, total - st.retention_bytes_deleted);
    // Emptied hour directories are removed too.
    assert!(!files[0].parent().unwrap().exists());

    // By age: make the oldest remaining file two hours old; the limit is one hour.
    let old = std::time::SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::options()
        .write(true)
        .open(&files[3])
        .unwrap()
        .set_modified(old)
        .unwrap();
    let cfg = ParquetSinkConfig {
        retention_max_age_s: 3600,
        ..ParquetSinkConfig::for_test(dir.path())
    };
    let sink = ParquetSink::start(cfg, None).unwrap();
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_eq!(st.retention_files_deleted, 1);
    assert_eq!(published(dir.path()), files[4..].to_vec());

    // While running: each publish past the byte limit deletes the oldest.
    let cfg = ParquetSinkConfig {
        retention_max_bytes: sizes[4] + sizes[5] + sizes[0] / 2,
        ..ParquetSinkConfig::for_test(dir.path())
    };
    let sink = ParquetSink::start(cfg, None).unwrap();
    sink.submit(Arc::new(batch(&s, T0 + 6 * HOUR, 50))).unwrap();
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_eq!(st.retention_files_deleted, 1);
    let left = published(dir.path());
    assert_eq!(left.len(), 2);
    assert_eq!(left[0], files[5]);
}

#[test]
fn memory_budget_sheds_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema("p", 4, &[0, 1, 2], 1);
    let cfg = ParquetSinkConfig {
        memory_budget_bytes: 1000,
        ..ParquetSinkConfig::for_test(dir.path())
    };
    let sink = ParquetSink::start(cfg, None).unwrap();
    // 10 rows × 12 counters × 8 B + 10 timestamps × 8 B = 1040 B > 1000 B.
    let e = sink.submit(Arc::new(batch(&s, T0, 10))).unwrap_err();
    assert_eq!(e.reason, ShedReason::MemoryBudget);
    assert_eq!(e.samples, 120);
    // 9 rows fit.
    sink.submit(Arc::new(batch(&s, T0, 9))).unwrap();
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_accounted(&st);
    assert_eq!(st.shed_memory_budget_batches, 1);
    assert_eq!(st.shed_memory_budget_samples, 120);
    assert_eq!(st.samples_written, 108);
    assert_eq!(st.memory_budget_bytes, 1000);
}

/// Issue 13: with the production policy (`drop_newest` + memory budget) a writer slower than the
/// feed (the test knob delays every batch) never makes `submit` wait: the queue and the budget
/// absorb what they can, the rest is shed as whole batches, and every sample is written or
/// counted as shed. (Decoder freshness under that load is measured by
/// `STEL_BENCH_PARQUET_DELAY_US=… stel-bench e2e`, no timing here.)
#[test]
fn slow_writer_sheds_whole_batches_counted_and_never_blocks_submit() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema("slow", 8, &[0, 1, 2, 3], 1);
    let cfg = ParquetSinkConfig {
        dir: dir.path().to_path_buf(),
        queue_batches: 4,
        test_write_delay_us: 50_000,
        ..ParquetSinkConfig::default()
    };
    assert_eq!(cfg.when_full, stel_store::parquet::WhenFull::DropNewest);
    let sink = ParquetSink::start(cfg, None).unwrap();
    let (mut taken, mut shed) = (0u64, 0u64);
    for i in 0..40 {
        match sink.submit(Arc::new(batch(&s, T0 + i * 100 * INTERVAL, 100))) {
            Ok(()) => taken += 1,
            Err(e) => {
                assert_eq!(e.reason, ShedReason::QueueFull);
                assert_eq!(e.samples, 100 * 32);
                shed += 1;
            }
        }
    }
    // 40 submits against a writer that takes 50 ms per batch: most must have been shed at once.
    assert!(shed > 0 && taken > 0, "taken {taken}, shed {shed}");
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_accounted(&st);
    assert_eq!(st.shed_queue_full_batches, shed);
    assert_eq!(st.shed_queue_full_samples, shed * 3200);
    assert_eq!(st.samples_written, taken * 3200);
}

// ---- kill -9 ----

const CHILD_ENV: &str = "STEL_PARQUET_KILL_CHILD_DIR";
const KILL_ROWS: usize = 50;

/// Not a test on its own: the writer process of `sigkill_leaves_only_complete_files`, which
/// re-runs this test binary with `--ignored --exact` and the directory in the environment.
#[test]
#[ignore = "child process of sigkill_leaves_only_complete_files"]
fn sigkill_child_writer() {
    let dir = std::env::var(CHILD_ENV).expect("run by sigkill_leaves_only_complete_files");
    let cfg = ParquetSinkConfig {
        flush_interval_ms: 30,
        row_group_rows: 64,
        ..ParquetSinkConfig::for_test(dir)
    };
    let sink = ParquetSink::start(cfg, None).unwrap();
    let s = schema("killme", 4, &[0, 1, 9], 1);
    for i in 0.. {
        let ts0 = T0 + i * KILL_ROWS as i64 * INTERVAL;
        sink.submit(Arc::new(batch(&s, ts0, KILL_ROWS))).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn sigkill_leaves_only_complete_files_and_a_correct_loss_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "sigkill_child_writer",
            "--nocapture",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the child has published a few parts and has one open, then SIGKILL it.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < deadline,
            "the child never published 3 parts with one open"
        );
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the writer child exited on its own: {st}");
        }
        if published(dir.path()).len() >= 3 && !temps(dir.path()).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let files = published(dir.path());
    let stale = temps(dir.path());
    // Every published file is complete: pyarrow reads it, values exact, time contiguous.
    let got = python(
        r#"
import json, sys
import pyarrow.parquet as pq
out = []
for f in sys.argv[1:]:
    t = pq.read_table(f)
    out.append({"ts": t.column(0).cast("int64").to_pylist(),
                "last": t.column(t.num_columns - 1).to_pylist()})
print(json.dumps(out))
"#,
        &files
            .iter()
            .map(|f| f.to_str().unwrap())
            .collect::<Vec<_>>(),
    );
    let mut expect_ts = T0;
    let width = 12;
    for f in got.as_array().unwrap() {
        let ts = f["ts"].as_array().unwrap();
        let last = f["last"].as_array().unwrap();
        assert!(!ts.is_empty());
        for (t, v) in ts.iter().zip(last) {
            let t = t.as_i64().unwrap();
            assert_eq!(t, expect_ts, "published history is contiguous");
            assert_eq!(v.as_u64().unwrap(), value(t, width - 1));
            expect_ts += INTERVAL;
        }
    }
    let last_durable = expect_ts - INTERVAL;

    // The next start cleans the temp files and reports where the loss starts.
    let sink = ParquetSink::start(ParquetSinkConfig::for_test(dir.path()), None).unwrap();
    let rep = sink.recovery().clone();
    assert!(temps(dir.path()).is_empty());
    assert_eq!(rep.published_files as usize, files.len());
    assert_eq!(rep.stale_temp_files as usize, stale.len());
    assert_eq!(rep.sessions.len(), 1);
    let s = &rep.sessions[0];
    assert_eq!(s.profile, "killme");
    assert_eq!(s.last_durable_ns, Some(last_durable));
    if stale.is_empty() {
        // Killed between a publish and the next part (the open part was published in between).
        assert_eq!(s.lost_from_ns, None);
    } else {
        // The unpublished part starts right where the durable history ends.
        assert_eq!(s.lost_from_ns, Some(last_durable + INTERVAL));
        assert!(s.stale_temp_bytes > 0 || s.stale_temp_files > 0);
    }
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_eq!(st.stale_temp_files_removed as usize, stale.len());
}

// ---- disk full ----

/// A 2 MiB tmpfs mounted for one test, unmounted on drop (also when the test panics).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount(8) is required for the disk-full test");
        assert!(
            st.success(),
            "mounting a tmpfs failed ({st}): the disk-full test needs root, as the README's test command runs"
        );
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn disk_full_is_survived_counted_and_recovered_from() {
    let fs = Tmpfs::mount("2m");
    let root = fs.path().join("history");
    let s = schema("full", 16, &[0, 1, 2, 3], 1);
    let cfg = ParquetSinkConfig {
        dir: root.clone(),
        max_file_bytes: 256 << 10,
        row_group_rows: 128,
        page_rows: 128,
        compression: Codec::None,
        retry_interval_ms: 20,
        ..ParquetSinkConfig::for_test(&root)
    };
    let sink = ParquetSink::start(cfg, None).unwrap();
    // Incompressible counters: 64 rows × 64 columns × 8 B = 32 KiB per batch; 2 MiB fills fast.
    let noisy = |ts: i64, c: usize| {
        let mut x = (ts as u64) ^ ((c as u64) << 40);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^ (x >> 29)
    };
    let mut i = 0i64;
    let mut submit = |sink: &ParquetSink| {
        sink.submit(Arc::new(batch_with(&s, T0 + i * 64 * INTERVAL, 64, &noisy)))
            .unwrap();
        i += 1;
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while parquet_stats(sink.stats()).disk_full_episodes == 0 {
        assert!(
            Instant::now() < deadline,
            "never hit ENOSPC: {:?}",
            parquet_stats(sink.stats())
        );
        submit(&sink);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Still running and still taking batches while the disk is full.
    for _ in 0..20 {
        submit(&sink);
    }
    let st = parquet_stats(sink.stats());
    assert!(st.disk_full_errors >= 1, "{st:?}");
    assert!(st.write_errors >= 1, "{st:?}");
    // No half-written temp files are left behind by the failure.
    let deadline2 = Instant::now() + Duration::from_secs(60);
    while parquet_stats(sink.stats()).batches_dequeued < parquet_stats(sink.stats()).batches_queued
    {
        assert!(Instant::now() < deadline2);
        std::thread::sleep(Duration::from_millis(5));
    }

    // Free the space (an operator, or retention): the sink recovers by itself.
    for f in published(&root) {
        std::fs::remove_file(f).unwrap();
    }
    let before = parquet_stats(sink.stats()).files_published;
    let deadline = Instant::now() + Duration::from_secs(120);
    while parquet_stats(sink.stats()).recoveries == 0
        || parquet_stats(sink.stats()).files_published == before
    {
        assert!(
            Instant::now() < deadline,
            "never recovered: {:?}",
            parquet_stats(sink.stats())
        );
        submit(&sink);
        std::thread::sleep(Duration::from_millis(2));
    }
    let st = parquet_stats(sink.shutdown().unwrap());
    assert_accounted(&st);
    assert!(st.lost_disk_full_samples > 0, "{st:?}");
    assert_eq!(st.lost_write_error_samples, 0, "{st:?}");
    assert!(st.recoveries >= 1);
    assert!(temps(&root).is_empty(), "{:?}", temps(&root));
    // What is on disk after recovery is complete and readable.
    let files = published(&root);
    assert!(!files.is_empty());
    let got = python(
        r#"
import json, sys
import pyarrow.parquet as pq
print(json.dumps(sum(pq.read_table(f).num_rows for f in sys.argv[1:])))
"#,
        &files
            .iter()
            .map(|f| f.to_str().unwrap())
            .collect::<Vec<_>>(),
    );
    assert!(got.as_u64().unwrap() > 0);
}

/// The column-chunk encoder on what makes encoders wrong: values that wrap (u64::MAX next to
/// 0), counter resets, huge and zero deltas, a part missing in some rows (nulls, also at page
/// and row-group edges), page and row-group sizes that are not multiples of the 128-value
/// DELTA block — for every encoding and codec. pyarrow and DuckDB must read back exactly.
#[test]
fn encoder_edge_cases_read_back_exactly_by_pyarrow_and_duckdb() {
    use stel_store::parquet::CounterEncoding;
    let mut s = (*schema("edge", 2, &[0, 1, 9], 1)).clone();
    s.part_offsets = vec![0, 3]; // two parts: Ethernet0's 3 stats, Ethernet4's 3 stats
    s.template_ids = vec![301, 302];
    let s = Arc::new(s);
    let rows = 1_000usize;
    let width = s.width();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut values = Vec::with_capacity(rows * width);
    let mut masks = Vec::with_capacity(rows);
    for r in 0..rows {
        let i = r as u64;
        values.extend_from_slice(&[
            i * 1_000,                                         // steady
            if r % 2 == 0 { u64::MAX } else { 0 },             // wraps every row
            if r < 600 { i * i * 1_000_003 } else { i - 600 }, // reset at row 600
            rnd(),                                             // noise, full width
            7,                                                 // constant
            if r % 129 == 0 { rnd() } else { i },              // rare huge jump
        ]);
        // Part 1 missing in a run across the 300-row page edge and at the last rows;
        // part 0 missing once at the 700-row row-group edge.
        masks.push(if (290..310).contains(&r) || r >= 995 || r % 97 == 5 {
            0b01
        } else if r == 700 {
            0b10
        } else {
            0b11
        });
    }
    let ts: Vec<i64> = (0..rows as i64).map(|r| T0 + r * INTERVAL).collect();
    let b = CounterBatch {
        schema: Arc::clone(&s),
        ts: ts.clone(),
        values: values.clone(),
        part_masks: masks.clone(),
    };
    let expect_missing = b.missing_samples() as u64;
    let expected: Vec<Vec<Option<u64>>> = (0..width)
        .map(|c| {
            (0..rows)
                .map(|r| b.is_valid(r, c).then(|| values[r * width + c]))
                .collect()
        })
        .collect();
    let b = Arc::new(b);
    for encoding in [
        CounterEncoding::DeltaBinaryPacked,
        CounterEncoding::ByteStreamSplit,
        CounterEncoding::Plain,
    ] {
        for codec in [Codec::Lz4, Codec::Zstd, Codec::None] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = ParquetSinkConfig {
                page_rows: 300,
                row_group_rows: 700,
                write_batch_rows: 1,
                encoding,
                compression: codec,
                compression_level: 3,
                ..ParquetSinkConfig::for_test(dir.path())
            };
            let sink = ParquetSink::start(cfg, None).unwrap();
            sink.submit(Arc::clone(&b)).unwrap();
            let st = parquet_stats(sink.shutdown().unwrap());
            assert_accounted(&st);
            assert_eq!(st.missing_samples_written, expect_missing);
            let files = published(dir.path());
            assert_eq!(files.len(), 1);
            let got = python(READ_FILE, &[files[0].to_str().unwrap()]);
            let what = format!("{encoding:?}/{codec:?}");
            assert_eq!(got["rows"], rows, "{what}");
            let got_ts: Vec<i64> = serde_json::from_value(got["ts"].clone()).unwrap();
            assert_eq!(got_ts, ts, "{what}");
            for (c, col) in s.columns.iter().enumerate() {
                let got_c: Vec<Option<u64>> =
                    serde_json::from_value(got["cols"][col.wide_name()].clone()).unwrap();
                assert_eq!(got_c, expected[c], "{what} column {}", col.wide_name());
            }
            // DuckDB: its own Parquet reader, same answers (non-null counts, max of the
            // wrapping column, sum of the steady one).
            let d = python(
                r#"
import duckdb, json, sys
r = duckdb.sql(f"select count(\"Ethernet4.IF_IN_OCTETS\"), max(\"Ethernet0.IF_IN_UCAST_PKTS\")::varchar, sum(\"Ethernet0.IF_IN_OCTETS\")::varchar from read_parquet('{sys.argv[1]}')").fetchall()[0]
print(json.dumps(list(r)))
"#,
                &[files[0].to_str().unwrap()],
            );
            let nonnull = expected[3].iter().filter(|v| v.is_some()).count();
            assert_eq!(d[0], nonnull, "{what}");
            assert_eq!(d[1], u64::MAX.to_string(), "{what}");
            let sum: u128 = expected[0].iter().flatten().map(|&v| u128::from(v)).sum();
            assert_eq!(d[2], sum.to_string(), "{what}");
        }
    }
}
