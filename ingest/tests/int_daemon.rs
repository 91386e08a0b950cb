//! INT through the real daemon: `stel-ingestd --int-only --int-listen 127.0.0.1:0` receives what
//! the real `stel-emu int` sends over loopback UDP (io_uring reader, decoder, INT sink), and the
//! tables it writes are read back with pyarrow and compared with the emulator's ground truth;
//! malformed datagrams are counted by reason; SIGHUP re-reads the EVC names.

use std::{
    net::UdpSocket,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use stel_store::metrics::{Label, Metric, Snapshot};
use stel_testkit::python3_json;

fn status(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Waits (polling the status file the daemon rewrites every second) until `ok` holds.
fn wait_status(path: &Path, child: &mut Child, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = status(path).filter(|v| ok(v)) {
            return v;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the daemon exited while waiting for {what}"
        );
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for the daemon's INT listen address (its status file); returns the status and it.
fn wait_int_listen(status_file: &Path, child: &mut Child) -> (Value, String) {
    let st = wait_status(status_file, child, "the INT listen address", |v| {
        v["info"]["components"]["int"]["listen"][0].is_string()
    });
    let addr = st["info"]["components"]["int"]["listen"][0]
        .as_str()
        .unwrap()
        .to_string();
    (st, addr)
}

/// Starts `c` (a `stel-ingestd` command) writing its status to `status_file`, without the
/// inspect socket, its final status as JSON on stdout; stdout and stderr piped.
fn spawn_reporting(c: &mut Command, status_file: &Path) -> Child {
    c.arg("--status-file")
        .arg(status_file)
        .args(["--no-inspect", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts `stel-ingestd --int-only` on 127.0.0.1:0 (with `config` if given) writing INT tables
/// under `data`, as [`spawn_reporting`] does, and waits for its listen address: the child, its
/// status then, the address.
fn start_int_only(
    config: Option<&Path>,
    data: &Path,
    status_file: &Path,
) -> (Child, Value, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"));
    if let Some(config) = config {
        c.arg("--config").arg(config);
    }
    c.args(["--int-only", "--int-listen", "127.0.0.1:0", "--data-dir"])
        .arg(data);
    let mut child = spawn_reporting(&mut c, status_file);
    let (st, addr) = wait_int_listen(status_file, &mut child);
    (child, st, addr)
}

/// The registry series of a status file (its `metrics` section).
fn metrics(v: &Value) -> Snapshot {
    Snapshot::from_json(&v["metrics"])
}

/// The INT source's receive-loop series (`source="int"`).
fn int_reader(s: &Snapshot, m: Metric) -> u64 {
    s.sum_where(m, Label::Source, "int")
}

/// Stops the daemon with SIGTERM, as systemd does; it must exit 0. Returns its final status
/// (`--json` on stdout).
fn stop_daemon(child: Child) -> Value {
    stel_testkit::sigterm(child.id());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap()
}

#[test]
fn daemon_receives_int_over_udp_into_parquet_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let evcs = d.join("evcs.json");
    // The emulator writes the Kytos-shaped EVC listing for its topology (no packets sent; the
    // topology depends on the format, flows and hops, so they match the run below).
    let o = Command::new(env!("CARGO_BIN_EXE_stel-emu"))
        .args(["int", "--count", "0", "--format", "amlight", "--flows", "8"])
        .args(["--max-hops", "10", "--kytos-evcs"])
        .arg(&evcs)
        .args(["--pcap"])
        .arg(d.join("unused.pcap"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let status_file = d.join("status.json");
    let data = d.join("data");
    let mut child = spawn_reporting(
        Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
            .args([
                "--int-only",
                "--int-listen",
                "127.0.0.1:0",
                "--int-kytos-evcs",
            ])
            .arg(&evcs)
            .arg("--data-dir")
            .arg(&data),
        &status_file,
    );
    let (st, addr) = wait_int_listen(&status_file, &mut child);
    assert_eq!(metrics(&st).get(Metric::IntEvcs), 8, "{st}");

    let truth_path = d.join("truth.json");
    let o = Command::new(env!("CARGO_BIN_EXE_stel-emu"))
        .args([
            "int", "--to", &addr, "--format", "amlight", "--count", "20000",
        ])
        .args(["--rate", "0", "--flows", "8", "--max-hops", "10"])
        .args([
            "--loss",
            "0.01",
            "--drops",
            "0.05",
            "--path-change-every",
            "500",
        ])
        .args(["--seq-start", "4294967000", "--truth"])
        .arg(&truth_path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_path).unwrap()).unwrap();
    let u = |k: &str| truth[k].as_u64().unwrap();

    // Malformed input: an empty datagram, an unknown report version, a truncated v1.0 header.
    let bad = UdpSocket::bind("127.0.0.1:0").unwrap();
    for p in [&[][..], &[0xf0, 0, 0, 0][..], &[0x10, 0, 0][..]] {
        bad.send_to(p, &addr).unwrap();
    }
    // Everything sent is in the socket (loopback delivers before send returns); wait until the
    // daemon has decoded all of it.
    let want = u("packets_sent") + 3;
    wait_status(&status_file, &mut child, "every datagram received", |v| {
        int_reader(&metrics(v), Metric::ReaderDatagrams) == want
    });

    // SIGHUP: the EVC names are read again.
    stel_testkit::kill(child.id(), "-HUP");
    wait_status(&status_file, &mut child, "the EVC reload", |v| {
        metrics(v).reason(Metric::IntEvcReloads, "ok") == 1
    });

    stel_testkit::sigterm(child.id());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    let fin: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let s = metrics(&fin);
    assert_eq!(
        int_reader(&s, Metric::ReaderKernelDroppedDatagrams),
        0,
        "{fin}"
    );
    assert_eq!(int_reader(&s, Metric::ReaderTruncatedDatagrams), 0, "{fin}");
    assert_eq!(int_reader(&s, Metric::ReaderDatagrams), want, "{fin}");
    assert_eq!(s.get(Metric::IntDatagrams), want, "{fin}");
    assert_eq!(s.get(Metric::IntDecodedReports), u("reports_sent"), "{fin}");
    assert_eq!(s.get(Metric::IntDecodedHops), u("hops_sent"), "{fin}");
    assert_eq!(
        s.get(Metric::IntDecodedDropReports),
        u("drops_sent"),
        "{fin}"
    );
    assert_eq!(
        s.get(Metric::IntSeqLostReports),
        u("packets_lost_detectable"),
        "{fin}"
    );
    assert!(u("packets_lost_detectable") > 0);
    assert_eq!(s.get(Metric::IntSeqPendingReports), 0, "{fin}");
    assert_eq!(
        s.get(Metric::IntEvcMatchedReports),
        u("reports_sent"),
        "{fin}"
    );
    assert_eq!(s.get(Metric::IntEvcUnmatchedReports), 0, "{fin}");
    assert_eq!(s.get(Metric::IntEvcs), 8, "{fin}");
    assert_eq!(s.reason(Metric::IntEvcReloads, "ok"), 1, "{fin}");
    assert_eq!(s.reason(Metric::IntEvcReloads, "failed"), 0, "{fin}");
    // AmLight's format is Telemetry Report v1.0; the unknown version and the empty datagram
    // have none, the truncated v1.0 header counts as v1.0.
    assert_eq!(
        s.sum_where(Metric::IntVersionDatagrams, Label::Version, "1.0"),
        u("packets_sent") + 1,
        "{fin}"
    );
    assert_eq!(s.sum(Metric::IntVersionDatagrams), u("packets_sent") + 1);
    assert_eq!(s.sum(Metric::IntMalformedReports), 3, "{fin}");
    assert_eq!(s.reason(Metric::IntMalformedReports, "empty"), 1, "{fin}");
    assert_eq!(
        s.reason(Metric::IntMalformedReports, "unknown_report_version"),
        1,
        "{fin}"
    );
    let int_sink = s.with_label(Label::Sink, "int");
    assert_eq!(int_sink.sum(Metric::SinkDroppedSamples), 0, "{fin}");
    let rows = u("reports_sent") + u("hops_sent") + u("drops_sent");
    assert_eq!(int_sink.sum(Metric::SinkReceivedSamples), rows, "{fin}");
    assert_eq!(int_sink.sum(Metric::SinkDeliveredSamples), rows, "{fin}");
    assert_eq!(
        int_sink.sum(Metric::SinkReceivedBatches),
        int_sink.sum(Metric::SinkDequeuedBatches),
        "{fin}"
    );
    assert!(s.get(Metric::IntPublishedBytes) > 0, "{fin}");
    // Every INT metric of the registry is in the status file (those of [int.filter] only
    // with it), and the info section holds no counter.
    for m in Metric::ALL {
        if m.condition() == Some("[int]") {
            assert!(s.has(*m), "{m} missing from the status file: {fin}");
        }
    }
    let info = &fin["info"]["components"]["int"];
    assert_eq!(
        info.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["listen", "reader"],
        "{info}"
    );
    assert!(err.contains("int: "), "{err}");

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
        out["evc_null"] = tb["evc_id"].null_count
print(json.dumps(out))
"#,
        root = data.to_str().unwrap()
    );
    let got: Value = python3_json(&script);
    assert_eq!(got["int_reports"].as_u64(), Some(u("reports_sent")));
    assert_eq!(got["int_hops"].as_u64(), Some(u("hops_sent")));
    assert_eq!(got["int_drops"].as_u64(), Some(u("drops_sent")));
    assert_eq!(got["latency_sum"], truth["latency_sum_ns"]);
    assert_eq!(got["evc_null"], 0);
}

/// Reference §6.3, AmLight's one-hop test report (Telemetry Report v1.0), written byte by byte
/// from the spec tables (not by our generator).
fn amlight_reference_packet() -> Vec<u8> {
    let be = |ws: &[u32]| -> Vec<u8> { ws.iter().flat_map(|w| w.to_be_bytes()).collect() };
    // INT shim (Type 1, Length 9, DSCP 0x02) + INT v1.0 header (Hop ML 6, RHC 9, bitmap 0xFC00)
    // + one hop: switch id, in/out port, hop latency (all ones), queue id/occupancy, ingress
    // and egress timestamps.
    let int = [
        &[0x01, 0x00, 9, 0x02 << 2][..],
        &[0x10, 0x00, 6, 9, 0xFC, 0x00, 0x00, 0x00],
        &be(&[
            0xFB65_D675,
            (23 << 16) | 11,
            0xFFFF_FFFF,
            (2 << 24) | 111,
            980_325_604,
            980_327_060,
        ]),
    ]
    .concat();
    let udp_len = (8 + int.len()) as u16;
    [
        // Telemetry Report v1.0: Ver 1, Length 4, NProt 0, F; switch id, sequence, ingress ts.
        &[0x14, 0x00, 0x00, 0x40][..],
        &be(&[0xFB65_D675, 1_408_972_298, 980_327_565]),
        // Inner Ethernet with 802.1Q VLAN 42, IPv4 (DSCP 0x17 signals INT), UDP.
        &[
            2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x81, 0x00, 0, 42, 0x08, 0x00,
        ],
        &[0x45, 0x17 << 2],
        &(20 + udp_len).to_be_bytes(),
        &[0, 1, 0, 0, 64, 17, 0, 0, 9, 9, 9, 9, 8, 8, 8, 8],
        &50000u16.to_be_bytes(),
        &50001u16.to_be_bytes(),
        &udp_len.to_be_bytes(),
        &[0, 0],
        &int,
    ]
    .concat()
}

/// Reference §6.3, AmLight's one-hop test packet, written byte by byte from the spec tables (not
/// by our generator), through `stel-ingestd --int-only` with no config file (the defaults a new
/// user gets): every field lands in the tables as the reference gives it; all-ones hop latency
/// is a null, the latency comes from the timestamps.
#[test]
fn reference_amlight_vector_through_the_daemon_with_defaults() {
    let packet = amlight_reference_packet();

    let dir = tempfile::tempdir().unwrap();
    let status_file = dir.path().join("status.json");
    let data = dir.path().join("data");
    let (mut child, _, addr) = start_int_only(None, &data, &status_file);
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(&packet, &addr)
        .unwrap();
    wait_status(&status_file, &mut child, "the report", |v| {
        int_reader(&metrics(v), Metric::ReaderDatagrams) == 1
    });
    let fin = stop_daemon(child);
    let s = metrics(&fin);
    assert_eq!(s.get(Metric::IntDecodedReports), 1, "{fin}");
    assert_eq!(s.get(Metric::IntDecodedHops), 1, "{fin}");
    assert_eq!(s.get(Metric::IntStackReports), 1, "{fin}");
    assert_eq!(s.sum(Metric::IntMalformedReports), 0, "{fin}");

    let script = format!(
        r#"
import ipaddress, json, pyarrow.dataset as ds
root = {root:?}
keys = ["switch_id", "seq", "report_ingress_ts", "vlan", "dscp", "src_port", "dst_port", "hop_count",
        "instructions", "remaining_hop_count", "latency_sum_ns"]
hkeys = ["node_id", "ingress_port", "egress_port", "hop_latency", "queue_id", "queue_occupancy",
         "ingress_ts", "egress_ts", "latency_ns"]
r = ds.dataset(root + "/table=int_reports", format="parquet", partitioning="hive").to_table(columns=keys + ["src_addr"]).to_pylist()
h = ds.dataset(root + "/table=int_hops", format="parquet", partitioning="hive").to_table(columns=hkeys).to_pylist()
print(json.dumps({{"reports": len(r), "hops": len(h), "r": {{k: r[0][k] for k in keys}},
                  "src": str(ipaddress.IPv6Address(r[0]["src_addr"]).ipv4_mapped), "h": {{k: h[0][k] for k in hkeys}}}}))
"#,
        root = data.to_str().unwrap()
    );
    let got: Value = python3_json(&script);
    assert_eq!(got["reports"], 1);
    assert_eq!(got["hops"], 1);
    let want_r = serde_json::json!({
        "switch_id": 0xFB65_D675u32, "seq": 1_408_972_298u32, "report_ingress_ts": 980_327_565u32,
        "vlan": 42, "dscp": 0x17, "src_port": 50000, "dst_port": 50001, "hop_count": 1,
        "instructions": 0xFC00, "remaining_hop_count": 9, "latency_sum_ns": 1456
    });
    assert_eq!(got["r"], want_r, "{got}");
    assert_eq!(got["src"], "9.9.9.9");
    let want_h = serde_json::json!({
        "node_id": 0xFB65_D675u32, "ingress_port": 23, "egress_port": 11, "hop_latency": null,
        "queue_id": 2, "queue_occupancy": 111, "ingress_ts": 980_325_604u32,
        "egress_ts": 980_327_060u32, "latency_ns": 1456
    });
    assert_eq!(got["h"], want_h, "{got}");
}

/// A Telemetry Report v0.5 without a drop or switch-local header (NProto 0): its switch id is
/// the sender's address. Inner packet: Ethernet, 802.1Q VLAN 42, IPv4 9.9.9.9 → 8.8.8.8, UDP
/// 50000 → 50001, no INT.
fn v05_plain_report(seq: u32) -> Vec<u8> {
    let mut p = vec![0x00, 0x00, 0x00, 3];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&1_000u32.to_be_bytes());
    p.extend_from_slice(&[
        2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x81, 0x00, 0, 42, 0x08, 0x00,
    ]);
    p.extend_from_slice(&[
        0x45, 0, 0, 28, 0, 1, 0, 0, 64, 17, 0, 0, 9, 9, 9, 9, 8, 8, 8, 8,
    ]);
    p.extend_from_slice(&[0xc3, 0x50, 0xc3, 0x51, 0, 8, 0, 0]);
    p
}

/// The sender's address reaches the tables through both receive loops: `int_reports.
/// reporter_addr` is the address each datagram came from (127.0.0.1 and 127.0.0.2), and a v0.5
/// report without a switch header is attributed to that address (as a u32), so two switches'
/// sequence streams stay apart.
#[test]
fn reporter_address_is_the_senders_with_io_uring_and_recvmsg() {
    for reader in ["io_uring", "recvmsg"] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let cfg = d.join("stel.toml");
        std::fs::write(&cfg, format!("[int]\nreader = \"{reader}\"\n")).unwrap();
        let status_file = d.join("status.json");
        let data = d.join("data");
        let (mut child, st, addr) = start_int_only(Some(&cfg), &data, &status_file);
        assert_eq!(st["info"]["components"]["int"]["reader"], reader, "{st}");
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.2:0").unwrap();
        a.send_to(&v05_plain_report(1), &addr).unwrap();
        a.send_to(&v05_plain_report(2), &addr).unwrap();
        b.send_to(&v05_plain_report(1), &addr).unwrap();
        b.send_to(&amlight_reference_packet(), &addr).unwrap();
        wait_status(&status_file, &mut child, "the reports", |v| {
            int_reader(&metrics(v), Metric::ReaderDatagrams) == 4
        });
        let fin = stop_daemon(child);
        let s = metrics(&fin);
        assert_eq!(s.get(Metric::IntDecodedReports), 4, "{fin}");
        assert_eq!(s.sum(Metric::IntMalformedReports), 0, "{fin}");
        assert_eq!(s.get(Metric::IntSeqLostReports), 0, "{fin}");
        assert_eq!(
            s.sum_where(Metric::IntVersionDatagrams, Label::Version, "0.5"),
            3,
            "{fin}"
        );
        assert!(int_reader(&s, Metric::ReaderPolls) > 0, "{fin}");

        let script = format!(
            r#"
import ipaddress, json, pyarrow.dataset as ds
t = ds.dataset({root:?} + "/table=int_reports", format="parquet", partitioning="hive").to_table(
    columns=["report_version", "seq", "switch_id", "reporter_addr"]).to_pylist()
rows = sorted([r["report_version"], r["seq"], r["switch_id"],
               str(ipaddress.IPv6Address(r["reporter_addr"]).ipv4_mapped)] for r in t)
print(json.dumps(rows))
"#,
            root = data.to_str().unwrap()
        );
        let got: Value = python3_json(&script);
        assert_eq!(
            got,
            serde_json::json!([
                [0, 1, 0x7f00_0001u32, "127.0.0.1"],
                [0, 1, 0x7f00_0002u32, "127.0.0.2"],
                [0, 2, 0x7f00_0001u32, "127.0.0.1"],
                [1, 1_408_972_298u32, 0xFB65_D675u32, "127.0.0.2"],
            ]),
            "{reader}"
        );
    }
}

/// Capture files of INT reports go through the same decoder, sink and counters as live UDP:
/// `stel-emu int --pcap` (Ethernet/IPv4/UDP to port 5900, from 10.255.x.y per switch) plus
/// other UDP and a bad report, replayed with `stel-ingestd --input`, and the tables compared
/// with the emulator's ground truth exactly. Receive time = capture time; reporter = the
/// capture's IP source.
#[test]
fn int_reports_in_a_pcap_ingest_exactly_like_live_udp() {
    use pcap_file::pcap::{PcapPacket, PcapReader, PcapWriter};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let evcs = d.join("evcs.json");
    let emu_pcap = d.join("emu.pcap");
    let truth_path = d.join("truth.json");
    let o = Command::new(env!("CARGO_BIN_EXE_stel-emu"))
        .args(["int", "--format", "amlight", "--count", "20000"])
        .args(["--rate", "0", "--flows", "8", "--max-hops", "10"])
        .args(["--loss", "0.01", "--drops", "0.05"])
        .args(["--path-change-every", "500", "--seq-start", "4294967000"])
        .arg("--pcap")
        .arg(&emu_pcap)
        .arg("--truth")
        .arg(&truth_path)
        .arg("--kytos-evcs")
        .arg(&evcs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_path).unwrap()).unwrap();
    let u = |k: &str| truth[k].as_u64().unwrap();

    // The emulator's packets, then: UDP to another port (skipped, counted), and an empty and
    // an unknown-version report to 5900 (malformed, counted by the INT decoder).
    let udp_frame = |dst_port: u16, payload: &[u8]| -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1, 0, 0, 64, 17, 0, 0, 192, 0, 2, 9, 10, 0, 0, 1]);
        f.extend_from_slice(&6000u16.to_be_bytes());
        f.extend_from_slice(&dst_port.to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    };
    let mut r = PcapReader::new(std::fs::File::open(&emu_pcap).unwrap()).unwrap();
    let mut w = PcapWriter::with_header(Vec::new(), r.header()).unwrap();
    let (mut first_ns, mut last_ns) = (u128::MAX, 0u128);
    let mut last = std::time::Duration::ZERO;
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        first_ns = first_ns.min(p.timestamp.as_nanos());
        last_ns = last_ns.max(p.timestamp.as_nanos());
        last = p.timestamp;
        w.write_packet(&p).unwrap();
    }
    for (port, payload) in [
        (53u16, &b"\x12\x34\x01\x00"[..]),
        (5900, &[]),
        (5900, &[0xf0, 0, 0, 0]),
    ] {
        let f = udp_frame(port, payload);
        w.write_packet(&PcapPacket::new(last, f.len() as u32, &f))
            .unwrap();
    }
    let pcap = d.join("int.pcap");
    std::fs::write(&pcap, w.into_writer()).unwrap();

    let data = d.join("data");
    let fin = ingest_capture(&["--int-kytos-evcs".as_ref(), evcs.as_ref()], &pcap, &data);
    let i = Snapshot::from_json(&fin["metrics"]);
    assert_eq!(
        i.sum(Metric::InputIntDatagrams),
        u("packets_sent") + 2,
        "{fin}"
    );
    assert_eq!(i.sum(Metric::InputNonIpfixDatagrams), 1, "{fin}");
    assert_eq!(i.sum(Metric::InputUnreadableRecords), 0, "{fin}");
    assert_eq!(i.sum(Metric::InputUnroutedIntDatagrams), 0, "{fin}");
    assert_eq!(fin["info"]["components"]["int"]["reader"], "file", "{fin}");
    let s = i;
    assert_eq!(
        int_reader(&s, Metric::ReaderDatagrams),
        u("packets_sent") + 2,
        "{fin}"
    );
    assert_eq!(s.get(Metric::IntDecoders), 1, "{fin}");
    assert_eq!(s.get(Metric::IntDecodedReports), u("reports_sent"), "{fin}");
    assert_eq!(s.get(Metric::IntDecodedHops), u("hops_sent"), "{fin}");
    assert_eq!(
        s.get(Metric::IntDecodedDropReports),
        u("drops_sent"),
        "{fin}"
    );
    assert_eq!(
        s.get(Metric::IntSeqLostReports),
        u("packets_lost_detectable"),
        "{fin}"
    );
    assert!(u("packets_lost_detectable") > 0);
    assert_eq!(
        s.get(Metric::IntEvcMatchedReports),
        u("reports_sent"),
        "{fin}"
    );
    assert_eq!(s.sum(Metric::IntMalformedReports), 2, "{fin}");
    assert_eq!(s.reason(Metric::IntMalformedReports, "empty"), 1, "{fin}");
    assert_eq!(
        s.reason(Metric::IntMalformedReports, "unknown_report_version"),
        1,
        "{fin}"
    );
    assert_eq!(
        s.with_label(Label::Sink, "int")
            .sum(Metric::SinkDeliveredSamples),
        u("reports_sent") + u("hops_sent") + u("drops_sent"),
        "{fin}"
    );

    let script = format!(
        r#"
import ipaddress, json, pyarrow.dataset as ds, pyarrow.compute as pc
root = {root:?}
out = {{}}
for t in ["int_reports", "int_hops", "int_drops"]:
    tb = ds.dataset(root + "/table=" + t, format="parquet", partitioning="hive").to_table()
    out[t] = tb.num_rows
    if t == "int_reports":
        out["latency_sum"] = pc.sum(tb["latency_sum_ns"]).as_py()
        out["evc_null"] = tb["evc_id"].null_count
        ts = tb["ts"].cast("int64")
        out["ts_min"] = pc.min(ts).as_py()
        out["ts_max"] = pc.max(ts).as_py()
        # stel-emu's pcap: the reporter is 10.255.<switch id bytes 2, 3>.
        out["reporter_mismatch"] = sum(
            1 for sw, a in zip(tb["switch_id"].to_pylist(), tb["reporter_addr"].to_pylist())
            if str(ipaddress.IPv6Address(a).ipv4_mapped) != "10.255.%d.%d" % ((sw >> 8) & 255, sw & 255))
print(json.dumps(out))
"#,
        root = data.to_str().unwrap()
    );
    let got: Value = python3_json(&script);
    assert_eq!(got["int_reports"].as_u64(), Some(u("reports_sent")));
    assert_eq!(got["int_hops"].as_u64(), Some(u("hops_sent")));
    assert_eq!(got["int_drops"].as_u64(), Some(u("drops_sent")));
    assert_eq!(got["latency_sum"], truth["latency_sum_ns"]);
    assert_eq!(got["evc_null"], 0);
    assert_eq!(got["reporter_mismatch"], 0, "{got}");
    assert_eq!(
        got["ts_min"].as_u64().map(u128::from),
        Some(first_ns),
        "{got}"
    );
    assert_eq!(
        got["ts_max"].as_u64().map(u128::from),
        Some(last_ns),
        "{got}"
    );

    // [int.filter] applies to captures too (in user space): keeping only v0.5 drops every
    // AmLight (v1.0) report and the unknown version, counted; the empty one is kept.
    let cfg = d.join("filter.toml");
    std::fs::write(&cfg, "[int.filter]\nenabled = true\nversions = [0]\n").unwrap();
    let fin = ingest_capture(
        &["--config".as_ref(), cfg.as_ref()],
        &pcap,
        &d.join("filtered"),
    );
    assert_eq!(
        fin["info"]["components"]["int"]["filter"]["kind"], "user_space",
        "{fin}"
    );
    let s = metrics(&fin);
    assert_eq!(
        s.get(Metric::IntFilterSeenDatagrams),
        u("packets_sent") + 2,
        "{fin}"
    );
    assert_eq!(
        s.reason(Metric::IntFilterDroppedDatagrams, "version"),
        u("packets_sent") + 1,
        "{fin}"
    );
    assert_eq!(s.reason(Metric::IntFilterDroppedDatagrams, "source"), 0);
    assert_eq!(s.get(Metric::IntFilterKeptDatagrams), 1, "{fin}");
    assert_eq!(s.get(Metric::IntFilterEmptyDatagrams), 1, "{fin}");
    assert_eq!(s.get(Metric::IntDecodedReports), 0, "{fin}");
    assert_eq!(s.reason(Metric::IntMalformedReports, "empty"), 1, "{fin}");
}

/// The socket's drop counter in /proc/net/udp (what SO_MEMINFO's drops report) for the port
/// `addr` is bound to.
fn proc_udp_drops(addr: &str) -> u64 {
    let port = addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let want = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/udp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|local| local.ends_with(&want))
        })
        .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// `[int.filter]` with versions = [1] and one accepted sender: v0.5 reports and reports from
/// another switch are dropped — in the kernel by the real eBPF socket filter (they never reach
/// the socket: not received, not decoded; the socket's drop counter shows them and the daemon's
/// `kernel_drops` does not count them as buffer loss), or by the same rule in user space with
/// `ebpf = false` — counted by reason either way; accepted reports are decoded.
#[test]
fn int_filter_drops_other_versions_and_senders_in_the_kernel_counted() {
    for ebpf in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let cfg = d.join("stel.toml");
        std::fs::write(
            &cfg,
            format!(
                "[int.filter]\nenabled = true\nversions = [1]\nsources = [\"127.0.0.1\"]\nebpf = {ebpf}\n"
            ),
        )
        .unwrap();
        let status_file = d.join("status.json");
        let (mut child, st, addr) = start_int_only(Some(&cfg), &d.join("data"), &status_file);
        let kind = if ebpf { "kernel" } else { "user_space" };
        assert_eq!(
            st["info"]["components"]["int"]["filter"]["kind"], kind,
            "{st}"
        );
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.2:0").unwrap();
        for seq in 1..=3 {
            a.send_to(&v05_plain_report(seq), &addr).unwrap();
        }
        a.send_to(&amlight_reference_packet(), &addr).unwrap();
        a.send_to(&[], &addr).unwrap();
        b.send_to(&amlight_reference_packet(), &addr).unwrap();
        let st = wait_status(&status_file, &mut child, "the filter's verdicts", |v| {
            let s = metrics(v);
            s.get(Metric::IntFilterSeenDatagrams) == 6 && s.get(Metric::IntDatagrams) == 2
        });
        if ebpf {
            // Dropped before the socket: the kernel counts them as the socket's drops.
            assert_eq!(proc_udp_drops(&addr), 4, "{st}");
        }
        let fin = stop_daemon(child);
        assert_eq!(
            fin["info"]["components"]["int"]["filter"]["kind"], kind,
            "{fin}"
        );
        let s = metrics(&fin);
        assert_eq!(s.get(Metric::IntFilterSeenDatagrams), 6, "{fin}");
        assert_eq!(s.get(Metric::IntFilterKeptDatagrams), 2, "{fin}");
        assert_eq!(s.get(Metric::IntFilterEmptyDatagrams), 1, "{fin}");
        assert_eq!(
            s.reason(Metric::IntFilterDroppedDatagrams, "version"),
            3,
            "{fin}"
        );
        assert_eq!(
            s.reason(Metric::IntFilterDroppedDatagrams, "source"),
            1,
            "{fin}"
        );
        // Every metric of [int] and [int.filter] is in the status file.
        for m in Metric::ALL {
            if matches!(m.condition(), Some("[int]" | "[int.filter]")) {
                assert!(s.has(*m), "{m} missing from the status file: {fin}");
            }
        }
        assert_eq!(int_reader(&s, Metric::ReaderKernelDroppedDatagrams), 0);
        // Kernel: only the kept ones reached the socket; user space: all did.
        assert_eq!(
            int_reader(&s, Metric::ReaderDatagrams),
            if ebpf { 2 } else { 6 },
            "{fin}"
        );
        assert_eq!(s.get(Metric::IntDecodedReports), 1, "{fin}");
        assert_eq!(
            s.sum_where(Metric::IntVersionDatagrams, Label::Version, "0.5"),
            0,
            "{fin}"
        );
        assert_eq!(s.reason(Metric::IntMalformedReports, "empty"), 1, "{fin}");
    }
}

/// The report filter is on the INT sockets before they can receive anything: a switch that is
/// already sending rejected reports when the daemon starts (switches never wait for their
/// collector) gets none of them past it. With `[int.filter]` versions = [1] (kernel path), a
/// sender floods v0.5 reports at the INT port from before the daemon starts until well after
/// it listens, then one accepted v1.0 report follows: the socket received that one datagram
/// only, and no v0.5 report was read or decoded. (Bound first and filtered after, every
/// datagram of the flood arriving in between sat in the socket unfiltered.)
#[test]
fn int_filter_is_attached_before_the_sockets_receive() {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = d.join("stel.toml");
    std::fs::write(
        &cfg,
        "[int.filter]\nenabled = true\nversions = [1]\nebpf = true\n",
    )
    .unwrap();
    // A port nobody listens on (the flood must start before the daemon binds it).
    let addr = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().to_string()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (stop, addr) = (Arc::clone(&stop), addr.clone());
        std::thread::spawn(move || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            let p = v05_plain_report(1);
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Refused while the port is closed (ICMP): only the ones after the bind count.
                if s.send_to(&p, &addr).is_ok() {
                    sent += 1;
                }
            }
            sent
        })
    };
    let status_file = d.join("status.json");
    let mut child = spawn_reporting(
        Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
            .arg("--config")
            .arg(&cfg)
            .args(["--int-only", "--int-listen", &addr, "--data-dir"])
            .arg(d.join("data")),
        &status_file,
    );
    // The flood goes on until the kernel filter has dropped plenty of it after start-up.
    let st = wait_status(
        &status_file,
        &mut child,
        "the flood dropped in the kernel",
        |v| {
            let s = metrics(v);
            v["info"]["components"]["int"]["listen"][0].is_string()
                && s.reason(Metric::IntFilterDroppedDatagrams, "version") >= 10_000
        },
    );
    stop.store(true, Ordering::Relaxed);
    let sent = flood.join().unwrap();
    assert_eq!(
        st["info"]["components"]["int"]["filter"]["kind"], "kernel",
        "{st}"
    );
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.send_to(&amlight_reference_packet(), &addr).unwrap();
    wait_status(&status_file, &mut child, "the accepted report", |v| {
        metrics(v).sum_where(Metric::IntVersionDatagrams, Label::Version, "1.0") >= 1
    });
    let fin = stop_daemon(child);
    let s = metrics(&fin);
    let dropped = s.reason(Metric::IntFilterDroppedDatagrams, "version");
    assert!(sent >= dropped && dropped >= 10_000, "{sent} sent: {fin}");
    assert_eq!(
        s.sum_where(Metric::IntVersionDatagrams, Label::Version, "0.5"),
        0,
        "v0.5 reports reached the decoder: {fin}"
    );
    assert_eq!(int_reader(&s, Metric::ReaderDatagrams), 1, "{fin}");
    assert_eq!(s.get(Metric::IntFilterKeptDatagrams), 1, "{fin}");
    assert_eq!(s.get(Metric::IntDecodedReports), 1, "{fin}");
    assert_eq!(s.get(Metric::IntFilterSeenDatagrams), dropped + 1, "{fin}");
}

/// Deterministic noise (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Per-sender state of the decoder stays inside its bounds whatever the senders put in their
/// reports, and sequence numbers nobody can vouch for are never counted as loss. Through
/// `stel-ingestd --int-only` over loopback UDP, with small bounds (`max_flows = 64`,
/// `max_streams = 128`) so eviction is exercised:
/// 1. a real 12-switch network reports (48 sequence streams);
/// 2. 30 k well-formed AmLight reports with random switch ids, sequence numbers and inner
///    addresses (a new stream and a new flow each);
/// 3. 30 k datagrams of random bytes from one sender (a Telemetry Report v0.5 without a switch
///    header takes the sender's address as its switch id: random sequence numbers on 64 streams);
/// 4. 20 k reports with a real switch's id and hw_id and random sequence numbers, interleaved
///    with the real network's own reports.
///
/// Then: the tables never held more than their bound (gauges at the end, evictions counted),
/// nothing was counted as lost (the real network lost nothing; no number from 2–4 is believed),
/// and the random numbers are counted as suspect or stale.
#[test]
fn random_switch_ids_flows_and_sequence_numbers_keep_decoder_state_bounded_and_honest() {
    use stel_emu::int::{Format, GenConfig, Generator};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (max_flows, max_streams) = (64u64, 128u64);
    let config = d.join("stel.toml");
    std::fs::write(
        &config,
        format!(
            "[int]\nlisten = [\"127.0.0.1:0\"]\n[int.decode]\nmax_flows = {max_flows}\nmax_streams = {max_streams}\n"
        ),
    )
    .unwrap();
    let status_file = d.join("status.json");
    let data = d.join("data");
    let (mut child, _, addr) = start_int_only(Some(&config), &data, &status_file);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(&addr).unwrap();
    let mut sent = 0u64;
    // Paced: loopback delivers in the sender's context; a burst larger than the socket
    // buffer would be kernel drops, not what this test is about.
    let mut send = |p: &[u8], sent: &mut u64| {
        sock.send(p).unwrap();
        *sent += 1;
        if (*sent).is_multiple_of(10_000) {
            wait_status(&status_file, &mut child, "the daemon to catch up", |v| {
                int_reader(&metrics(v), Metric::ReaderDatagrams) + 5_000 >= *sent
            });
        }
    };

    // 1. The real network.
    let mut g = Generator::new(GenConfig {
        format: Format::Amlight,
        flows: 16,
        min_hops: 5,
        max_hops: 5,
        ..GenConfig::default()
    });
    let mut buf = Vec::new();
    // The real network keeps reporting through everything below (one report per 10 others).
    let mut real = |g: &mut Generator, sent: &mut u64, send: &mut dyn FnMut(&[u8], &mut u64)| {
        let p = g.next_packet(&mut buf);
        assert!(p.send);
        send(p.payload, sent);
    };
    for _ in 0..2000 {
        real(&mut g, &mut sent, &mut send);
    }
    let victim = g.truth().streams[0].clone();
    // A 5-hop report of a generator of its own (every id in it is overwritten).
    let template = Generator::new(GenConfig {
        flows: 1,
        min_hops: 5,
        max_hops: 5,
        seed: 99,
        ..GenConfig::default()
    })
    .next_packet(&mut Vec::new())
    .payload
    .to_vec();
    let mut rng = Rng(0x5EED_1234);
    let mut fake = template.clone();
    // 2. Random switch ids, sequence numbers, inner source addresses (IPv4 at 16 + 14 + 4).
    for k in 0..30_000 {
        fake.copy_from_slice(&template);
        fake[4..8].copy_from_slice(&(rng.next() as u32).to_be_bytes());
        fake[8..12].copy_from_slice(&(rng.next() as u32).to_be_bytes());
        fake[46..50].copy_from_slice(&(rng.next() as u32).to_be_bytes());
        send(&fake, &mut sent);
        if k % 10 == 0 {
            real(&mut g, &mut sent, &mut send);
        }
    }
    // 3. Random bytes.
    let mut junk = vec![0u8; 300];
    for k in 0..30_000 {
        let n = 12 + (rng.next() % 280) as usize;
        for b in junk[..n].iter_mut() {
            *b = rng.next() as u8;
        }
        send(&junk[..n], &mut sent);
        if k % 10 == 0 {
            real(&mut g, &mut sent, &mut send);
        }
    }
    // 4. A real switch's stream with random sequence numbers, among its real reports (after a
    // round of the real network alone: the flood evicted its streams, they start again).
    for _ in 0..200 {
        real(&mut g, &mut sent, &mut send);
    }
    fake.copy_from_slice(&template);
    fake[3] = (fake[3] & 0xC0) | victim.hw_id;
    fake[4..8].copy_from_slice(&victim.switch_id.to_be_bytes());
    for k in 0..20_000 {
        fake[8..12].copy_from_slice(&(rng.next() as u32).to_be_bytes());
        send(&fake, &mut sent);
        if k % 10 == 0 {
            real(&mut g, &mut sent, &mut send);
        }
    }
    let truth = g.truth();
    let st = wait_status(&status_file, &mut child, "every datagram decoded", |v| {
        metrics(v).get(Metric::IntDatagrams) == sent
    });
    assert!(child.try_wait().unwrap().is_none(), "the daemon died");
    stel_testkit::sigterm(child.id());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    let fin: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let (m, s) = (metrics(&st), metrics(&fin));
    eprintln!(
        "sent {sent} ({} real): streams {} (dropped full {}, idle {}), flows {} (evicted {}), lost {}, suspect {}, stale {}, resyncs {}",
        truth.packets_sent,
        m.get(Metric::IntSeqStreams),
        s.reason(Metric::IntSeqDroppedStreams, "full"),
        s.reason(Metric::IntSeqDroppedStreams, "idle"),
        m.get(Metric::IntTrackedFlows),
        s.get(Metric::IntEvictedFlows),
        s.get(Metric::IntSeqLostReports),
        s.get(Metric::IntSeqSuspectReports),
        s.get(Metric::IntSeqStaleReports),
        s.get(Metric::IntSeqResyncs),
    );
    assert_eq!(s.get(Metric::IntDatagrams), sent, "{fin}");
    assert_eq!(
        int_reader(&s, Metric::ReaderKernelDroppedDatagrams),
        0,
        "{fin}"
    );
    // Bounded: the gauges (one decode thread) and the evictions that kept them there.
    assert!(m.get(Metric::IntSeqStreams) <= max_streams, "{st}");
    assert!(m.get(Metric::IntTrackedFlows) <= max_flows, "{st}");
    assert!(
        s.reason(Metric::IntSeqDroppedStreams, "full") >= 30_000 - max_streams,
        "{fin}"
    );
    assert!(
        s.get(Metric::IntEvictedFlows) >= 30_000 - max_flows,
        "{fin}"
    );
    // Honest: nothing the real network did is loss, and no random number became loss.
    assert_eq!(s.get(Metric::IntSeqLostReports), 0, "{fin}");
    assert_eq!(s.get(Metric::IntSeqPendingReports), 0, "{fin}");
    assert!(
        s.get(Metric::IntSeqSuspectReports) + s.get(Metric::IntSeqStaleReports) >= 19_000,
        "{fin}"
    );
    assert!(
        err.contains("table full") && err.contains("without the next number following"),
        "the evictions and suspect numbers are logged: {err}"
    );
    // The real network's reports are all in the tables (streams other than the one the random
    // numbers were sent on: those are rows of its switch too).
    let keys: Vec<u64> = truth
        .streams
        .iter()
        .filter(|t| (t.switch_id, t.hw_id) != (victim.switch_id, victim.hw_id))
        .map(|t| u64::from(t.switch_id) * 64 + u64::from(t.hw_id))
        .collect();
    let want: u64 = truth
        .streams
        .iter()
        .filter(|t| (t.switch_id, t.hw_id) != (victim.switch_id, victim.hw_id))
        .map(|t| t.sent)
        .sum();
    let script = format!(
        r#"
import json, pyarrow.dataset as ds, pyarrow.compute as pc, pyarrow as pa
t = ds.dataset({root:?} + "/table=int_reports", format="parquet", partitioning="hive").to_table()
key = pc.add(pc.multiply(t["switch_id"].cast(pa.uint64()), 64), t["hw_id"].cast(pa.uint64()))
real = pc.is_in(key, value_set=pa.array({keys:?}, pa.uint64()))
print(json.dumps({{"real": pc.sum(real.cast(pa.int64())).as_py()}}))
"#,
        root = data.to_str().unwrap()
    );
    let got: Value = python3_json(&script);
    assert_eq!(got["real"].as_u64(), Some(want), "{got}");
}

/// Hand-built reports from the spec tables (reference §5.3, §5.4, §5.6), through
/// `stel-ingestd --input capture.pcap` with no config file, read back with pyarrow:
/// * a Telemetry Report v2.0 group whose second report's MD Length (2 words) contradicts its
///   Report Length (2 words: only the fixed main contents): that report is malformed, and the
///   rest of the group — its would-be metadata words, which read as two empty reports, and a
///   valid third report — is skipped and counted, never read as reports (no invented rows);
/// * INT v1.0 hops whose queue word is `255 << 24 | 111` (queue 255 with a real occupancy: both
///   stored) and all-ones (unavailable: both null) — only a whole all-ones word is "unavailable";
/// * Telemetry Report v1.0 with the queue/drop-reason word (RepMdBits bit 4) and D = 0 (no
///   `int_drops` row; the word's values stay in `int_reports`), and the same with D = 1 (one
///   `int_drops` row).
#[test]
fn held_out_cases_from_the_spec_tables_through_a_capture_at_defaults() {
    let be = |ws: &[u32]| -> Vec<u8> { ws.iter().flat_map(|w| w.to_be_bytes()).collect() };
    // v2.0 group (§5.4): Ver 2, hw_id 0, seq 7, Node ID 0x0A000001.
    let report = |len: u8, md_len: u8, rep_md: u32, md: &[u32]| -> Vec<u8> {
        // RepType 1 (INT), InType 0 (none), Report Length, MD Length, no flags; main contents:
        // RepMdBits, DS id 0, DSMdBits 0, DSMdStatus 0, then the metadata words.
        [
            &[0x10, len, md_len, 0][..],
            &be(&[rep_md << 16, 0]),
            &be(md),
        ]
        .concat()
    };
    let group = [
        be(&[2 << 28 | 7, 0x0A00_0001]),
        report(3, 1, 0x4000, &[3 << 16 | 4]),
        // Report Length 2 covers the fixed 8 bytes only; MD Length says 2 more words follow.
        report(2, 2, 0x5000, &[]),
        be(&[0, 0]),
        report(3, 1, 0x4000, &[5 << 16 | 6]),
    ]
    .concat();
    let skipped = group.len() - 8 - 16;

    // INT v1.0 (§5.6) AmLight report (reference §6.3) with a given queue word and sequence.
    let amlight = |queue_word: u32, seq: u32| -> Vec<u8> {
        let mut p = amlight_reference_packet();
        let n = p.len();
        // The hop is the last 24 bytes: switch, ports, latency, queue word, timestamps.
        p[n - 12..n - 8].copy_from_slice(&queue_word.to_be_bytes());
        p[8..12].copy_from_slice(&seq.to_be_bytes());
        p
    };
    // Telemetry Report v1.0 (§5.3): Length 5 (4 + one RepMdBits word), NProt 0, RepMdBits bit 4
    // (queue id + drop reason + padding), D as given, F, hw_id 0; switch 0x0C000001.
    let v1_drop_word = |d: bool, seq: u32| -> Vec<u8> {
        let inner = amlight_reference_packet()[16..].to_vec();
        [
            &[0x15, 0x01, u8::from(d), 0x40][..],
            &be(&[0x0C00_0001, seq, 1000, 3 << 24 | 9 << 16]),
            &inner,
        ]
        .concat()
    };
    let payloads = [
        group,
        amlight(255 << 24 | 111, 1),
        amlight(u32::MAX, 2),
        v1_drop_word(false, 1),
        v1_drop_word(true, 2),
    ];
    let (_dir, data, fin) = ingest_capture_at_defaults(&payloads);
    let s = metrics(&fin);
    assert_eq!(s.get(Metric::IntDatagrams), 5, "{fin}");
    // v2.0: the first report and the broken one were read; 1 + 2 + 2 decoded.
    assert_eq!(s.get(Metric::IntReports), 6, "{fin}");
    assert_eq!(s.get(Metric::IntDecodedReports), 5, "{fin}");
    assert_eq!(s.sum(Metric::IntMalformedReports), 1, "{fin}");
    assert_eq!(
        s.reason(Metric::IntMalformedReports, "v2_md_past_report"),
        1,
        "{fin}"
    );
    assert_eq!(s.get(Metric::IntSkippedGroupBytes), skipped as u64, "{fin}");
    assert_eq!(s.get(Metric::IntDecodedDropReports), 1, "{fin}");

    let script = format!(
        r#"
import json, pyarrow.dataset as ds
def rows(t, cols):
    d = ds.dataset({root:?} + "/table=" + t, format="parquet", partitioning="hive")
    return sorted(d.to_table(columns=cols).to_pylist(), key=lambda r: (r["switch_id"], r["seq"]))
rep = rows("int_reports", ["switch_id", "seq", "rep_ingress_port", "rep_egress_port", "dropped",
                           "rep_queue_id", "rep_drop_reason"])
hops = [h for h in rows("int_hops", ["switch_id", "seq", "queue_id", "queue_occupancy"])
        if h["switch_id"] == 0xFB65D675]
drops = rows("int_drops", ["switch_id", "seq", "queue_id", "drop_reason"])
print(json.dumps({{"reports": rep, "hops": hops, "drops": drops}}))
"#,
        root = data.to_str().unwrap()
    );
    let got: Value = python3_json(&script);
    let v2: Vec<&Value> = got["reports"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["switch_id"] == 0x0A00_0001)
        .collect();
    assert_eq!(v2.len(), 1, "only the report before the broken one: {got}");
    assert_eq!(
        (&v2[0]["rep_ingress_port"], &v2[0]["rep_egress_port"]),
        (&3.into(), &4.into())
    );
    assert_eq!(
        got["hops"],
        serde_json::json!([
            {"switch_id": 0xFB65_D675u32, "seq": 1, "queue_id": 255, "queue_occupancy": 111},
            {"switch_id": 0xFB65_D675u32, "seq": 2, "queue_id": null, "queue_occupancy": null},
        ]),
        "{got}"
    );
    let c: Vec<&Value> = got["reports"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["switch_id"] == 0x0C00_0001)
        .collect();
    assert_eq!(c.len(), 2, "{got}");
    for (r, d) in c.iter().zip([false, true]) {
        assert_eq!(r["dropped"], d, "{got}");
        assert_eq!(
            (&r["rep_queue_id"], &r["rep_drop_reason"]),
            (&3.into(), &9.into())
        );
    }
    assert_eq!(
        got["drops"],
        serde_json::json!([{"switch_id": 0x0C00_0001u32, "seq": 2, "queue_id": 3, "drop_reason": 9}]),
        "{got}"
    );
}

/// `stel-ingestd [args] --input <pcap> --data-dir <data> --no-inspect --json` to the end of the
/// capture: its final status (the run must succeed).
fn ingest_capture(args: &[&std::ffi::OsStr], pcap: &Path, data: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args(args)
        .arg("--input")
        .arg(pcap)
        .arg("--data-dir")
        .arg(data)
        .args(["--no-inspect", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap()
}

/// `payloads` as UDP datagrams (192.0.2.9:6000 → 10.0.0.1:5900, one per capture record) through
/// `stel-ingestd --input <capture>` with no config file (the defaults a new user gets). Returns
/// the temp dir (keep it alive), the data dir and the final status.
fn ingest_capture_at_defaults(payloads: &[Vec<u8>]) -> (tempfile::TempDir, PathBuf, Value) {
    use pcap_file::pcap::{PcapPacket, PcapWriter};
    let udp_frame = |payload: &[u8]| -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1, 0, 0, 64, 17, 0, 0, 192, 0, 2, 9, 10, 0, 0, 1]);
        f.extend_from_slice(&6000u16.to_be_bytes());
        f.extend_from_slice(&5900u16.to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    };
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    for (k, p) in payloads.iter().enumerate() {
        let f = udp_frame(p);
        let ts = Duration::from_secs(1_700_000_000) + Duration::from_micros(k as u64);
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, &f))
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("cases.pcap");
    std::fs::write(&pcap, w.into_writer()).unwrap();
    let data = dir.path().join("data");
    let fin = ingest_capture(&[], &pcap, &data);
    (dir, data, fin)
}

/// AmLight's reference report (§6.3) and the same report in inner framings a switch may also
/// send, each written by hand: untagged, with IPv4 options (IHL 6, four NOPs) and double-tagged
/// (802.1ad 7 outside 802.1Q 42). The tagged and untagged ones take the decoder's one-pass
/// AmLight parse, the other two the layered parse; through a capture at defaults every one must
/// land with the reference hop and its own framing fields.
#[test]
fn amlight_reference_report_in_other_inner_framings_decodes_alike_at_defaults() {
    let with_seq = |mut p: Vec<u8>, seq: u32| -> Vec<u8> {
        p[8..12].copy_from_slice(&seq.to_be_bytes());
        p
    };
    let reference = amlight_reference_packet();
    // The inner frame starts at byte 16: MACs (12), 802.1Q tag (4: 0x8100, VLAN 42), EtherType
    // 0x0800 (2), IPv4 at byte 34.
    let mut untagged = reference.clone();
    untagged.drain(28..32);
    let mut options = reference.clone();
    options[34] = 0x46;
    let total = u16::from_be_bytes([options[36], options[37]]) + 4;
    options[36..38].copy_from_slice(&total.to_be_bytes());
    options.splice(54..54, [1, 1, 1, 1]);
    let mut qinq = reference.clone();
    qinq.splice(28..28, [0x88, 0xa8, 0, 7]);
    let payloads = vec![
        with_seq(reference, 1),
        with_seq(untagged, 2),
        with_seq(options, 3),
        with_seq(qinq, 4),
    ];
    let (_dir, data, fin) = ingest_capture_at_defaults(&payloads);
    let s = metrics(&fin);
    assert_eq!(s.get(Metric::IntDecodedReports), 4, "{fin}");
    assert_eq!(s.get(Metric::IntDecodedHops), 4, "{fin}");
    assert_eq!(s.sum(Metric::IntMalformedReports), 0, "{fin}");

    let script = format!(
        r#"
import json, pyarrow.dataset as ds
def rows(t, cols):
    d = ds.dataset({root:?} + "/table=" + t, format="parquet", partitioning="hive")
    return sorted(d.to_table(columns=cols).to_pylist(), key=lambda r: r["seq"])
rep = rows("int_reports", ["seq", "vlan", "inner_vlan", "dscp", "src_port", "dst_port", "hop_count",
                           "latency_sum_ns"])
hops = rows("int_hops", ["seq", "node_id", "ingress_port", "egress_port", "hop_latency", "queue_id",
                         "queue_occupancy", "ingress_ts", "egress_ts", "latency_ns"])
print(json.dumps({{"reports": rep, "hops": hops}}))
"#,
        root = data.to_str().unwrap()
    );
    let got: Value = python3_json(&script);
    let report = |seq: u32, vlan: Value, inner_vlan: Value| {
        serde_json::json!({
            "seq": seq, "vlan": vlan, "inner_vlan": inner_vlan, "dscp": 0x17, "src_port": 50000,
            "dst_port": 50001, "hop_count": 1, "latency_sum_ns": 1456
        })
    };
    assert_eq!(
        got["reports"],
        serde_json::json!([
            report(1, 42.into(), Value::Null),
            report(2, Value::Null, Value::Null),
            report(3, 42.into(), Value::Null),
            report(4, 7.into(), 42.into()),
        ]),
        "{got}"
    );
    let hop = |seq: u32| {
        serde_json::json!({
            "seq": seq, "node_id": 0xFB65_D675u32, "ingress_port": 23, "egress_port": 11,
            "hop_latency": null, "queue_id": 2, "queue_occupancy": 111,
            "ingress_ts": 980_325_604u32, "egress_ts": 980_327_060u32, "latency_ns": 1456
        })
    };
    assert_eq!(
        got["hops"],
        serde_json::json!([hop(1), hop(2), hop(3), hop(4)]),
        "{got}"
    );
}

/// UDP GRO on the INT socket: a sender using UDP GSO (`UDP_SEGMENT`, 64 reports of one size per
/// buffer, the last buffer ending with a shorter report) reaches the daemon as coalesced
/// receives; each is cut into its datagrams on the decode thread and every report lands in the
/// tables exactly — with the io_uring reader and with the recvmsg loop (which must read the
/// segment size from its control message too). Plain datagrams on the same socket still work.
#[test]
fn udp_gro_batches_are_cut_into_reports_exactly_with_io_uring_and_recvmsg() {
    use std::os::fd::AsFd;
    use stel_emu::int::{Format, GenConfig, Generator};
    for reader in ["io_uring", "recvmsg"] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let config = d.join("stel.toml");
        std::fs::write(&config, format!("[int]\nreader = \"{reader}\"\n")).unwrap();
        let status_file = d.join("status.json");
        let data = d.join("data");
        let (mut child, st, addr) = start_int_only(Some(&config), &data, &status_file);
        assert_eq!(st["info"]["components"]["int"]["reader"], reader, "{st}");
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.connect(&addr).unwrap();
        let mut g = Generator::new(GenConfig {
            format: Format::Amlight,
            flows: 32,
            min_hops: 5,
            max_hops: 5,
            drop_rate: 0.05,
            ..GenConfig::default()
        });
        let mut buf = Vec::new();
        let mut payload = || g.next_packet(&mut buf).payload.to_vec();
        let (mut reports, mut gso_reports) = (0u64, 0u64);
        for _ in 0..50 {
            let batch: Vec<Vec<u8>> = (0..64).map(|_| payload()).collect();
            let seg = batch[0].len();
            assert!(batch.iter().all(|p| p.len() == seg));
            let joined = batch.concat();
            assert_eq!(
                stel_ingest::sys::send_many_gso(sock.as_fd(), &[&joined], seg as u16).unwrap(),
                1
            );
            reports += 64;
            gso_reports += 64;
            // A plain datagram between the batches.
            sock.send(&payload()).unwrap();
            reports += 1;
        }
        // A last segment shorter than the others: a 5-hop report with its last hop cut off is
        // malformed (counted), never a row.
        let mut last: Vec<Vec<u8>> = (0..3).map(|_| payload()).collect();
        let seg = last[0].len();
        let short = last[2].len() - 24;
        last[2].truncate(short);
        // Its D flag (Telemetry Report v1.0 bit 23): whether the cut report was a drop.
        let cut_drops = u64::from(last[2][2] & 1);
        stel_ingest::sys::send_many_gso(sock.as_fd(), &[&last.concat()], seg as u16).unwrap();
        reports += 3;
        gso_reports += 3;
        let truth = g.truth();
        let st = wait_status(&status_file, &mut child, "every report", |v| {
            metrics(v).get(Metric::IntReports) == reports
        });
        stel_testkit::sigterm(child.id());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "exit {:?}: {err}", out.status);
        let fin: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
        let s = metrics(&fin);
        assert_eq!(
            int_reader(&s, Metric::ReaderKernelDroppedDatagrams),
            0,
            "{fin}"
        );
        assert_eq!(
            s.get(Metric::IntGroDatagrams),
            gso_reports,
            "{reader}: {st}"
        );
        assert_eq!(s.get(Metric::IntGroReceives), 51, "{reader}: {fin}");
        assert_eq!(s.get(Metric::IntDatagrams), reports, "{fin}");
        assert_eq!(s.get(Metric::IntDecodedReports), reports - 1, "{fin}");
        assert_eq!(s.sum(Metric::IntMalformedReports), 1, "{fin}");
        // The cut report's number arrived (its header was readable): no loss.
        assert_eq!(s.get(Metric::IntSeqLostReports), 0, "{fin}");
        let script = format!(
            r#"
import json, pyarrow.dataset as ds
root = {root:?}
out = {{}}
for t in ["int_reports", "int_hops", "int_drops"]:
    out[t] = ds.dataset(root + "/table=" + t, format="parquet", partitioning="hive").count_rows()
print(json.dumps(out))
"#,
            root = data.to_str().unwrap()
        );
        let got: Value = python3_json(&script);
        // Every report the generator built was sent; the cut one (5 hops) is the difference.
        assert_eq!(
            got["int_reports"].as_u64(),
            Some(truth.reports_sent - 1),
            "{got}"
        );
        assert_eq!(
            got["int_hops"].as_u64(),
            Some(truth.hops_sent - 5),
            "{reader}: {got}"
        );
        assert_eq!(
            got["int_drops"].as_u64(),
            Some(truth.drops_sent - cut_drops),
            "{got}"
        );
    }
}

/// `stel-emu int` with no options but an output shows what INT is for in its default one-second
/// run: some drops and path changes, in its truth and in what the daemon makes of its capture.
#[test]
fn the_emulators_defaults_show_drops_and_path_changes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (pcap, truth_path) = (d.join("int.pcap"), d.join("truth.json"));
    let o = Command::new(env!("CARGO_BIN_EXE_stel-emu"))
        .arg("int")
        .arg("--pcap")
        .arg(&pcap)
        .arg("--truth")
        .arg(&truth_path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_path).unwrap()).unwrap();
    let u = |k: &str| truth[k].as_u64().unwrap();
    assert!(u("drops_sent") > 0, "{truth}");
    assert!(u("path_changes") > 0, "{truth}");
    let fin = ingest_capture(&[], &pcap, &d.join("data"));
    let s = metrics(&fin);
    assert_eq!(s.get(Metric::IntDecodedReports), u("reports_sent"), "{fin}");
    assert_eq!(
        s.get(Metric::IntDecodedDropReports),
        u("drops_sent"),
        "{fin}"
    );
    assert_eq!(s.get(Metric::IntPathChanges), u("path_changes"), "{fin}");
}

/// INT alone prints INT's figures only: `--int-only` and a capture holding only INT reports
/// show no counter-path zeros (`0.0 M counters/s … filtered 0`) and no empty counter history's
/// summary; a capture with IPFIX counters too shows both.
#[test]
fn int_alone_prints_only_int_figures() {
    const INGESTD: &str = env!("CARGO_BIN_EXE_stel-ingestd");
    const EMU: &str = env!("CARGO_BIN_EXE_stel-emu");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let status_file = d.join("status.json");
    let mut child = Command::new(INGESTD)
        .args([
            "--int-only",
            "--int-listen",
            "127.0.0.1:0",
            "--status-line",
            "on",
        ])
        .args(["--no-inspect", "--data-dir"])
        .arg(d.join("live"))
        .arg("--status-file")
        .arg(&status_file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, addr) = wait_int_listen(&status_file, &mut child);
    let o = Command::new(EMU)
        .args(["int", "--to", &addr, "--count", "200", "--rate", "0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The tick that counted them printed its line before writing the file.
    wait_status(&status_file, &mut child, "200 reports decoded", |v| {
        metrics(v).get(Metric::IntDecodedReports) == 200
    });
    stel_testkit::sigterm(child.id());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("stel-ingestd: int ") && l.contains(" reports/s, ")),
        "{err}"
    );
    assert!(!err.contains("counters/s"), "{err}");
    assert!(!err.contains("stel-ingestd: history:"), "{err}");
    assert!(!err.contains("stel-ingestd: rollups:"), "{err}");
    assert!(
        err.trim_end()
            .ends_with("stel-ingestd: stopped cleanly (INT only)"),
        "{err}"
    );

    // Captures: INT only, then INT and IPFIX counters.
    let pcap = d.join("int.pcap");
    let ipfix = d.join("counters.ipfix");
    let o = Command::new(EMU)
        .args(["int", "--count", "200", "--rate", "0", "--pcap"])
        .arg(&pcap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(EMU)
        .args([
            "--ports",
            "2",
            "--interval",
            "100us",
            "--duration",
            "5ms",
            "--file",
        ])
        .arg(&ipfix)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ingest = |files: &[&Path], data: &str| {
        let o = Command::new(INGESTD)
            .args(["--status-line", "on", "--no-inspect", "--data-dir"])
            .arg(d.join(data))
            .arg("--input")
            .args(files)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        err
    };
    let err = ingest(&[&pcap], "int-capture");
    assert!(!err.contains("counters/s"), "{err}");
    assert!(!err.contains("stel-ingestd: history:"), "{err}");
    assert!(
        err.contains(
            "stel-ingestd: stopped cleanly: 200 INT reports decoded, no counters in the input"
        ),
        "{err}"
    );
    let err = ingest(&[&ipfix, &pcap], "both");
    assert!(err.contains(" M counters/s "), "{err}");
    assert!(
        err.contains("stel-ingestd: history: 1 files published"),
        "{err}"
    );
    assert!(err.contains("stel-ingestd: int: "), "{err}");
    assert!(
        err.contains("stel-ingestd: stopped cleanly: 100 snapshots decoded"),
        "{err}"
    );
}

/// `--int-only` listens where the config file says (`[int] listen`) as well as on
/// `--int-listen`; with neither it says what it needs, exit 2.
#[test]
fn int_only_listens_where_the_config_says() {
    let dir = tempfile::tempdir().unwrap();
    let status_file = dir.path().join("status.json");
    let conf = dir.path().join("stel.toml");
    std::fs::write(&conf, "[int]\nlisten = [\"127.0.0.1:0\"]\n").unwrap();
    let mut child = spawn_reporting(
        Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
            .arg("--int-only")
            .arg("--config")
            .arg(&conf)
            .arg("--data-dir")
            .arg(dir.path().join("data")),
        &status_file,
    );
    let (_, addr) = wait_int_listen(&status_file, &mut child);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    stop_daemon(child);

    let o = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .arg("--int-only")
        .arg("--data-dir")
        .arg(dir.path().join("data2"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("give it somewhere to listen"), "{err}");
}

/// The INT tables follow --data-dir with the counters' history off too (they went to
/// ./stel-data), and a second daemon on that directory and port is refused by the directory's
/// lock before it opens a socket: exit 2 naming the holder (it failed binding the port, or,
/// with several INT threads sharing it by SO_REUSEPORT, took part of the first one's reports
/// until refused).
#[test]
fn a_second_int_daemon_is_refused_before_it_binds() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let data = dir.path().join("int-data");
    let conf = dir.path().join("stel.toml");
    std::fs::write(&conf, "[int]\nthreads = 2\n").unwrap();
    let status_file = dir.path().join("status.json");
    let daemon = |listen: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"));
        c.current_dir(&cwd)
            .arg("--config")
            .arg(&conf)
            .args(["--int-only", "--no-history", "--int-listen", listen])
            .arg("--data-dir")
            .arg(&data);
        c
    };
    let mut first = spawn_reporting(&mut daemon("127.0.0.1:0"), &status_file);
    let (_, addr) = wait_int_listen(&status_file, &mut first);
    assert!(
        data.join(".stel-ingestd.lock").exists(),
        "the INT tables' directory is not --data-dir"
    );
    assert!(!cwd.join("stel-data").exists(), "INT tables in ./stel-data");

    let second = daemon(&addr)
        .arg("--status-file")
        .arg(dir.path().join("second.json"))
        .arg("--no-inspect")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{} is being written by another stel-ingestd (pid {}, since ",
            data.display(),
            first.id()
        )),
        "{err}"
    );
    assert!(!err.contains("in use"), "{err}");

    // The first one still has its port to itself: every report reaches it.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    for seq in 1..=50 {
        sock.send_to(&v05_plain_report(seq), &addr).unwrap();
    }
    wait_status(&status_file, &mut first, "50 reports", |v| {
        int_reader(&metrics(v), Metric::ReaderDatagrams) >= 50
    });
    let fin = stop_daemon(first);
    assert_eq!(
        int_reader(&metrics(&fin), Metric::ReaderDatagrams),
        50,
        "{fin}"
    );
}
