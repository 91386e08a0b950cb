//! The daemon's receive path through the real kernel (root): io_uring and recvmsg readers, true
//! drop accounting, the eBPF filter in the loop, capability dropping and clean shutdown of the
//! real binary. Fails loudly, never skips, without root.
use std::{
    os::fd::AsFd,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use stel_emu::{EmuConfig, Emulator};
use stel_store::metrics::{Label, Metric, Snapshot};

use stel_ingest::{
    config::{DaemonConfig, SourceKind},
    daemon::Daemon,
    decode::CounterBatch,
    netlink,
    pipeline::Sink,
    reader::{Reader, ReaderConfig, ReaderKind},
    sys::{self, netlink::NetlinkSocket},
};

fn rx_socket(group: u32, rcvbuf: usize) -> NetlinkSocket {
    let s = NetlinkSocket::usersock().expect("NETLINK_USERSOCK socket (run the tests as root)");
    s.join_group(group)
        .expect("join multicast group (run the tests as root)");
    s.set_rcvbuf(rcvbuf).expect("rcvbuf");
    s
}

fn reader(sock: &NetlinkSocket, kind: ReaderKind, slot_bytes: usize) -> Reader {
    let cfg = ReaderConfig {
        kind,
        slots: 64,
        slot_bytes,
        poll_timeout_ms: 20,
        batch_wait_us: ReaderConfig::default().batch_wait_us,
    };
    let r = Reader::new(sock.as_fd(), &cfg).expect("reader");
    assert_eq!(
        r.kind(),
        match kind {
            ReaderKind::Recvmsg => "recvmsg",
            _ => "io_uring",
        }
    );
    r
}

/// Reads until `n` datagrams (or truncations) arrived; returns their bytes.
fn read_all(r: &mut Reader, n: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut leases = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while r.stats().datagrams + r.stats().truncated < n && Instant::now() < deadline {
        r.poll(&mut leases).expect("poll");
        for l in leases.drain(..) {
            out.push(r.bytes(&l).to_vec());
            r.retire(l);
        }
    }
    out
}

#[test]
fn io_uring_and_recvmsg_readers_agree_byte_for_byte() {
    let group = 11;
    let a = rx_socket(group, 64 << 20);
    let b = rx_socket(group, 64 << 20);
    // 16 KiB slots: the 20,000-byte datagram must be counted as truncated by both, never spliced.
    let mut ra = reader(&a, ReaderKind::IoUring, 16 << 10);
    let mut rb = reader(&b, ReaderKind::Recvmsg, 16 << 10);
    let tx = NetlinkSocket::usersock().unwrap();
    let sizes = [1usize, 7, 100, 4096, 16000, 20000, 3, 15000, 64, 9999];
    let mut sent = Vec::new();
    for (i, &n) in sizes.iter().cycle().take(200).enumerate() {
        let payload: Vec<u8> = (0..n).map(|j| (i * 31 + j * 7) as u8).collect();
        let mut f = Vec::new();
        netlink::frame(&mut f, netlink::USERSOCK_MSG_TYPE, i as u32, &payload);
        tx.send_multicast(group, &f).unwrap();
        sent.push(f);
    }
    let got_a = read_all(&mut ra, 200);
    let got_b = read_all(&mut rb, 200);
    let want: Vec<Vec<u8>> = sent.into_iter().filter(|f| f.len() <= 16 << 10).collect();
    assert_eq!(got_a.len(), want.len());
    assert!(got_a == want, "io_uring reader delivered different bytes");
    assert!(got_b == want, "recvmsg reader delivered different bytes");
    assert_eq!(ra.stats().truncated, 20);
    assert_eq!(rb.stats().truncated, 20);
    assert_eq!(ra.slots_leased(), 0);
    assert_eq!(rb.slots_leased(), 0);
}

#[test]
fn kernel_drops_are_counted_exactly_when_the_reader_is_paused() {
    for (group, kind) in [(12, ReaderKind::IoUring), (13, ReaderKind::Recvmsg)] {
        // A small buffer that nobody reads while 300 × 30 KB arrive: most are dropped.
        let s = rx_socket(group, 1 << 20);
        let mut r = reader(&s, kind, 65600);
        let tx = NetlinkSocket::usersock().unwrap();
        let mut f = Vec::new();
        netlink::frame(&mut f, netlink::USERSOCK_MSG_TYPE, 0, &[0xab; 30000]);
        for _ in 0..300 {
            tx.send_multicast(group, &f).unwrap();
        }
        let drops = sys::meminfo_drops(s.as_fd()).unwrap();
        assert!(drops > 0, "{kind:?}: expected the 1 MiB buffer to overflow");
        let got = read_all(&mut r, 300 - drops);
        // Nothing more arrives later: received + dropped is exactly what was sent.
        std::thread::sleep(Duration::from_millis(50));
        let mut leases = Vec::new();
        r.poll(&mut leases).unwrap();
        assert!(leases.is_empty());
        assert_eq!(got.len() as u64 + drops, 300, "{kind:?}");
        assert_eq!(sys::meminfo_drops(s.as_fd()).unwrap(), drops);
    }
}

#[derive(Debug, Default)]
struct Count(AtomicU64, AtomicU64);

impl Sink for Count {
    fn name(&self) -> &'static str {
        "count"
    }
    fn submit(&self, b: &Arc<CounterBatch>) {
        self.0.fetch_add(b.rows() as u64, Ordering::Relaxed);
        self.1.fetch_add(b.samples() as u64, Ordering::Relaxed);
    }
}

fn usersock_daemon(group: u32, kind: ReaderKind, decoders: usize) -> (Daemon, Arc<Count>) {
    let mut cfg = DaemonConfig::default();
    cfg.source.kind = SourceKind::Usersock;
    cfg.source.usersock_group = group;
    cfg.reader.kind = kind;
    cfg.pipeline.decoders = decoders;
    cfg.status.file = Default::default();
    // SONiC's rule: only registered templates pass (usersock's default is `learn`).
    cfg.filter.policy = stel_ingest::filter::FilterPolicy::Registered;
    let mut d = Daemon::setup(cfg, None).expect("daemon setup (run the tests as root)");
    let sink = Arc::new(Count::default());
    d.start(vec![Arc::clone(&sink) as Arc<dyn Sink>]);
    (d, sink)
}

/// Emulator → kernel (eBPF filter) → reader → two decoders: exactly what was sent of the
/// registered session arrives; another exporter's unregistered template is dropped in the
/// kernel and counted there.
#[test]
fn daemon_decodes_exactly_what_was_sent_and_the_kernel_drops_the_rest() {
    for (group, kind) in [(14, ReaderKind::IoUring), (15, ReaderKind::Recvmsg)] {
        let (mut d, sink) = usersock_daemon(group, kind, 2);
        let mut cfg = EmuConfig::design();
        cfg.ports = 16;
        let mut emu = Emulator::new(cfg.clone()).unwrap();
        d.register(emu.session_spec(), emu.session_config())
            .unwrap();
        // A second exporter (domain 7, template 300) nobody subscribed to.
        cfg.template_id = 300;
        cfg.domain = 7;
        let mut other = Emulator::new(cfg).unwrap();
        let tx = NetlinkSocket::usersock().unwrap();
        let (mut ipfix, mut f) = (Vec::new(), Vec::new());
        let mut send = |e: &mut Emulator, template: bool| {
            ipfix.clear();
            f.clear();
            if template {
                e.template_message(&mut ipfix);
            } else {
                e.data_message(&mut ipfix);
            }
            netlink::frame(&mut f, netlink::USERSOCK_MSG_TYPE, 0, &ipfix);
            tx.send_multicast(group, &f).unwrap();
        };
        send(&mut emu, true);
        send(&mut other, true);
        for _ in 0..300 {
            send(&mut emu, false);
            send(&mut other, false);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.status().recv.datagrams < 302 && Instant::now() < deadline {
            d.step().unwrap();
        }
        let st = d.finish(None, Duration::from_secs(2));
        assert_eq!(
            sink.0.load(Ordering::Relaxed),
            emu.truth.records,
            "{kind:?}"
        );
        assert_eq!(
            sink.1.load(Ordering::Relaxed),
            emu.truth.samples,
            "{kind:?}"
        );
        assert_eq!(st.pipeline.decode.seq_lost_messages, 0);
        assert_eq!(st.kernel_drops, 0);
        if st.filter.kind == "kernel" {
            assert_eq!(st.filter.dropped, 300, "{kind:?}: {:?}", st.filter);
            // Both template messages and the registered data are kept.
            assert_eq!(st.recv.datagrams, 302);
        } else {
            panic!(
                "the eBPF filter did not load ({:?}); the README's setup installs its toolchain",
                st.filter
            );
        }
    }
}

fn cap_eff(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let s = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        for key in ["CapEff:", "CapPrm:", "CapBnd:"] {
            if let Some(l) = s.lines().find(|l| l.starts_with(key)) {
                out.push((
                    format!("{} {key}", t.display()),
                    l[key.len()..].trim().to_string(),
                ));
            }
        }
    }
    out
}

/// The real binary: all capabilities of every thread gone once running, SIGTERM → drain,
/// flush, exit 0 with the final counters.
#[test]
fn stel_ingestd_drops_every_capability_and_stops_cleanly_on_sigterm() {
    assert_eq!(
        euid(),
        0,
        "this test needs root: the daemon must start privileged to show it drops privileges"
    );
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args([
            "--usersock-group",
            "16",
            "--no-history",
            "--json",
            "--status-file",
        ])
        .arg(&status)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !status.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(status.exists(), "daemon wrote no status file");
    let caps = cap_eff(child.id());
    assert!(caps.len() >= 6, "{caps:?}");
    for (who, v) in &caps {
        assert_eq!(v, "0000000000000000", "{who} still has capabilities");
    }
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    assert_eq!(
        Snapshot::from_json(&st["metrics"]).sum(Metric::DaemonCapabilitiesDroppedState),
        1,
        "{st}"
    );
    stel_testkit::sigterm(child.id());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert!(err.contains("stopped cleanly"), "{err}");
    let fin: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(fin["info"]["reader"], "io_uring");
}

fn euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .unwrap_or(u32::MAX)
}

/// A slow demo (one counter every 100 ms) stops when asked. It used to pack thousands of
/// snapshots into one message (one message every ~7 minutes) and sleep through the stop,
/// hanging `--duration` and SIGINT for minutes. Checks that what was sent was decoded.
#[test]
fn slow_demo_stops_on_time_and_decodes_everything_sent() {
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args([
            "--demo",
            "--no-ebpf",
            "--no-inspect",
            "--ports",
            "1",
            "--stats",
            "1",
            "--interval",
            "100ms",
            "--duration",
            "2s",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Generous: a hang was minutes; this is not a performance threshold.
    assert!(
        took < std::time::Duration::from_secs(30),
        "took {took:?}\n{err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("demo done"))
        .unwrap_or_else(|| panic!("no summary line:\n{err}"));
    // "emulator sent N snapshots (…), decoder decoded N (…)"
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(nums.len() >= 4, "{line}");
    assert!(
        nums[0] >= 10,
        "a 2 s demo at 100 ms sent only {}: {line}",
        nums[0]
    );
    assert_eq!(nums[0], nums[2], "{line}");
}

/// The demo with `--otlp-endpoint`: a real OTLP receiver (grpcio + opentelemetry-proto) gets
/// every decoded counter, exactly as many as the sink counts as delivered, with the session's
/// names and the snapshots' timestamps.
#[test]
fn demo_exports_every_decoded_counter_over_otlp() {
    use stel_testkit::otlp::{Receiver, ReceiverOptions};
    let rx = Receiver::start(ReceiverOptions {
        grpc: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args([
            "--demo",
            "--no-ebpf",
            "--no-inspect",
            "--no-history",
            "--json",
            "--ports",
            "2",
            "--stats",
            "3",
            "--interval",
            "2ms",
            "--duration",
            "2s",
            "--otlp-endpoint",
        ])
        .arg(rx.grpc_endpoint())
        .arg("--status-file")
        .arg(dir.path().join("status.json"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let st: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let m = Snapshot::from_json(&st["metrics"]);
    let decoded = m.sum(Metric::DecodeValues);
    let otlp = |metric| m.sum_where(metric, Label::Sink, "otlp");
    assert!(decoded >= 6 * 100, "{st}");
    assert_eq!(otlp(Metric::SinkReceivedSamples), decoded, "{st}");
    assert_eq!(otlp(Metric::SinkDeliveredSamples), decoded, "{st}");
    let all = rx.points();
    // The daemon's own counters (stel_*) go out too, at least once at shutdown.
    let (own, points): (Vec<_>, Vec<_>) = all.iter().partition(|p| p.metric.starts_with("stel_"));
    assert_eq!(points.len() as u64, decoded);
    // (How many own points were delivered is not a registry series: counting the export of
    // the registry in the registry would change what is being exported.)
    assert!(!own.is_empty());
    assert!(own
        .iter()
        .any(|p| p.metric == "stel_sink_received_samples_total" && p.attrs["sink"] == "otlp"));
    let p = points
        .iter()
        .find(|p| p.metric == "sai.port.if_in_octets")
        .unwrap_or_else(|| panic!("no IF_IN_OCTETS: {:?}", points.first()));
    assert_eq!(p.kind, "sum");
    assert_eq!(p.attrs["profile"], "stel_demo");
    assert_eq!(p.attrs["object_name"], "Ethernet0");
    assert_eq!(p.attrs["sai_stat"], "SAI_PORT_STAT_IF_IN_OCTETS");
    // Switch time of the demo starts at the wall clock: within a day of now.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(p.time.abs_diff(now) < 86_400_000_000_000, "{p:?}");
}

/// Logs for files and journald: no colour codes when stderr is not a terminal, JSON lines with
/// `--log-format json`, and no per-second status line under systemd (INVOCATION_ID set) — only
/// the final summary in the status line's words.
#[test]
fn logs_are_plain_or_json_and_the_status_line_is_off_under_systemd() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], env: Option<(&str, &str)>, sub: &str| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"));
        // 3 s: the forced status line ticks at 1 s and 2 s even on a loaded box.
        c.args(["--demo", "--duration", "3s", "--no-inspect", "--data-dir"])
            .arg(dir.path().join(sub))
            .arg("--status-file")
            .arg(dir.path().join(format!("{sub}.json")))
            .args(extra)
            .env_remove("INVOCATION_ID")
            .env_remove("JOURNAL_STREAM")
            .env_remove("STEL_LOG_FORMAT");
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stderr).unwrap()
    };
    let text = run(&[], None, "a");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a redirected log:\n{text}"
    );
    assert!(text.contains(" INFO "), "{text}");

    let json = run(&["--log-format", "json"], None, "b");
    let events: Vec<serde_json::Value> = json
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["level"] == "INFO" && e["fields"]["message"].is_string()),
        "{json}"
    );
    assert!(
        !json.contains(" INFO "),
        "text log lines under --log-format json:\n{json}"
    );

    let status_lines = |s: &str| s.lines().filter(|l| l.contains("snapshots | lost")).count();
    let systemd = run(&[], Some(("INVOCATION_ID", "0123456789abcdef")), "c");
    assert_eq!(
        status_lines(&systemd),
        1,
        "only the final summary:\n{systemd}"
    );
    let forced = run(
        &["--status-line", "on"],
        Some(("INVOCATION_ID", "0123456789abcdef")),
        "d",
    );
    // The final summary plus at least the tick after the first second.
    assert!(status_lines(&forced) >= 2, "{forced}");
}

/// Asserts that `run` was refused because the daemon `pid` holds `data` (exit 2, the one line
/// naming the holder and what to do); returns its stderr.
fn assert_refused_by(run: &std::process::Output, data: &std::path::Path, pid: u32) -> String {
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(run.status.code(), Some(2), "{err}");
    let want = format!(
        "stel-ingestd: {} is being written by another stel-ingestd (pid {pid}, since ",
        data.display()
    );
    assert!(err.contains(&want), "{err}");
    assert!(
        err.contains("stop it or give this one another --data-dir"),
        "{err}"
    );
    err
}

/// One writer per data directory: a second stel-ingestd on a directory a running one writes is
/// refused at start (exit 2, naming the directory and the holder's pid) before it touches a
/// file there; the first finishes with nothing lost and its history readable; once it has
/// exited, the directory is free again.
#[test]
fn a_second_daemon_on_a_data_dir_in_use_is_refused_and_the_first_loses_nothing() {
    use std::process::{Command, Stdio};
    const INGESTD: &str = env!("CARGO_BIN_EXE_stel-ingestd");
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let demo = |duration: &str| {
        let mut c = Command::new(INGESTD);
        c.args([
            "--demo",
            "--no-ebpf",
            "--no-inspect",
            "--json",
            "--ports",
            "8",
        ])
        .args(["--interval", "1ms", "--duration", duration, "--data-dir"])
        .arg(&data);
        c
    };
    // Runs until stopped, so that the second one meets it however slow the box.
    let first = demo("600s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed if an assertion fails before it is stopped.
    let first = stel_testkit::KillOnDrop::new(first);
    let pid = first.id();
    // Running: it has written its status file (after taking the lock).
    let status = data.join("status.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !status.exists() {
        assert!(Instant::now() < deadline, "the first daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = demo("5s").output().unwrap();
    let holder = format!("pid {pid}, since ");
    let err2 = assert_refused_by(&second, &data, pid);
    assert!(
        !err2.contains("unpublished"),
        "it touched the first one's files: {err2}"
    );
    assert!(second.stdout.is_empty(), "{err2}");
    let lock = data.join(stel_ingest::sys::dirlock::LOCK_FILE);
    let held = std::fs::read_to_string(&lock).unwrap();
    assert!(held.starts_with(&holder), "{held}");

    stel_testkit::sigterm(pid);
    let out = first.into_inner().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert!(err.contains("stopped cleanly"), "{err}");
    let fin: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim())
        .unwrap_or_else(|e| panic!("{e}: {err}"));
    let m = Snapshot::from_json(&fin["metrics"]);
    let parquet = |metric| m.sum_where(metric, Label::Sink, "parquet");
    let decoded = m.sum(Metric::DecodeValues);
    assert!(decoded > 0, "{fin}");
    assert_eq!(parquet(Metric::SinkDroppedSamples), 0, "{fin}");
    assert_eq!(parquet(Metric::SinkDeliveredSamples), decoded, "{fin}");
    // The status file is the first one's final status, not the refused one's.
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    assert_eq!(st["info"]["pid"].as_u64(), Some(u64::from(pid)), "{st}");
    assert_eq!(st["info"]["stopped"].as_bool(), Some(true), "{st}");
    // Its history reads back whole.
    let parts = stel_store::paths::published_parts(&data);
    assert!(
        !parts.is_empty(),
        "nothing published under {}",
        data.display()
    );
    let mut rows = 0;
    for (_, path, _) in &parts {
        let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(path).unwrap(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .build()
        .unwrap();
        for b in r {
            rows += b
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .num_rows();
        }
    }
    assert!(rows > 0);

    // Free again once the holder has exited.
    let third = demo("500ms").output().unwrap();
    let err3 = String::from_utf8_lossy(&third.stderr);
    assert!(third.status.success(), "{err3}");
    assert!(err3.contains("stopped cleanly"), "{err3}");
}

/// One daemon per data directory with `--no-history` too: a run that writes no history but
/// whose status file is `<data dir>/status.json` (the default) is refused beside a daemon on
/// that directory (exit 2, naming the holder) instead of rewriting its status file. Where its
/// data directory cannot be created, it runs without the status file, as it did before the
/// lock (a WARN).
#[test]
fn a_no_history_run_on_a_data_dir_in_use_is_refused_and_leaves_its_status_file() {
    use std::process::{Command, Stdio};
    const INGESTD: &str = env!("CARGO_BIN_EXE_stel-ingestd");
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let demo = |duration: &str| {
        let mut c = Command::new(INGESTD);
        c.args(["--demo", "--no-ebpf", "--no-inspect", "--ports", "2"])
            .args(["--stats", "2", "--interval", "1ms", "--duration", duration]);
        c
    };
    // Runs until stopped, so that the second one meets it however slow the box.
    let first = demo("600s")
        .arg("--data-dir")
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed if an assertion fails before it is stopped.
    let first = stel_testkit::KillOnDrop::new(first);
    let pid = first.id();
    let status = data.join("status.json");
    let first_pid = || {
        let text = std::fs::read_to_string(&status).ok()?;
        let st: serde_json::Value = serde_json::from_str(&text).ok()?;
        st["info"]["pid"].as_u64()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while first_pid().is_none() {
        assert!(Instant::now() < deadline, "the first daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let second = demo("5s")
        .arg("--no-history")
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert_refused_by(&second, &data, pid);
    // The first one's status file: the refused run, which has exited, did not write it (a run
    // that started would have, at its exit at the latest).
    assert_eq!(first_pid(), Some(u64::from(pid)));
    stel_testkit::sigterm(pid);
    assert!(first.into_inner().wait().unwrap().success());
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    assert_eq!(st["info"]["pid"].as_u64(), Some(u64::from(pid)), "{st}");
    assert_eq!(st["info"]["stopped"].as_bool(), Some(true), "{st}");

    // A data directory that cannot be created (under a file): no lock, no status file, a
    // warning, and the run itself goes on as before.
    let file = t.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = demo("300ms")
        .arg("--no-history")
        .arg("--data-dir")
        .arg(file.join("data"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("Cannot lock the data directory for the status file"),
        "{err}"
    );
}

/// `stel-ingestd status` reads the file of the daemon it is pointed at (`--data-dir`,
/// `STEL_DATA_DIR`) and, pointed nowhere, a running daemon's file before a stopped one's, naming
/// the file it read on stderr.
#[test]
fn status_reads_the_data_dirs_file_and_prefers_a_running_daemons() {
    use std::process::{Command, Stdio};
    use stel_ingest::report::{pick_status_file, STATUS_FILE_DEFAULTS};
    const INGESTD: &str = env!("CARGO_BIN_EXE_stel-ingestd");
    let t = tempfile::tempdir().unwrap();
    let demo = |c: &mut Command| {
        c.args(["--demo", "--no-ebpf", "--no-inspect", "--ports", "2"])
            .args(["--stats", "2", "--interval", "1ms"]);
    };
    // A stopped daemon's final status.
    let old = t.path().join("old");
    let mut c = Command::new(INGESTD);
    demo(&mut c);
    let out = c
        .args(["--duration", "200ms", "--data-dir"])
        .arg(&old)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A running one in its default directory, ./stel-data.
    let cwd = t.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let mut c = Command::new(INGESTD);
    demo(&mut c);
    // No --duration: killed if an assertion fails before it is stopped.
    let live = stel_testkit::KillOnDrop::new(
        c.current_dir(&cwd)
            .env_remove("STEL_DATA_DIR")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let live_file = cwd.join("stel-data/status.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !live_file.exists() {
        assert!(Instant::now() < deadline, "the daemon wrote no status file");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = |cwd: &std::path::Path, args: &[&str], env: Option<&std::path::Path>| {
        let mut c = Command::new(INGESTD);
        c.arg("status").args(args).current_dir(cwd);
        match env {
            Some(d) => c.env("STEL_DATA_DIR", d),
            None => c.env_remove("STEL_DATA_DIR"),
        };
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).to_string(),
            err,
        )
    };
    let reads = |f: &std::path::Path| format!("stel-ingestd: status from {}\n", f.display());

    let (code, _, err) = status(t.path(), &["--data-dir", old.to_str().unwrap()], None);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with(&reads(&old.join("status.json"))), "{err}");
    assert!(err.contains("STALE: the daemon"), "{err}");

    let (code, out, err) = status(t.path(), &[], Some(&cwd.join("stel-data")));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(err, reads(&live_file), "{err}");
    assert!(out.contains("stel_reader_datagrams_total"), "{out}");

    // --file wins over the directory.
    let (code, _, err) = status(
        t.path(),
        &["--file", old.join("status.json").to_str().unwrap()],
        Some(&cwd.join("stel-data")),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with(&reads(&old.join("status.json"))), "{err}");

    // Pointed nowhere: the defaults, a running daemon's first. Another daemon on this machine
    // may write /run/stel or /var/lib/stel; the running one here must win over any stale one.
    let (code, _, err) = status(&cwd, &[], None);
    assert_eq!(code, Some(0), "{err}");
    let others_live = STATUS_FILE_DEFAULTS
        .iter()
        .filter(|f| !f.starts_with("stel-data"))
        .any(|f| status(t.path(), &["--file", f], None).0 == Some(0));
    if !others_live {
        assert_eq!(err, reads(std::path::Path::new("stel-data/status.json")));
    }

    // The choice itself, over real files: running before stopped, a status file before
    // anything else; nothing there is an error.
    let junk = t.path().join("junk.json");
    std::fs::write(&junk, "not a status file").unwrap();
    let stopped = old.join("status.json");
    let missing = t.path().join("missing.json");
    for list in [
        vec![stopped.clone(), live_file.clone(), junk.clone()],
        vec![live_file.clone(), stopped.clone(), missing.clone()],
    ] {
        assert_eq!(pick_status_file(&list).unwrap(), live_file);
    }
    assert_eq!(
        pick_status_file(&[junk.clone(), stopped.clone(), missing.clone()]).unwrap(),
        stopped
    );
    assert_eq!(
        pick_status_file(&[missing.clone(), junk.clone()]).unwrap(),
        junk
    );
    let e = pick_status_file(std::slice::from_ref(&missing)).unwrap_err();
    assert!(e.contains("--data-dir"), "{e}");

    stel_testkit::sigterm(live.id());
    assert!(live.into_inner().wait().unwrap().success());
    // Stopped now: its final status is stale and says so.
    let (code, _, err) = status(&cwd, &["--data-dir", "stel-data"], None);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("stopped"), "{err}");
}

/// A duration typed without a unit is refused with exit 2, naming the flag and the units to
/// add: `--duration 10` was read as 10 ns and the daemon stopped at once, "stopped cleanly: 0
/// snapshots decoded", exit 0. The same parser serves every duration flag of stel-ingestd and
/// stel-emu (and `stel-emu int`).
#[test]
fn a_duration_without_a_unit_is_refused() {
    let runs: [(&str, &[&str], &str); 7] = [
        (
            env!("CARGO_BIN_EXE_stel-ingestd"),
            &["--demo", "--duration", "10"],
            "--duration",
        ),
        (
            env!("CARGO_BIN_EXE_stel-ingestd"),
            &["--demo", "--interval", "10"],
            "--interval",
        ),
        (
            env!("CARGO_BIN_EXE_stel-emu"),
            &["--file", "/dev/null", "--duration", "10"],
            "--duration",
        ),
        (
            env!("CARGO_BIN_EXE_stel-emu"),
            &["--interval", "10"],
            "--interval",
        ),
        (
            env!("CARGO_BIN_EXE_stel-emu"),
            &["--template-every", "10"],
            "--template-every",
        ),
        (
            env!("CARGO_BIN_EXE_stel-emu"),
            &["--reset-after", "10"],
            "--reset-after",
        ),
        (
            env!("CARGO_BIN_EXE_stel-emu"),
            &["int", "--duration", "10"],
            "--duration",
        ),
    ];
    for (bin, args, flag) in runs {
        let out = std::process::Command::new(bin).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(flag) && err.contains("`10` has no unit: give one (10s, 10ms, 10us"),
            "{args:?}: {err}"
        );
    }
}

/// A --data-dir that is a regular file is named as such: "cannot lock …/.stel-ingestd.lock:
/// File exists (os error 17)" said nothing of the mistake. With the history on it is an error
/// (exit 2, nothing started); with --no-history only the status file would go there, which is
/// best effort: a warning naming it, and the run goes on.
#[test]
fn a_data_dir_that_is_a_file_is_named_as_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, b"not a directory").unwrap();
    let want = format!("--data-dir {} is not a directory", file.display());
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
            .args([
                "--demo",
                "--no-ebpf",
                "--no-inspect",
                "--ports",
                "1",
                "--stats",
                "1",
                "--interval",
                "10ms",
                "--duration",
                "1s",
            ])
            .args(extra)
            .arg("--data-dir")
            .arg(&file)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.lines().any(|l| l == format!("stel-ingestd: {want}")),
        "{err}"
    );
    assert!(!err.contains("File exists"), "{err}");
    let out = run(&["--no-history"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.contains(" WARN ") && l.contains(&want)),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}

/// SIGTERM while the sender keeps transmitting (as a switch's ASIC never stops): the daemon
/// logs why it stops, takes what was received at the stop, flushes and exits 0 — it does not
/// wait for the socket to go quiet (it did, for the whole 5 s drain bound, at every restart;
/// measured by hand: 5.02 s before, 0.016 s after). The sender is still sending when the
/// daemon has exited: the stop did not depend on it pausing.
#[test]
fn sigterm_with_a_sender_still_transmitting_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("s.json");
    let status = dir.path().join("status.json");
    let mut emu = stel_testkit::KillOnDrop::new(
        std::process::Command::new(env!("CARGO_BIN_EXE_stel-emu"))
            .args(["--netlink-group", "18", "--ports", "8", "--stats", "4"])
            .args(["--interval", "100us", "--session"])
            .arg(&session)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !session.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(session.exists(), "stel-emu wrote no session file");
    let daemon = stel_testkit::KillOnDrop::new(
        std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
            .args(["--usersock-group", "18", "--no-history", "--no-inspect"])
            .args(["--json", "--session"])
            .arg(&session)
            .arg("--status-file")
            .arg(&status)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Until the daemon has decoded something: the sender's data is flowing through it.
    let decoded = || {
        let st: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&status).ok()?).ok()?;
        Some(Snapshot::from_json(&st["metrics"]).sum(Metric::DecodeRecords))
    };
    while decoded().unwrap_or(0) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(decoded().unwrap_or(0) > 0, "the daemon decoded nothing");
    stel_testkit::sigterm(daemon.id());
    let out = daemon.into_inner().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    let stopping: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("Stopping on SIGTERM: draining and flushing."))
        .collect();
    assert!(
        stopping.len() == 1 && stopping[0].contains(" INFO "),
        "{err}"
    );
    assert!(err.contains("stel-ingestd: stopped cleanly: "), "{err}");
    let fin: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert!(
        Snapshot::from_json(&fin["metrics"]).sum(Metric::DecodeRecords) > 0,
        "{fin}"
    );
    assert!(
        emu.try_wait().unwrap().is_none(),
        "the sender stopped: the test no longer shows a stop under load"
    );
}

/// A Redis that is not there (a wrong --redis URL: nothing listens on the port) is said on the
/// per-second status line and on the last lines, credentials masked: it was one WARN at start,
/// then a status line that never mentioned Redis and "stopped cleanly" (only
/// `stel_counters_db_connected 0` in `stel-ingestd status` showed it).
#[test]
fn a_redis_that_is_down_is_on_the_status_line_and_the_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let port = stel_testkit::free_port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args(["--demo", "--no-ebpf", "--no-inspect", "--no-history"])
        .args(["--ports", "2", "--stats", "2", "--interval", "1ms"])
        .args(["--duration", "3500ms", "--status-line", "on", "--redis"])
        .arg(format!("redis://stel:s3cret@127.0.0.1:{port}"))
        .arg("--status-file")
        .arg(dir.path().join("status.json"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    let down = format!("| REDIS DOWN (redis://stel:***@127.0.0.1:{port}: Connection refused");
    let ticks: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(" M counters/s ") && l.contains(&down))
        .collect();
    // Two per-second lines (retrying) and the final figures (not).
    assert!(ticks.len() >= 2, "{err}");
    assert!(ticks[0].ends_with(", retrying)"), "{err}");
    assert!(!ticks.last().unwrap().contains("retrying"), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("stel-ingestd: stopped: ")
            && last.contains("COUNTERS_DB was not written")
            && last.contains(&down),
        "{err}"
    );
}

/// `--input` of a capture without INT, INT not configured: no "int: 0 datagrams, …" summary (it
/// suggested INT was collected); the input and counter summaries are there.
#[test]
fn an_input_without_int_prints_no_int_summary() {
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("c.ipfix");
    let emu = std::process::Command::new(env!("CARGO_BIN_EXE_stel-emu"))
        .args([
            "--ports",
            "2",
            "--stats",
            "2",
            "--duration",
            "10ms",
            "--file",
        ])
        .arg(&capture)
        .output()
        .unwrap();
    assert!(
        emu.status.success(),
        "{}",
        String::from_utf8_lossy(&emu.stderr)
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args(["--no-inspect", "--filter", "learn", "--input"])
        .arg(&capture)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("stel-ingestd: input: 1 files"), "{err}");
    assert!(err.contains("stel-ingestd: stopped cleanly: "), "{err}");
    assert!(!err.contains("stel-ingestd: int: "), "{err}");
}

/// SIGHUP re-reads the INT EVC names; a daemon without INT says it has nothing to reload (an
/// operator who sent it for the configuration is told to restart) and keeps running: it was
/// silently ignored.
#[test]
fn sighup_without_int_says_there_is_nothing_to_reload_and_keeps_running() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = stel_testkit::KillOnDrop::new(
        std::process::Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
            .args([
                "--demo",
                "--duration",
                "600s",
                "--interval",
                "1ms",
                "--no-history",
            ])
            .args(["--no-inspect", "--status-file"])
            .arg(dir.path().join("status.json"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The log read as it comes, so the test knows when the SIGHUP was handled.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = daemon.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(l);
        }
    });
    let wait_for = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            let hit = l.contains(what);
            seen.push(l);
            if hit {
                return seen;
            }
        }
        panic!("no {what:?} in the log: {seen:#?}");
    };
    wait_for("counters/s");
    stel_testkit::kill(daemon.id(), "-HUP");
    let seen = wait_for("SIGHUP: nothing to reload");
    assert!(seen.last().unwrap().contains(" INFO "), "{seen:#?}");
    assert!(daemon.try_wait().unwrap().is_none(), "SIGHUP stopped it");
    stel_testkit::sigterm(daemon.id());
    let status = daemon.into_inner().wait().unwrap();
    log.join().unwrap();
    let rest: Vec<String> = rx.try_iter().collect();
    assert!(status.success(), "exit {status:?}: {rest:#?}");
    assert!(
        rest.iter()
            .any(|l| l.contains("stel-ingestd: stopped cleanly")),
        "{rest:#?}"
    );
}
