//! INT reports end to end (phase 1, before the daemon's UDP source exists): the real `stel-emu
//! int` binary sends reports to a UDP socket on loopback; the test receives them with plain
//! recv, decodes them with `IntDecoder`, writes them with the real `IntSink`, and reads the
//! Parquet tables back with pyarrow. Everything is compared with the emulator's ground truth;
//! the pcap the emulator wrote in the same run decodes to the same counts.

use std::{
    net::{IpAddr, UdpSocket},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, SystemTime},
};

use serde_json::Value;
use stel_ingest::int::{evc::EvcSources, IntBatch, IntDecodeConfig, IntDecoder, IntSink};
use stel_store::int::{IntSink as ParquetIntSink, IntSinkConfig};
use stel_testkit::python3_json;

struct ToSink<'a>(&'a ParquetIntSink, u64);
impl IntSink for ToSink<'_> {
    fn on_batch(&mut self, b: IntBatch) {
        self.1 += b.reports.rows() as u64;
        self.0.submit(b).expect("sink took the batch");
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Runs `stel-emu int` against a loopback socket; returns what was received (payloads), the
/// truth JSON and the files' directory.
fn emulate(dir: &std::path::Path, args: &[&str]) -> (Vec<Vec<u8>>, Value) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    // Room for the whole run: the emulator may outpace this thread on a busy 2-core box, and a
    // kernel drop would be loss the truth does not know about (checked below).
    use std::os::fd::AsFd;
    stel_ingest::sys::set_rcvbuf(sock.as_fd(), 64 << 20).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let truth = dir.join("truth.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stel-emu"))
        .arg("int")
        .args(["--to", &addr.to_string()])
        .args(["--truth", truth.to_str().unwrap()])
        .args(["--pcap", dir.join("int.pcap").to_str().unwrap()])
        .args(["--kytos-evcs", dir.join("evcs.json").to_str().unwrap()])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("stel-emu");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    let mut exited = false;
    loop {
        match sock.recv(&mut buf) {
            Ok(n) => got.push(buf[..n].to_vec()),
            // Loopback delivery is done when send returns: once the emulator has exited and
            // the socket is empty, everything it sent has been read.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if exited {
                    break;
                }
                if child.try_wait().unwrap().is_some() {
                    exited = true;
                }
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    assert_eq!(stel_ingest::sys::meminfo_drops(sock.as_fd()).unwrap(), 0);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "stel-emu int failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let truth: Value = serde_json::from_str(&std::fs::read_to_string(truth).unwrap()).unwrap();
    (got, truth)
}

#[test]
fn emulator_udp_decoder_parquet_pyarrow_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (payloads, truth) = emulate(
        dir.path(),
        &[
            "--format",
            "amlight",
            "--count",
            "3000",
            "--rate",
            "20000",
            "--flows",
            "8",
            "--max-hops",
            "10",
            "--loss",
            "0.02",
            "--drops",
            "0.05",
            "--congestion",
            "0.1",
            "--path-change-every",
            "50",
            "--seq-start",
            "4294967000",
        ],
    );
    let u = |k: &str| truth[k].as_u64().unwrap();
    assert_eq!(payloads.len() as u64, u("packets_sent"), "kernel dropped?");

    let evc = EvcSources {
        mapping: None,
        kytos_evcs: Some(dir.path().join("evcs.json")),
    }
    .load()
    .unwrap();
    assert_eq!(evc.len(), 8);
    let data = dir.path().join("data");
    let sink = ParquetIntSink::start(IntSinkConfig::for_test(&data)).unwrap();
    let mut d = IntDecoder::new(IntDecodeConfig::amlight());
    d.set_evc_map(Arc::clone(&evc));
    let src: IpAddr = "127.0.0.1".parse().unwrap();
    let mut to = ToSink(&sink, 0);
    for p in &payloads {
        d.decode(src, now_ns(), p, &mut to);
    }
    d.flush(now_ns(), &mut to);
    d.finish_sequences();
    let s = d.stats();
    assert_eq!(s.reports_malformed, 0, "{s:?}");
    assert_eq!(s.reports_decoded, u("reports_sent"));
    assert_eq!(s.hops, u("hops_sent"));
    assert_eq!(s.drops, u("drops_sent"));
    assert_eq!(s.seq_lost, u("packets_lost_detectable"), "{s:?}");
    assert!(s.seq_lost > 0);
    assert_eq!(s.path_changes, u("path_changes"));
    assert_eq!(s.evc_matched, u("reports_sent"));
    assert_eq!(to.1, u("reports_sent"));
    let st = sink.shutdown().unwrap();
    assert_eq!(st.rows_written, st.rows_submitted, "{st:?}");
    assert_eq!(st.shed_rows() + st.lost_rows(), 0);

    // pyarrow reads the Hive tree back.
    let script = format!(
        r#"
import json, pyarrow.dataset as ds, pyarrow.compute as pc
root = {root:?}
out = {{}}
for t in ["int_reports", "int_hops", "int_drops"]:
    tb = ds.dataset(root + "/table=" + t, format="parquet", partitioning="hive").to_table()
    out[t] = tb.num_rows
    if t == "int_reports":
        out["latency_sum"] = pc.sum(tb["latency_sum_ns"]).as_py()
        out["null_latency"] = tb["latency_sum_ns"].null_count
        out["evc_null"] = tb["evc_id"].null_count
        ok = all(e == "evc-%d" % v for e, v in zip(tb["evc_id"].to_pylist(), tb["vlan"].to_pylist()))
        out["evc_matches_vlan"] = ok
        out["switches"] = sorted(set(str(x) for x in tb["switch"].to_pylist()))
        out["switch_ids"] = sorted(set(str(x) for x in tb["switch_id"].to_pylist()))
        out["hop_counts"] = sorted(set(tb["hop_count"].to_pylist()))
        out["seq_gap_sum"] = pc.sum(tb["seq_gap"]).as_py()
        out["path_changed"] = pc.sum(pc.cast(tb["path_changed"], "int64")).as_py()
    if t == "int_hops":
        out["hop_latency_nulls"] = tb["hop_latency"].null_count
        out["hop_latency_sum"] = pc.sum(tb["latency_ns"]).as_py()
print(json.dumps(out))
"#,
        root = data.to_str().unwrap()
    );
    let got: Value = python3_json(&script);
    assert_eq!(got["int_reports"].as_u64(), Some(u("reports_sent")));
    assert_eq!(got["int_hops"].as_u64(), Some(u("hops_sent")));
    assert_eq!(got["int_drops"].as_u64(), Some(u("drops_sent")));
    let lat = truth["latency_sum_ns"].as_u64().unwrap();
    assert_eq!(got["latency_sum"].as_u64(), Some(lat));
    assert_eq!(got["hop_latency_sum"].as_u64(), Some(lat));
    assert_eq!(got["null_latency"].as_u64(), Some(0));
    // AmLight: NoviFlow leaves hop latency all-ones: every one is null, recomputed from
    // the timestamps.
    assert_eq!(got["hop_latency_nulls"].as_u64(), Some(u("hops_sent")));
    assert_eq!(got["evc_null"].as_u64(), Some(0));
    assert_eq!(got["evc_matches_vlan"], Value::Bool(true));
    assert_eq!(got["switches"], got["switch_ids"], "partition = switch_id");
    // Gaps in the rows add up to the loss the sequence numbers show (none were reordered).
    assert_eq!(
        got["seq_gap_sum"].as_u64(),
        Some(u("packets_lost_detectable"))
    );
    assert_eq!(got["path_changed"].as_u64(), Some(u("path_changes")));
    let hops: Vec<u64> = got["hop_counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(hops.iter().all(|h| (1..=10).contains(h)));

    // The pcap of the same run: outer Ethernet/IPv4/UDP around the same payloads.
    let f = std::fs::File::open(dir.path().join("int.pcap")).unwrap();
    let mut r = pcap_file::pcap::PcapReader::new(f).unwrap();
    let mut n = 0usize;
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        assert_eq!(&p.data[42..], &payloads[n][..], "pcap record {n}");
        assert_eq!(u16::from_be_bytes([p.data[36], p.data[37]]), 5900);
        n += 1;
    }
    assert_eq!(n, payloads.len());
}

/// Every version through the real binary and a real socket: counts match the truth.
#[test]
fn every_format_over_loopback_matches_truth() {
    for (fmt, extra) in [
        ("v05", &[][..]),
        ("v1", &[][..]),
        ("v2", &["--coalesce", "3"][..]),
        ("v2", &["--coalesce", "2", "--tofino"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--format",
            fmt,
            "--count",
            "1000",
            "--rate",
            "20000",
            "--loss",
            "0.03",
            "--drops",
            "0.1",
            "--max-hops",
            "10",
        ];
        args.extend_from_slice(extra);
        let (payloads, truth) = emulate(dir.path(), &args);
        let u = |k: &str| truth[k].as_u64().unwrap();
        assert_eq!(payloads.len() as u64, u("packets_sent"), "{fmt}");
        let mut d = IntDecoder::new(IntDecodeConfig {
            v2_header: if extra.contains(&"--tofino") {
                stel_ingest::int::V2Header::Tofino
            } else {
                stel_ingest::int::V2Header::Spec
            },
            ..IntDecodeConfig::default()
        });
        let mut sink = |_b: IntBatch| {};
        for p in &payloads {
            d.decode("127.0.0.1".parse().unwrap(), now_ns(), p, &mut sink);
        }
        d.finish_sequences();
        let s = d.stats();
        assert_eq!(s.reports_malformed, 0, "{fmt}: {s:?}");
        assert_eq!(s.reports_decoded, u("reports_sent"), "{fmt}");
        assert_eq!(s.hops, u("hops_sent"), "{fmt}");
        assert_eq!(s.drops, u("drops_sent"), "{fmt}");
        assert_eq!(s.seq_lost, u("packets_lost_detectable"), "{fmt}");
    }
}
