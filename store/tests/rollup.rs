//! Rollup tiers written by the real writer, read back without stel: pyarrow and DuckDB see the
//! layout, the schema and values equal to what the samples give (computed here independently).

use std::{path::Path, sync::Arc};

use stel_store::{
    rollup::{RollupConfig, RollupWriter},
    sai::{ObjectType, StatKey},
    schema::{CounterColumn, SessionSchema},
    BudgetHandle, CounterBatch,
};

const STATS: [&str; 5] = [
    "IF_IN_OCTETS",
    "IF_IN_UCAST_PKTS",
    "IN_CURR_OCCUPANCY_BYTES",
    "IF_OUT_OCTETS",
    "IF_IN_DISCARDS",
];
const PORTS: usize = 4;
/// 2023-11-14T22:12:58Z: two seconds before a minute boundary.
const T0: i64 = 1_699_999_978_000_000_000;
const STEP: i64 = 1_000_000;

fn schema() -> Arc<SessionSchema> {
    schema_in("PORT")
}

fn schema_in(group: &str) -> Arc<SessionSchema> {
    let mut columns = Vec::new();
    for p in 0..PORTS {
        for s in STATS {
            columns.push(CounterColumn {
                label: p as u16 + 1,
                object: format!("Ethernet{}", 4 * p),
                key: StatKey {
                    object_type: 1,
                    stat_id: ObjectType::Port.stat_by_name(s).unwrap().id,
                },
            });
        }
    }
    Arc::new(SessionSchema::one_template(
        "lab 1".into(),
        group.into(),
        columns,
    ))
}

/// Snapshot `i`'s values: octets rise by a per-port pattern with a burst every 100 ms.
fn values(i: i64) -> Vec<u64> {
    let mut v = Vec::new();
    for p in 0..PORTS as i64 {
        let octets = (i * (1000 + 100 * p) + (i / 100) * 7_000 * (p + 1)) as u64;
        v.extend([
            octets,
            octets / 800,
            ((i * 37 + p * 11) % 5000) as u64,
            octets / 2,
            (i / 1000) as u64,
        ]);
    }
    v
}

fn write(dir: &Path, n: i64) {
    let s = schema();
    let mut w = RollupWriter::new(
        &RollupConfig::for_test(),
        dir.to_path_buf(),
        "sw1".into(),
        BudgetHandle::default(),
    )
    .unwrap();
    let per = 997;
    let mut i = 0;
    while i < n {
        let rows = per.min(n - i);
        let ts: Vec<i64> = (i..i + rows).map(|k| T0 + k * STEP).collect();
        let vals: Vec<u64> = (i..i + rows).flat_map(values).collect();
        w.push(&CounterBatch::new(Arc::clone(&s), ts, vals, Vec::new()).unwrap());
        i += rows;
    }
    w.finish();
    assert_eq!(w.totals().write_errors, 0);
}

#[test]
fn pyarrow_and_duckdb_read_the_tiers_with_the_samples_values() {
    let dir = tempfile::tempdir().unwrap();
    let n = 125_000; // 125 s at 1 ms: four minutes touched
    write(dir.path(), n);
    // What the samples say, per minute for Ethernet4 (port 1): last IF_IN_OCTETS, peak delta and
    // its time, the occupancy's max and sum, and the 1 s rows' count.
    let minute = 60_000_000_000i64;
    let mut want = Vec::new();
    let mut k = T0.div_euclid(minute);
    while k * minute < T0 + n * STEP {
        let (lo, hi) = (k * minute, (k + 1) * minute);
        let idx: Vec<i64> = (0..n)
            .filter(|i| (lo..hi).contains(&(T0 + i * STEP)))
            .collect();
        let last = values(*idx.last().unwrap())[STATS.len()];
        let (mut peak, mut peak_t) = (0u64, 0i64);
        for &i in &idx {
            if i == 0 {
                continue;
            }
            let d = values(i)[STATS.len()] - values(i - 1)[STATS.len()];
            if d > peak {
                (peak, peak_t) = (d, T0 + i * STEP);
            }
        }
        let occ: Vec<u64> = idx.iter().map(|&i| values(i)[STATS.len() + 2]).collect();
        want.push(serde_json::json!({
            "ts": k * minute, "last": last, "peak": peak, "peak_ts": peak_t,
            "occ_max": occ.iter().max(), "occ_sum": occ.iter().sum::<u64>(), "samples": idx.len(),
        }));
        k += 1;
    }
    let got = stel_testkit::python3_json(&format!(
        r#"
import json, pyarrow.parquet as pq, pyarrow.dataset as ds, duckdb
root = {root:?}
one_m = ds.dataset(root + "/tier=1m", format="parquet", partitioning="hive").to_table()
one_s = ds.dataset(root + "/tier=1s", format="parquet", partitioning="hive").to_table()
import pyarrow as pa
rows = []
for r in one_m.to_pylist():
    if r["object"] != "Ethernet4":
        continue
    ns = lambda t: int(pa.scalar(t, pa.timestamp("ns", "UTC")).cast(pa.int64()).as_py())
    rows.append({{"ts": ns(r["ts"]), "last": r["IF_IN_OCTETS.last"], "peak": r["IF_IN_OCTETS.peak"],
                 "occ_max": r["IN_CURR_OCCUPANCY_BYTES.max"],
                 "occ_sum": r["IN_CURR_OCCUPANCY_BYTES.sum"], "samples": r["samples"]}})
pt = one_m.filter(pa.compute.equal(one_m["object"], "Ethernet4"))["IF_IN_OCTETS.peak_ts"].cast(pa.int64()).to_pylist()
for r, t in zip(rows, pt):
    r["peak_ts"] = t
f = sorted(__import__("glob").glob(root + "/tier=1m/*/*/*/*.parquet"))[0]
md = pq.read_metadata(f).metadata
con = duckdb.connect()
d = con.execute(f"select tier, count(*), sum(samples), count(distinct object), min(profile) from read_parquet('{{root}}/tier=*/*/*/*/*.parquet', hive_partitioning=1) group by tier order by tier").fetchall()
print(json.dumps({{"rows": rows, "types": {{c.name: str(c.type) for c in one_m.schema}},
  "s_rows": one_s.num_rows, "version": md[b"stel.rollup.version"].decode(),
  "tier": md[b"stel.rollup.tier"].decode(), "switch": md[b"stel.switch"].decode(),
  "duckdb": [list(x) for x in d]}}))
"#,
        root = dir.path().display().to_string()
    ));
    let rows = got["rows"].as_array().unwrap();
    assert_eq!(want.len(), 4);
    assert_eq!(rows.len(), want.len(), "{got}");
    for (g, w) in rows.iter().zip(&want) {
        for k in ["last", "peak", "peak_ts", "occ_max", "occ_sum", "samples"] {
            assert_eq!(g[k], w[k], "{k}: {g} vs {w}");
        }
    }
    let types = &got["types"];
    assert_eq!(types["ts"], "timestamp[ns, tz=UTC]");
    assert_eq!(types["object"], "string");
    assert_eq!(types["IF_IN_OCTETS.peak"], "uint64");
    assert_eq!(types["IF_IN_OCTETS.peak_ts"], "timestamp[ns, tz=UTC]");
    assert_eq!(types["rx_above90_ns"], "uint64");
    assert_eq!(got["s_rows"], 125 * PORTS as u64);
    assert_eq!(got["version"], "1");
    assert_eq!(got["tier"], "1m");
    assert_eq!(got["switch"], "sw1");
    assert_eq!(
        got["duckdb"],
        serde_json::json!([
            ["1m", want.len() * PORTS, n * PORTS as i64, PORTS, "lab 1"],
            ["1s", 125 * PORTS, n * PORTS as i64, PORTS, "lab 1"]
        ])
    );
}

/// Pushes snapshots `from..to` of every schema in turn, `per` snapshots a batch.
fn push_in_turn(w: &mut RollupWriter, schemas: &[Arc<SessionSchema>], to: i64, per: i64) {
    let mut i = 0;
    while i < to {
        for s in schemas {
            let ts: Vec<i64> = (i..i + per).map(|k| T0 + k * STEP).collect();
            let vals: Vec<u64> = (i..i + per).flat_map(values).collect();
            w.push(&CounterBatch::new(Arc::clone(s), ts, vals, Vec::new()).unwrap());
        }
        i += per;
    }
    w.finish();
}

/// More sessions than `max_sessions` and open files over `memory_budget_bytes`: files are
/// closed early (counted) and every sample is still in the tiers.
#[test]
fn memory_bounds_publish_early_and_lose_no_samples() {
    let dir = tempfile::tempdir().unwrap();
    let (n, per) = (3_000i64, 100i64);
    // Three sessions in turn, room for two: every batch's session evicts the least recent.
    let sessions = dir.path().join("sessions");
    let mut w = RollupWriter::new(
        &RollupConfig {
            max_sessions: 2,
            ..RollupConfig::for_test()
        },
        sessions.clone(),
        "sw1".into(),
        BudgetHandle::default(),
    )
    .unwrap();
    let schemas: Vec<_> = ["PORT", "PORT_B", "PORT_C"]
        .iter()
        .map(|g| schema_in(g))
        .collect();
    push_in_turn(&mut w, &schemas, n, per);
    let t = w.totals();
    assert_eq!(t.write_errors, 0);
    assert_eq!(t.evicted_sessions, 3 * (n / per) as u64 - 2);
    assert_eq!(t.memory_flushes, 0);
    // One session, a budget smaller than any open file: published as soon as a row is in.
    let budget = dir.path().join("budget");
    let mut w = RollupWriter::new(
        &RollupConfig {
            memory_budget_bytes: 1,
            ..RollupConfig::for_test()
        },
        budget.clone(),
        "sw1".into(),
        BudgetHandle::default(),
    )
    .unwrap();
    push_in_turn(&mut w, &[schema()], n, per);
    let t = w.totals();
    assert_eq!(t.write_errors, 0);
    assert_eq!(t.evicted_sessions, 0);
    assert!(t.memory_flushes >= 2, "{t:?}");
    let got = stel_testkit::python3_json(&format!(
        r#"
import json, duckdb
con = duckdb.connect()
out = {{}}
for name, root in [("sessions", {sessions:?}), ("budget", {budget:?})]:
    out[name] = [list(x) for x in con.execute(f"select tier, \"group\", sum(samples)::BIGINT, count(distinct filename) from read_parquet('{{root}}/tier=*/*/*/*/*.parquet', hive_partitioning=1, filename=1) group by all order by all").fetchall()]
print(json.dumps(out))
"#,
        sessions = sessions.display().to_string(),
        budget = budget.display().to_string()
    ));
    let all = n * PORTS as i64;
    let rows = |k: &str| got[k].as_array().unwrap().clone();
    let sessions = rows("sessions");
    assert_eq!(sessions.len(), 6, "{got}");
    for r in &sessions {
        assert_eq!(r[2], all, "every sample of every session: {r}");
    }
    let budget = rows("budget");
    assert_eq!(budget.len(), 2, "{got}");
    for r in &budget {
        assert_eq!(r[2], all, "every sample: {r}");
    }
    // The 1 s tier published per closed second rather than per hour.
    assert!(budget[1][3].as_i64().unwrap() >= 3, "{got}");
}
