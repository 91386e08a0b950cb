//! The INT tables' writer through the real daemon.
//!
//! Input from a hostile or broken sender: reports with made-up switch ids (over loopback UDP,
//! and a capture of random UDP through `--input`) must not grow the daemon past its memory
//! budget, must not stop it, must be counted (refused switch ids, idle publishes), must leave no
//! temporary files, and a real switch reporting at the same time must still be stored exactly.
//!
//! A sender that stops: its reports are published within seconds (`idle_publish_ms`), not at
//! the next age rotation.
//!
//! Memory is read from `/proc/<pid>/status` (`VmHWM`: the peak resident set, so a spike between
//! two polls is not missed).

use std::{
    collections::BTreeSet,
    net::UdpSocket,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use stel_emu::int::{Format, GenConfig, Generator};
use stel_store::{
    int::POOL_MAX_BYTES,
    metrics::{Label, Metric, Snapshot},
};
use stel_testkit::python3_json;

/// A `VmXXX:` line of `/proc/<pid>/status`, in bytes.
fn vm_bytes(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

fn status(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn metrics(v: &Value) -> Snapshot {
    Snapshot::from_json(&v["metrics"])
}

/// Waits (polling the status file the daemon rewrites every second) until `ok` holds.
fn wait_status(path: &Path, child: &mut Child, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
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

/// Files under `dir` whose name ends with `.tmp` (unpublished parts).
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".tmp") {
                out.push(p);
            }
        }
    }
    out
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

/// Real switch ids of the generator: `switch_base + i` for its `switches`.
fn is_real(id: u32) -> bool {
    let base = GenConfig::default().switch_base;
    (base..base + 64).contains(&id)
}

/// A valid AmLight report (Telemetry Report v1.0) with a random switch id and sequence number.
fn made_up_report(template: &[u8], rng: &mut Rng, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(template);
    let mut id = rng.next() as u32;
    while is_real(id) {
        id = rng.next() as u32;
    }
    out[4..8].copy_from_slice(&id.to_be_bytes());
    out[8..12].copy_from_slice(&(rng.next() as u32).to_be_bytes());
}

/// A 5-hop AmLight report from a generator of its own (its ids are overwritten).
fn made_up_template() -> Vec<u8> {
    let mut g = Generator::new(GenConfig {
        flows: 1,
        min_hops: 5,
        max_hops: 5,
        seed: 99,
        ..GenConfig::default()
    });
    g.next_packet(&mut Vec::new()).payload.to_vec()
}

const MIB: u64 = 1 << 20;

/// `stel-ingestd --int-only` with a 32 MiB INT memory budget and 32 switch slots, flooded over
/// UDP with made-up switch ids for 8 s while a real 12-switch AmLight network keeps reporting.
#[test]
fn made_up_switch_ids_over_udp_stay_in_budget_and_a_real_network_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let budget = 32 * MIB;
    let max_switches = 32;
    let config = d.join("stel.toml");
    std::fs::write(
        &config,
        format!(
            "[int]\nlisten = [\"127.0.0.1:0\"]\n[int.parquet]\nmemory_budget_bytes = {budget}\nmax_switches = {max_switches}\n"
        ),
    )
    .unwrap();
    let status_file = d.join("status.json");
    let data = d.join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .arg("--config")
        .arg(&config)
        .args(["--int-only", "--int-listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--status-file")
        .arg(&status_file)
        .args(["--no-inspect", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let st = wait_status(&status_file, &mut child, "the INT listen address", |v| {
        v["info"]["components"]["int"]["listen"][0].is_string()
    });
    let addr = st["info"]["components"]["int"]["listen"][0]
        .as_str()
        .unwrap()
        .to_string();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(&addr).unwrap();

    // The real network: 12 switches, 64 flows of 5 hops, some drops; it reports before the
    // flood (and so holds its switch slots) and keeps reporting through it.
    let mut g = Generator::new(GenConfig {
        format: Format::Amlight,
        flows: 64,
        min_hops: 5,
        max_hops: 5,
        drop_rate: 0.02,
        congestion_rate: 0.05,
        ..GenConfig::default()
    });
    let mut buf = Vec::new();
    let mut sent = 0u64;
    let mut send_real = |g: &mut Generator, sent: &mut u64| {
        let p = g.next_packet(&mut buf);
        assert!(p.send);
        sock.send(p.payload).unwrap();
        *sent += 1;
    };
    for _ in 0..2000 {
        send_real(&mut g, &mut sent);
    }
    let real_switches: BTreeSet<u32> = g.truth().streams.iter().map(|s| s.switch_id).collect();
    let st = wait_status(&status_file, &mut child, "the real switches' slots", |v| {
        let m = metrics(v);
        m.get(Metric::IntDecodedReports) == sent
            && m.get(Metric::IntOpenSwitches) == real_switches.len() as u64
    });
    let before = vm_bytes(pid, "VmRSS:");
    assert_eq!(metrics(&st).get(Metric::IntSwitchRefusals), 0, "{st}");

    // The flood: 30 k made-up switch ids per second for 8 s, one real report every ms.
    let template = made_up_template();
    let mut rng = Rng(0x5EED);
    let mut fake = Vec::new();
    let (mut flood, t0) = (0u64, Instant::now());
    let flood_for = Duration::from_secs(8);
    while t0.elapsed() < flood_for {
        let due = (t0.elapsed().as_secs_f64() * 30_000.0) as u64;
        while flood < due {
            made_up_report(&template, &mut rng, &mut fake);
            sock.send(&fake).unwrap();
            flood += 1;
        }
        send_real(&mut g, &mut sent);
        std::thread::sleep(Duration::from_millis(1));
        assert!(child.try_wait().unwrap().is_none(), "the daemon died");
    }
    let total = sent + flood;
    let st = wait_status(&status_file, &mut child, "every datagram decoded", |v| {
        let m = metrics(v);
        m.sum_where(Metric::ReaderDatagrams, Label::Source, "int") == total
    });
    let peak = vm_bytes(pid, "VmHWM:");
    let m = metrics(&st);
    eprintln!(
        "flood: {flood} made-up reports, {sent} real; RSS before {:.1} MiB, peak {:.1} MiB; refusals {}, switch_limit rows {}, switch_rate rows {}, idle publishes {}, open switches {}",
        before as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        m.get(Metric::IntSwitchRefusals),
        m.with_label(Label::Sink, "int")
            .reason(Metric::SinkDroppedSamples, "switch_limit"),
        m.with_label(Label::Sink, "int")
            .reason(Metric::SinkDroppedSamples, "switch_rate"),
        m.reason(Metric::IntRotations, "idle"),
        m.get(Metric::IntOpenSwitches),
    );
    assert_eq!(
        m.sum_where(Metric::ReaderKernelDroppedDatagrams, Label::Source, "int"),
        0,
        "{st}"
    );
    assert_eq!(m.get(Metric::IntDecodedReports), total, "{st}");
    assert!(m.get(Metric::IntOpenSwitches) <= max_switches, "{st}");
    // The budget: the INT sink's memory budget (queue, open files, unfinished row groups),
    // plus the decoder's batch buffers outside it (the pool of emptied ones, at most
    // `POOL_MAX_BYTES`; the one being filled, the one being written and the writer's
    // regrouping buffers: 3 batches, under 8 MiB each even at 8192 reports × (report + 6 hops)
    // rows), plus the decoder's per-sender state for
    // the made-up ids (sequence streams, bounded by [int.decode]; measured ~100 MiB for 240 k
    // ids), plus room for the allocator.
    let stated = before + budget + POOL_MAX_BYTES as u64 + 3 * 8 * MIB + 128 * MIB + 16 * MIB;
    assert!(
        peak <= stated,
        "peak RSS {peak} above the stated budget {stated} (before the flood {before})"
    );

    stel_testkit::sigterm(child.id());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    let fin: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let s = metrics(&fin);
    assert!(s.get(Metric::IntSwitchRefusals) > 0, "{fin}");
    let sink = s.with_label(Label::Sink, "int");
    let dropped: Vec<String> = sink
        .series(Metric::SinkDroppedSamples)
        .map(|x| format!("{}={}", x.label(Label::Reason), x.value))
        .collect();
    let no_slot = sink.reason(Metric::SinkDroppedSamples, "switch_limit");
    let too_fast = sink.reason(Metric::SinkDroppedSamples, "switch_rate");
    assert!(no_slot > 0 && too_fast > 0, "{fin}");
    assert!(s.reason(Metric::IntRotations, "idle") > 0, "{fin}");
    // Every row submitted is written or counted by reason.
    assert_eq!(
        sink.sum(Metric::SinkReceivedSamples),
        sink.sum(Metric::SinkDeliveredSamples) + sink.sum(Metric::SinkDroppedSamples),
        "{fin}"
    );
    // Refusals are logged, rate-limited.
    let warnings = err.matches("rows of new switch ids refused").count();
    assert!(
        (1..=3).contains(&warnings),
        "{warnings} refusal lines: {err}"
    );
    assert_eq!(temp_files(&data), Vec::<PathBuf>::new());

    // The real network's reports, hops and drops are all in the tables.
    let truth = g.truth();
    let ids = real_switches
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let got = python3_json(&format!(
        r#"
import json, pyarrow.dataset as ds, pyarrow.compute as pc
out = {{}}
for t in ["int_reports", "int_hops", "int_drops"]:
    tb = ds.dataset({root:?} + "/table=" + t, format="parquet", partitioning="hive").to_table(columns=["switch_id"])
    real = pc.is_in(tb["switch_id"], value_set=__import__("pyarrow").array([{ids}], type="uint32"))
    out[t] = pc.sum(real.cast("int64")).as_py() or 0
    out[t + "_all"] = tb.num_rows
print(json.dumps(out))
"#,
        root = data.to_str().unwrap()
    ));
    assert_eq!(got["int_reports"], truth.reports_sent, "{got} {dropped:?}");
    assert_eq!(got["int_hops"], truth.hops_sent, "{got} {dropped:?}");
    assert_eq!(got["int_drops"], truth.drops_sent, "{got} {dropped:?}");
    let all = got["int_reports_all"].as_u64().unwrap()
        + got["int_hops_all"].as_u64().unwrap()
        + got["int_drops_all"].as_u64().unwrap();
    assert_eq!(all, sink.sum(Metric::SinkDeliveredSamples), "{got}");
}

/// `stel-ingestd --input` at defaults over a capture of 100 k UDP datagrams to the INT port:
/// random bytes, and valid reports with made-up switch ids. Exits cleanly within the default
/// budget, counts what it refused, leaves no temporary file.
#[test]
fn a_capture_of_random_udp_and_made_up_ids_stays_in_the_default_budget() {
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    use stel_emu::int::outer_frame;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut w = PcapWriter::with_header(Vec::new(), PcapHeader::default()).unwrap();
    let template = made_up_template();
    let (mut rng, mut payload, mut frame) = (Rng(7), Vec::new(), Vec::new());
    let n = 100_000u32;
    for i in 0..n {
        if i % 2 == 0 {
            made_up_report(&template, &mut rng, &mut payload);
        } else {
            let len = 16 + (rng.next() % 280) as usize;
            payload.clear();
            payload.extend((0..len).map(|_| rng.next() as u8));
        }
        outer_frame(&mut frame, rng.next() as u32, 5900, &payload);
        let ts = Duration::from_secs(1_700_000_000) + Duration::from_micros(u64::from(i) * 10);
        w.write_packet(&PcapPacket::new(ts, frame.len() as u32, &frame))
            .unwrap();
    }
    let pcap = d.join("random.pcap");
    std::fs::write(&pcap, w.into_writer()).unwrap();
    let data = d.join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .arg("--input")
        .arg(&pcap)
        .args(["--int-listen", "0.0.0.0:5900", "--data-dir"])
        .arg(&data)
        .args(["--no-inspect", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // VmHWM is the peak so far: the last reading before the process ends is its peak.
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kb) = s
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            {
                peak = kb * 1024;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    let fin: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let s = metrics(&fin);
    eprintln!(
        "capture: {n} datagrams, peak RSS {:.1} MiB, decoded {}, malformed {}, refusals {}",
        peak as f64 / MIB as f64,
        s.get(Metric::IntDecodedReports),
        s.sum(Metric::IntMalformedReports),
        s.get(Metric::IntSwitchRefusals)
    );
    assert_eq!(s.sum(Metric::InputIntDatagrams), u64::from(n), "{fin}");
    assert!(
        s.get(Metric::IntDecodedReports) >= u64::from(n / 2),
        "{fin}"
    );
    assert!(s.sum(Metric::IntMalformedReports) > 0, "{fin}");
    assert!(s.get(Metric::IntSwitchRefusals) > 0, "{fin}");
    let sink = s.with_label(Label::Sink, "int");
    assert!(
        sink.reason(Metric::SinkDroppedSamples, "switch_limit")
            + sink.reason(Metric::SinkDroppedSamples, "switch_rate")
            > 0,
        "{fin}"
    );
    assert_eq!(
        sink.sum(Metric::SinkReceivedSamples),
        sink.sum(Metric::SinkDeliveredSamples) + sink.sum(Metric::SinkDroppedSamples),
        "{fin}"
    );
    assert_eq!(temp_files(&data), Vec::<PathBuf>::new());
    // The default budget: the INT sink's 512 MiB, the decoder's batch buffers and per-sender
    // state (as in the UDP test), and 64 MiB for the rest of the daemon.
    let stated = 64 * MIB + 512 * MIB + 6 * 8 * MIB + 128 * MIB + 16 * MIB;
    assert!(peak > 0 && peak <= stated, "peak RSS {peak} above {stated}");
}

/// `stel-ingestd --int-only` at defaults: `stel-emu int` sends 3000 reports and stops; the
/// tables are published (every row, exactly) while the daemon keeps running, by the idle rule,
/// well before the 60 s age rotation.
#[test]
fn a_stopped_sender_is_published_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let status_file = d.join("status.json");
    let data = d.join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args(["--int-only", "--int-listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--status-file")
        .arg(&status_file)
        .args(["--no-inspect", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let st = wait_status(&status_file, &mut child, "the INT listen address", |v| {
        v["info"]["components"]["int"]["listen"][0].is_string()
    });
    let addr = st["info"]["components"]["int"]["listen"][0]
        .as_str()
        .unwrap()
        .to_string();
    let truth_path = d.join("truth.json");
    let o = Command::new(env!("CARGO_BIN_EXE_stel-emu"))
        .args(["int", "--to", &addr, "--count", "3000", "--rate", "0"])
        .args(["--flows", "8", "--drops", "0.05", "--truth"])
        .arg(&truth_path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stopped = Instant::now();
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_path).unwrap()).unwrap();
    let u = |k: &str| truth[k].as_u64().unwrap();
    let rows = u("reports_sent") + u("hops_sent") + u("drops_sent");
    // Published = some part in place and none still being written.
    let deadline = stopped + Duration::from_secs(30);
    let published = |data: &Path| {
        let parts = stel_store::paths::published_parts(data);
        !parts.is_empty() && temp_files(data).is_empty()
    };
    while !published(&data) {
        assert!(
            Instant::now() < deadline,
            "nothing published 30 s after the sender stopped"
        );
        assert!(child.try_wait().unwrap().is_none(), "the daemon exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "published {:.2} s after the sender stopped",
        stopped.elapsed().as_secs_f64()
    );
    let st = wait_status(&status_file, &mut child, "every row delivered", |v| {
        metrics(v)
            .with_label(Label::Sink, "int")
            .sum(Metric::SinkDeliveredSamples)
            == rows
    });
    let m = metrics(&st);
    assert!(m.reason(Metric::IntRotations, "idle") > 0, "{st}");
    assert_eq!(m.reason(Metric::IntRotations, "age"), 0, "{st}");
    let got = python3_json(&format!(
        r#"
import json, pyarrow.dataset as ds
print(json.dumps({{t: ds.dataset({root:?} + "/table=" + t, format="parquet", partitioning="hive").count_rows() for t in ["int_reports", "int_hops", "int_drops"]}}))
"#,
        root = data.to_str().unwrap()
    ));
    assert_eq!(got["int_reports"], u("reports_sent"), "{got}");
    assert_eq!(got["int_hops"], u("hops_sent"), "{got}");
    assert_eq!(got["int_drops"], u("drops_sent"), "{got}");
    stel_testkit::sigterm(child.id());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
