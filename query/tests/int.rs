//! `stel-query int …` and `stel-query sql` over INT tables the real INT sink wrote from the
//! generator's reports (decoded by the real decoder); answers checked against the generator's
//! truth.

use std::{process::Command, sync::Arc};

use serde_json::Value;
use stel_emu::int::{Format, GenConfig, Generator};
use stel_ingest::int::{evc::EvcMap, IntBatch, IntDecodeConfig, IntDecoder, IntSink};
use stel_store::int::{IntSink as ParquetIntSink, IntSinkConfig};

struct ToSink<'a>(&'a ParquetIntSink);
impl IntSink for ToSink<'_> {
    fn on_batch(&mut self, b: IntBatch) {
        self.0.submit(b).expect("sink took the batch");
    }
}

/// Decodes `n` of the generator's packets (those it sends) into the sink, 1 µs apart from
/// a fixed time, then flushes the decoder.
fn decode_into(g: &mut Generator, d: &mut IntDecoder, sink: &ParquetIntSink, n: i64) {
    let mut buf = Vec::new();
    let t0 = 1_700_000_000_000_000_000i64;
    for i in 0..n {
        let p = g.next_packet(&mut buf);
        if p.send {
            d.decode(
                "10.0.0.1".parse().unwrap(),
                t0 + i * 1000,
                p.payload,
                &mut ToSink(sink),
            );
        }
    }
    d.flush(t0, &mut ToSink(sink));
}

fn query(data: &std::path::Path, args: &[&str]) -> (i32, Vec<Value>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_stel-query"))
        .args(args)
        .args(["--data-dir", data.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let lines = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        o.status.code().unwrap_or(-1),
        lines,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn rows(lines: &[Value]) -> Vec<&Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "row")
        .map(|l| &l["data"])
        .collect()
}

#[test]
fn int_questions_and_sql_over_the_int_tables() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut g = Generator::new(GenConfig {
        format: Format::Amlight,
        flows: 6,
        max_hops: 6,
        drop_rate: 0.1,
        loss_rate: 0.02,
        path_change_every: 20,
        ..GenConfig::default()
    });
    let mut map = EvcMap::default();
    map.add_kytos_json(&g.kytos_evcs_json()).unwrap();
    let sink = ParquetIntSink::start(IntSinkConfig::for_test(&data)).unwrap();
    let mut d = IntDecoder::new(IntDecodeConfig::amlight());
    d.set_evc_map(Arc::new(map));
    decode_into(&mut g, &mut d, &sink, 3000);
    sink.shutdown().unwrap();
    let truth = g.truth();

    let (code, out, err) = query(&data, &["int", "evc"]);
    assert_eq!(code, 0, "{err}");
    let evcs = rows(&out);
    assert_eq!(evcs.len(), 6);
    let reports: u64 = evcs.iter().map(|r| r["reports"].as_u64().unwrap()).sum();
    assert_eq!(reports, truth.reports_sent);
    let changes: u64 = evcs
        .iter()
        .map(|r| r["path_changes"].as_u64().unwrap())
        .sum();
    assert_eq!(changes, truth.path_changes);
    for r in &evcs {
        let vlan = r["evc_id"].as_str().unwrap().strip_prefix("evc-").unwrap();
        assert_eq!(r["evc_name"].as_str().unwrap(), format!("vlan_{vlan}"));
        assert!(r["p50_ns"].as_u64().unwrap() <= r["p99_ns"].as_u64().unwrap());
        assert!(r["p99_ns"].as_u64().unwrap() <= r["max_ns"].as_u64().unwrap());
    }

    // Counter questions on INT-only data say it holds INT tables and where their questions
    // are (it said "no Parquet files under …"); exit 1 still (no counter history written).
    for args in [&["rates"][..], &["history", "-o", "Ethernet0"][..]] {
        let (code, _, err) = query(&data, args);
        assert_eq!(code, 1, "{args:?}: {err}");
        let e: Value = serde_json::from_str(err.trim()).unwrap();
        let m = e["data"]["message"].as_str().unwrap();
        assert!(
            m.contains("holds INT tables only (int_drops, int_hops, int_reports")
                && m.contains("stel-query int flows|hops|drops|evc -d "),
            "{args:?}: {m}"
        );
    }

    // The EVC columns say what they hold: flows its name (as `int evc`'s evc_name), drops its
    // id (int_drops has no name column).
    let (code, out, err) = query(&data, &["int", "flows", "-n", "3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(rows(&out).len(), 3);
    for r in rows(&out) {
        assert!(r["evc_name"].as_str().unwrap().starts_with("vlan_"), "{r}");
    }

    let (code, out, err) = query(&data, &["int", "drops"]);
    assert_eq!(code, 0, "{err}");
    let drops: u64 = rows(&out)
        .iter()
        .map(|r| r["drops"].as_u64().unwrap())
        .sum();
    assert_eq!(drops, truth.drops_sent);
    assert!(rows(&out)
        .iter()
        .any(|r| r["evc_id"].as_str().is_some_and(|e| e.starts_with("evc-"))));

    let (code, out, err) = query(&data, &["sql", "SELECT count(*) AS n FROM int_hops"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(rows(&out)[0]["n"].as_u64(), Some(truth.hops_sent));

    // A flow that does not exist: no rows, exit 1.
    let (code, _, err) = query(&data, &["int", "hops", "--flow", "1"]);
    assert_eq!(code, 1, "{err}");
}

/// While the INT sink still holds a switch's part open (nothing published yet), `stel-query int`
/// says the data is being written instead of pointing at --data-dir; once the part is published
/// the answer is there.
#[test]
fn int_says_when_only_unpublished_parts_exist() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut g = Generator::new(GenConfig {
        format: Format::Amlight,
        flows: 4,
        ..GenConfig::default()
    });
    let mut map = EvcMap::default();
    map.add_kytos_json(&g.kytos_evcs_json()).unwrap();
    let sink = ParquetIntSink::start(IntSinkConfig {
        idle_publish_ms: 3_600_000,
        flush_interval_ms: 3_600_000,
        ..IntSinkConfig::for_test(&data)
    })
    .unwrap();
    let mut d = IntDecoder::new(IntDecodeConfig::amlight());
    d.set_evc_map(Arc::new(map));
    let mut buf = Vec::new();
    let t0 = 1_700_000_000_000_000_000i64;
    for i in 0..200i64 {
        let p = g.next_packet(&mut buf);
        d.decode(
            "10.0.0.1".parse().unwrap(),
            t0 + i * 1000,
            p.payload,
            &mut ToSink(&sink),
        );
    }
    d.flush(t0, &mut ToSink(&sink));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sink.stats().open_files == 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", sink.stats());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (code, _, err) = query(&data, &["int", "evc"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("still being written"), "{err}");
    assert!(!err.contains("--data-dir wrong"), "{err}");

    sink.shutdown().unwrap();
    let (code, out, err) = query(&data, &["int", "evc"]);
    assert_eq!(code, 0, "{err}");
    let reports: u64 = rows(&out)
        .iter()
        .map(|r| r["reports"].as_u64().unwrap())
        .sum();
    assert_eq!(reports, g.truth().reports_sent);
}

/// `int_hops` rows carry the report's key, not its flow: `int hops --flow` answers through the
/// reports. v2.0 groups of 4 individual reports of different flows share one sequence number and
/// receive time, so only `report_index` tells their hops apart; every flow's hops are exactly
/// the generator's (reports sent × path length, each hop on its path's switch).
#[test]
fn hops_of_a_flow_through_the_reports_key_with_coalesced_v2_groups() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut g = Generator::new(GenConfig {
        format: Format::V2,
        coalesce: 4,
        flows: 6,
        min_hops: 4,
        max_hops: 4,
        ..GenConfig::default()
    });
    let sink = ParquetIntSink::start(IntSinkConfig::for_test(&data)).unwrap();
    let mut d = IntDecoder::new(IntDecodeConfig::default());
    decode_into(&mut g, &mut d, &sink, 500);
    sink.shutdown().unwrap();
    let truth = g.truth();

    // No report-level columns on the hop rows.
    let (code, out, err) = query(&data, &["sql", "SELECT * FROM int_hops LIMIT 1"]);
    assert_eq!(code, 0, "{err}");
    let hop = rows(&out)[0].as_object().unwrap().clone();
    for c in ["flow_key", "vlan"] {
        assert!(!hop.contains_key(c), "{hop:?}");
    }
    for c in ["ts", "switch_id", "hw_id", "seq", "report_index", "node_id"] {
        assert!(hop.contains_key(c), "{hop:?}");
    }
    // The groups mix flows under one (ts, switch_id, hw_id, seq).
    let (code, out, err) = query(
        &data,
        &[
            "sql",
            "SELECT count(*) AS n FROM (SELECT ts, switch_id, hw_id, seq FROM int_reports \
             GROUP BY 1, 2, 3, 4 HAVING count(DISTINCT flow_key) > 1)",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(rows(&out)[0]["n"].as_u64().unwrap() > 10, "{out:?}");

    let (code, out, err) = query(&data, &["int", "flows", "-n", "100"]);
    assert_eq!(code, 0, "{err}");
    let flows = rows(&out);
    assert_eq!(flows.len(), truth.flows.len());
    for f in flows {
        let t = truth
            .flows
            .iter()
            .find(|t| {
                f["vlan"].as_u64() == Some(u64::from(t.vlan))
                    && f["src_port"].as_u64() == Some(u64::from(t.src_port))
                    && f["dst_port"].as_u64() == Some(u64::from(t.dst_port))
            })
            .unwrap_or_else(|| panic!("{f} not sent"));
        assert_eq!(f["reports"].as_u64(), Some(t.reports), "{f}");
        let key = f["flow_key"].to_string();
        let (code, out, err) = query(&data, &["int", "hops", "--flow", &key]);
        assert_eq!(code, 0, "{err}");
        let hops = rows(&out);
        let path = &t.paths[0];
        assert_eq!(hops.len(), path.len(), "{key}: {hops:?}");
        for (h, node) in hops.iter().zip(path) {
            assert_eq!(h["node_id"].as_u64(), Some(u64::from(*node)), "{key}: {h}");
            assert_eq!(h["reports"].as_u64(), Some(t.reports), "{key}: {h}");
        }
    }
}
