//! The fleet lake end to end, reduced to six switches (the hundred-switch run is
//! `stel-bench fleet`): real `stel-ingestd` daemons (one per switch and template, through
//! NETLINK_USERSOCK, so root) upload to a real S3 server (moto) under `switch=<name>/`; Sail
//! (`pysail`, local-cluster mode: a driver and two workers) answers `stel-query --engine spark`;
//! stel-query's local engine answers the same questions on the same lake; both must print the
//! same rows. Then the lake's schema evolution — switches with different stats, a switch whose
//! template changed — read with union-by-name by DataFusion, Sail and DuckDB, each checked
//! against what the emulators sent. Missing moto, Sail or root fail the test, never skip it.

use std::path::PathBuf;

use serde_json::Value;
use stel_benches::fleet::{self, FleetConfig, LAKE};
use stel_store::sai::ObjectType;
use stel_testkit::{python3, s3_client_env, MotoS3, SailServer};

fn stel_query() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_stel-query"))
}

/// The per-switch (rows, rows that have `Ethernet0.IF_OUT_DISCARDS`) of the PORT sessions,
/// from a `sql` answer with columns switch, n, with_col.
fn counts(rows: &[Value]) -> Vec<(String, u64, u64)> {
    rows.iter()
        .map(|r| {
            (
                r["switch"].as_str().unwrap_or_default().to_string(),
                r["n"].as_u64().unwrap(),
                r["with_col"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_fleet_lake_answers_the_same_on_sail_and_locally_and_reads_by_name_everywhere() {
    let moto = MotoS3::start("lake");
    let env: Vec<(String, String)> = s3_client_env(&moto.url())
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let sail = SailServer::start(2, &env_ref);
    let cfg = FleetConfig::for_test(6);
    let daemon = fleet::workspace_binary("stel-ingest", "stel-ingestd", false, false)
        .expect("stel-ingestd builds");
    let work = tempfile::tempdir().unwrap();
    let g =
        fleet::generate(&cfg, &daemon, work.path(), &env).expect("the fleet streams and uploads");
    assert_eq!(g.switches, 6);
    assert_eq!(g.lost, 0, "{g:?}");
    let spark = |q: &[String]| {
        let mut a = q.to_vec();
        a.extend(["--engine", "spark", "--remote", &sail.remote(), "-d", LAKE].map(String::from));
        a
    };
    let local = |q: &[String]| {
        let mut a = q.to_vec();
        a.extend(["-d", LAKE].map(String::from));
        a
    };

    // The fleet questions: same rows on both engines; the engine read fewer files than the
    // lake has (the old hour and the QUEUE/PG sessions are pruned), by its own plan.
    for (what, q, keys) in fleet::questions() {
        let r = fleet::ask(&stel_query(), &spark(&q), &env).unwrap();
        let l = fleet::ask(&stel_query(), &local(&q), &env).unwrap();
        let (ra, la) = (fleet::answer(&r.rows, keys), fleet::answer(&l.rows, keys));
        assert!(!ra.is_empty(), "{what}: no rows");
        assert_eq!(ra, la, "{what}: spark and local differ");
        let s = &r.summary;
        assert_eq!(s["engine"], "spark", "{s}");
        // The raw view reads raw files only (rollup tiers are under `_tiers/`).
        assert_eq!(
            s["files_in_lake"].as_u64(),
            Some(g.raw_files_uploaded),
            "{what}: {s}"
        );
        let read = s["files_read"].as_u64().unwrap_or(0);
        assert!(
            read > 0 && read < g.files_uploaded,
            "{what}: no pruning: {s}"
        );
        eprintln!(
            "{what}: {} rows, {read} of {} files read",
            ra.len(),
            g.files_uploaded
        );
    }

    // A --switch name the lake has no switch=<name>/ directory for is an error naming the
    // lake's switches, on both engines, alone or beside a real one (not "no bursts in …", not
    // silently dropped).
    let names: Vec<String> = fleet::plan(&cfg).iter().map(|s| s.name.clone()).collect();
    let mut have = names.clone();
    have.sort();
    let want = format!("no switch leaf-99 in {LAKE}/ (it has {})", have.join(", "));
    for list in ["leaf-99".to_string(), format!("{},leaf-99", names[1])] {
        let q: Vec<String> = ["top", "--by", "bursts", "--last", "1h", "--switch", &list]
            .map(String::from)
            .to_vec();
        for (engine, args) in [("spark", spark(&q)), ("local", local(&q))] {
            let o = std::process::Command::new(stel_query())
                .args(&args)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{engine} --switch {list}: {err}");
            assert!(err.contains(&want), "{engine} --switch {list}: {err}");
        }
    }

    // A wrong bucket or prefix on Spark is an error (exit 2), not an empty window (exit 1).
    let q = [
        "top", "--by", "drops", "--last", "1h", "--engine", "spark", "--remote",
    ]
    .map(String::from)
    .to_vec();
    for (lake, want) in [
        (
            "s3://nolake/fleet",
            "the engine cannot read the lake at s3://nolake/fleet/",
        ),
        (
            "s3://lake/flet",
            "s3://lake/flet/ is not a stel lake as the engine sees it",
        ),
    ] {
        let o = std::process::Command::new(stel_query())
            .args(&q)
            .args([sail.remote().as_str(), "-d", lake])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{lake}: {err}");
        assert!(err.contains(want), "{lake}: {err}");
    }

    // Schema evolution: union by name. Expected per switch from what the emulators sent.
    let plan = fleet::plan(&cfg);
    let mut expected: Vec<(String, u64, u64)> = plan
        .iter()
        .map(|sw| {
            let runs = sw.rows(ObjectType::Port);
            let n = runs.iter().map(|(_, n)| n).sum();
            // IF_OUT_DISCARDS is the 7th PORT stat of the emulator's list.
            let with = runs.iter().filter(|(k, _)| *k >= 7).map(|(_, n)| n).sum();
            (sw.name.clone(), n, with)
        })
        .collect();
    expected.sort();
    assert!(expected.iter().any(|e| e.2 == 0) && expected.iter().any(|e| e.2 > 0 && e.2 < e.1));
    let sql = "SELECT switch, COUNT(*) AS n, COUNT(`Ethernet0.IF_OUT_DISCARDS`) AS with_col \
               FROM lake WHERE `group` = 'PORT' GROUP BY switch ORDER BY switch";
    let q = vec!["sql".to_string(), sql.to_string()];
    let on_sail = counts(&fleet::ask(&stel_query(), &spark(&q), &env).unwrap().rows);
    assert_eq!(on_sail, expected, "Sail");
    let on_datafusion = counts(&fleet::ask(&stel_query(), &local(&q), &env).unwrap().rows);
    assert_eq!(on_datafusion, expected, "DataFusion");
    // DuckDB (no S3 extension offline): the lake's raw objects fetched with boto3 (hidden
    // names — the rollup tiers' `_tiers/` — left out, as store/LAKE.md says), then read_parquet
    // with Hive partitions and union_by_name.
    const DUCK: &str = r#"
import os, sys, tempfile, boto3, duckdb
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
d = tempfile.mkdtemp()
for page in s3.get_paginator("list_objects_v2").paginate(Bucket="lake", Prefix="fleet/"):
    for o in page.get("Contents", []):
        if any(x.startswith(("_", ".")) for x in o["Key"].split("/")):
            continue
        p = os.path.join(d, o["Key"])
        os.makedirs(os.path.dirname(p), exist_ok=True)
        s3.download_file("lake", o["Key"], p)
rows = duckdb.sql(f"""SELECT switch, COUNT(*), COUNT("Ethernet0.IF_OUT_DISCARDS") FROM
    read_parquet('{d}/fleet/**/*.parquet', hive_partitioning = true, union_by_name = true)
    WHERE "group" = 'PORT' GROUP BY switch ORDER BY switch""").fetchall()
for r in rows:
    print(*r, sep="\t")
"#;
    let mut c = python3(DUCK);
    for (k, v) in &env {
        c.env(k, v);
    }
    let o = c
        .output()
        .expect("python3 (duckdb, boto3: deploy/setup.sh --test)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let on_duckdb: Vec<(String, u64, u64)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(on_duckdb, expected, "DuckDB");
}
