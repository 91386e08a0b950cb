//! Issue 12 ("real input, nothing lost"), through the real binaries: bulk datagrams larger than
//! 64 KiB, templates learned from the stream, netlink framing holes, the session registry, and
//! offline ingest of capture files. Socket tests need root (NETLINK_USERSOCK multicast) and fail
//! loudly without it; file tests run as `nobody` to show they need no privilege.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use stel_emu::{self as emu, EmuConfig, Emulator};

use arrow_array::{cast::AsArray, types::UInt64Type, Array};
use stel_ingest::{input::NetlinkRecorder, netlink, sys::netlink::NetlinkSocket};
use stel_store::{
    metrics::{Metric as M, Snapshot},
    sai::ObjectType,
};

const INGESTD: &str = env!("CARGO_BIN_EXE_stel-ingestd");
const EMU: &str = env!("CARGO_BIN_EXE_stel-emu");

/// A running stel-ingestd with a private data dir and status file.
struct Ingestd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Ingestd {
    /// Starts the daemon and waits until it is receiving (its first status file).
    fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(INGESTD)
            .args(args)
            .args(["--no-inspect", "--json", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--status-file")
            .arg(dir.path().join("status.json"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = dir.path().join("status.json");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !status.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(status.exists(), "the daemon wrote no status file");
        Self { child, dir }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// SIGTERM; returns the final counters (--json) and stderr.
    fn stop(self) -> (serde_json::Value, String, tempfile::TempDir) {
        stel_testkit::sigterm(self.child.id());
        let out = self.child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "exit {:?}: {err}", out.status);
        let st = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim())
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        (st, err, self.dir)
    }
}

/// `stel-ingestd --input …` run to its end as `nobody` (file input needs no privilege).
fn ingest_files(extra: &[&str], files: &[&Path]) -> (serde_json::Value, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    // nobody must be able to write the data dir and read the inputs.
    Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(dir.path())
        .status()
        .unwrap();
    for f in files {
        Command::new("chmod").arg("a+r").arg(f).status().unwrap();
        let mut d = f.parent();
        while let Some(p) = d {
            Command::new("chmod").arg("a+x").arg(p).status().unwrap();
            d = p.parent();
        }
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            INGESTD,
        ])
        .args(extra)
        .args(["--no-inspect", "--json", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--status-file")
        .arg(dir.path().join("status.json"))
        .arg("--input")
        .args(files)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    let st = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim())
        .unwrap_or_else(|e| panic!("{e}: {err}"));
    (st, err, dir)
}

/// Every published row of `profile`/`group`: timestamps and columns by name.
fn table(root: &Path, profile: &str, group: &str) -> (Vec<i64>, HashMap<String, Vec<u64>>) {
    let mut parts: Vec<(String, PathBuf, u64)> = stel_store::paths::published_parts(root)
        .into_iter()
        .filter(|(rel, ..)| rel.starts_with(&format!("profile={profile}/group={group}/")))
        .collect();
    parts.sort_by_key(|p| p.2);
    let mut ts = Vec::new();
    let mut cols: HashMap<String, Vec<u64>> = HashMap::new();
    for (_, path, _) in parts {
        let f = std::fs::File::open(path).unwrap();
        let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap();
        for b in r {
            let b = b.unwrap();
            for (i, field) in b.schema().fields().iter().enumerate() {
                let c = b.column(i);
                if field.name() == "ts" {
                    let t = c.as_primitive::<arrow_array::types::TimestampNanosecondType>();
                    ts.extend(t.values().iter().copied());
                } else {
                    let v = c.as_primitive::<UInt64Type>();
                    assert_eq!(v.null_count(), 0, "{}", field.name());
                    cols.entry(field.name().clone())
                        .or_default()
                        .extend(v.values().iter().copied());
                }
            }
        }
    }
    (ts, cols)
}

/// Asserts the table holds exactly the first `n` snapshots `cfg` generates.
fn assert_exact(root: &Path, profile: &str, group: &str, cfg: EmuConfig, n: u64) {
    let want = stel_ingest::decode::emulated(cfg, n).unwrap();
    let (ts, cols) = table(root, profile, group);
    assert_eq!(ts, want.ts, "timestamps of {profile}/{group}");
    let w = want.schema.width();
    assert_eq!(cols.len(), w, "columns of {profile}/{group}");
    let anonymous = profile.starts_with("anonymous");
    for (c, col) in want.schema.columns.iter().enumerate() {
        // In-band templates carry labels, not names.
        let name = if anonymous {
            format!("unknown_{}.{}", col.label, col.key.short_name())
        } else {
            col.wide_name()
        };
        let got = cols
            .get(&name)
            .unwrap_or_else(|| panic!("no column {name}: {:?}", cols.keys().collect::<Vec<_>>()));
        for (r, v) in got.iter().enumerate().take(n as usize) {
            assert_eq!(*v, want.values[r * w + c], "{name} row {r}");
        }
    }
}

fn session_file(emu: &Emulator, path: &Path) {
    let spec = emu.session_spec();
    let hex: String = emu
        .session_config()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let j = serde_json::json!({
        "profile": spec.profile, "group": spec.group, "domain": spec.domain,
        "object_names": spec.object_names.join(","),
        "object_ids": spec.object_ids.iter().map(u16::to_string).collect::<Vec<_>>().join(","),
        "session_config_hex": hex,
    });
    std::fs::write(path, j.to_string()).unwrap();
}

fn framed(ipfix: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    netlink::frame(&mut f, netlink::USERSOCK_MSG_TYPE, 0, ipfix);
    f
}

fn sender() -> NetlinkSocket {
    let tx = NetlinkSocket::usersock().expect("NETLINK_USERSOCK socket (run the tests as root)");
    tx.set_sndbuf(16 << 20).unwrap();
    tx
}

/// The registry's series in a status file (its `metrics` section).
fn metrics(st: &serde_json::Value) -> Snapshot {
    Snapshot::from_json(&st["metrics"])
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Item 1: one genl skb may carry several 61.5 KB IPFIX messages (the seed's kernel sample bulks
/// them with nla_append). Datagrams of 1, 2, 4 and 8 design messages (up to ~492 KB) through
/// both readers with default settings: nothing truncated, every value back exactly.
#[test]
fn bulk_datagrams_up_to_half_a_megabyte_arrive_whole() {
    for (group, reader) in [(25, "io-uring"), (26, "recvmsg")] {
        let mut emu = Emulator::new(EmuConfig::design()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let s = dir.path().join("s.json");
        session_file(&emu, &s);
        let d = Ingestd::start(&[
            "--usersock-group",
            &group.to_string(),
            "--reader",
            reader,
            "--session",
            s.to_str().unwrap(),
        ]);
        let tx = sender();
        let mut ipfix = Vec::new();
        emu.template_message(&mut ipfix);
        tx.send_multicast(group, &framed(&ipfix)).unwrap();
        let mut largest = 0;
        for k in [1, 2, 4, 8] {
            ipfix.clear();
            for _ in 0..k {
                emu.data_message(&mut ipfix);
            }
            let f = framed(&ipfix);
            largest = largest.max(f.len());
            tx.send_multicast(group, &f).unwrap();
        }
        assert!(largest > 480_000, "{largest}");
        let data = d.data();
        let (st, err, _keep) = d.stop();
        assert_eq!(
            metrics(&st).sum(M::ReaderTruncatedDatagrams),
            0,
            "{reader}: {err}"
        );
        assert_eq!(metrics(&st).sum(M::ReaderDatagrams), 5, "{reader}");
        let dec = metrics(&st);
        assert_eq!(dec.sum(M::DecodeRecords), emu.truth.records, "{reader}");
        assert_eq!(dec.sum(M::DecodeValues), emu.truth.samples, "{reader}");
        assert_eq!(dec.sum(M::DecodeSeqLostMessages), 0, "{reader}");
        assert_exact(
            &data,
            "stel_demo",
            "PORT",
            EmuConfig::design(),
            emu.truth.records,
        );
    }
}

/// Item 2: with no session, templates sent on the socket are learned by the filter itself
/// (kernel path, and the user-space fallback with --no-ebpf) before their data arrives, so data
/// sent right after its template is decoded; the table is keyed by domain and template.
#[test]
fn templates_on_the_socket_are_learned_before_their_data() {
    for (group, extra) in [(27, None), (28, Some("--no-ebpf"))] {
        let mut args = vec!["--usersock-group".to_string(), group.to_string()];
        args.extend(extra.map(String::from));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let d = Ingestd::start(&argv);
        let mut cfg = EmuConfig::design();
        cfg.ports = 8;
        cfg.domain = 7;
        cfg.template_id = 300;
        let mut emu = Emulator::new(cfg.clone()).unwrap();
        let tx = sender();
        let mut ipfix = Vec::new();
        // Data first (no template yet: dropped and counted), then the template and its data
        // right behind it.
        emu.data_message(&mut ipfix);
        tx.send_multicast(group, &framed(&ipfix)).unwrap();
        let early = emu.truth.records;
        ipfix.clear();
        emu.template_message(&mut ipfix);
        tx.send_multicast(group, &framed(&ipfix)).unwrap();
        for _ in 0..50 {
            ipfix.clear();
            emu.data_message(&mut ipfix);
            tx.send_multicast(group, &framed(&ipfix)).unwrap();
        }
        let data = d.data();
        let (st, err, _keep) = d.stop();
        assert_eq!(st["info"]["filter"]["policy"], "learn", "{err}");
        assert_eq!(
            metrics(&st).sum(M::FilterDroppedMessages),
            1,
            "{extra:?}: {}",
            st["metrics"]
        );
        assert!(
            metrics(&st).sum(M::FilterLearnedTemplates) >= 1,
            "{}",
            st["metrics"]
        );
        let dec = metrics(&st);
        assert_eq!(
            dec.sum(M::DecodeRecords),
            emu.truth.records - early,
            "{extra:?}: {err}"
        );
        let (ts, cols) = table(&data, "anonymous-d7-t300", "PORT");
        assert_eq!(ts.len() as u64, emu.truth.records - early);
        assert_eq!(cols.len(), 8 * 30);
    }
}

/// Item 2: `stel-emu --replay capture.ipfix` into a daemon without --session wrote nothing
/// before; now it is learned and decoded. And `--filter registered` with nothing registered
/// says, at stop and at WARN, that it filtered everything and how to fix it.
#[test]
fn replay_without_a_session_is_decoded_and_filtering_everything_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("cap.ipfix");
    let out = Command::new(EMU)
        .args([
            "--ports",
            "4",
            "--interval",
            "1ms",
            "--duration",
            "200ms",
            "--file",
        ])
        .arg(&cap)
        .output()
        .unwrap();
    assert!(out.status.success());
    let records = 200;
    let d = Ingestd::start(&["--usersock-group", "29"]);
    let r = Command::new(EMU)
        .args(["--netlink-group", "29", "--replay"])
        .arg(&cap)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{said}");
    assert!(said.contains("sent 21 datagrams"), "{said}");
    let (st, err, _k) = d.stop();
    assert_eq!(metrics(&st).sum(M::DecodeRecords), records, "{err}");
    assert!(
        err.contains("stopped cleanly: 200 snapshots decoded"),
        "{err}"
    );

    let d = Ingestd::start(&["--usersock-group", "30", "--filter", "registered"]);
    let r = Command::new(EMU)
        .args(["--netlink-group", "30", "--replay"])
        .arg(&cap)
        .output()
        .unwrap();
    assert!(r.status.success());
    let (st, err, _k) = d.stop();
    assert_eq!(metrics(&st).sum(M::DecodeRecords), 0);
    assert!(
        err.contains("NOTHING WAS DECODED: 20 messages filtered: template 256 not registered")
            && err.contains("pass --session FILE")
            && err.contains("--filter learn")
            && err.contains("WARN"),
        "{err}"
    );
}

fn queue_cfg(domain: u32, template_id: u16) -> EmuConfig {
    let mut c = EmuConfig::design();
    c.group = ObjectType::Queue;
    c.ports = 2;
    c.per_port = 2;
    c.stats = emu::default_stats(ObjectType::Queue, 3);
    c.domain = domain;
    c.template_id = template_id;
    c.snapshots_per_message = 5;
    c
}

fn ipfix_file(path: &Path, emus: &mut [&mut Emulator], messages: usize) {
    let mut f = Vec::new();
    for e in emus.iter_mut() {
        e.template_message(&mut f);
    }
    for _ in 0..messages {
        for e in emus.iter_mut() {
            e.data_message(&mut f);
        }
    }
    std::fs::write(path, f).unwrap();
}

/// Item 2: unrelated in-band templates (domain 7 / template 256 and domain 0 / template 257,
/// both QUEUE) land in two tables, never one directory with two schemas.
#[test]
fn anonymous_tables_are_keyed_by_domain_and_template() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("two.ipfix");
    let (mut a, mut b) = (
        Emulator::new(queue_cfg(7, 256)).unwrap(),
        Emulator::new(queue_cfg(0, 257)).unwrap(),
    );
    ipfix_file(&f, &mut [&mut a, &mut b], 4);
    let (st, err, out) = ingest_files(&[], &[&f]);
    assert_eq!(metrics(&st).sum(M::DecodeRecords), 40, "{err}");
    let root = out.path().join("data");
    assert_exact(&root, "anonymous-d7-t256", "QUEUE", queue_cfg(7, 256), 20);
    assert_exact(&root, "anonymous-d0-t257", "QUEUE", queue_cfg(0, 257), 20);
    assert!(table(&root, "anonymous", "QUEUE").0.is_empty());
}

/// Item 2: an inline template that redefines a registered session's template (its labels now
/// name QUEUE objects, the session named PORTs) does not keep the PORT names: it is counted,
/// logged, and its columns are named by label.
#[test]
fn an_inline_template_replacing_a_session_template_does_not_keep_its_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut port = EmuConfig::design();
    port.ports = 4;
    port.stats = emu::default_stats(ObjectType::Port, 3);
    let registered = Emulator::new(port).unwrap();
    let s = dir.path().join("s.json");
    session_file(&registered, &s);
    let f = dir.path().join("q.ipfix");
    let mut q = Emulator::new(queue_cfg(0, 256)).unwrap();
    ipfix_file(&f, &mut [&mut q], 2);
    let (st, err, out) = ingest_files(&["--session", s.to_str().unwrap()], &[&f]);
    let dec = metrics(&st);
    assert_eq!(dec.sum(M::DecodeSessionOverrides), 1, "{err}");
    assert!(err.contains("redefines a registered session"), "{err}");
    let (ts, cols) = table(&out.path().join("data"), "stel_demo", "PORT");
    assert_eq!(ts.len(), 10);
    assert!(
        cols.keys().all(|c| c.starts_with("unknown_")),
        "{:?}",
        cols.keys().collect::<Vec<_>>()
    );
}

fn bad_header(len: u32) -> Vec<u8> {
    let mut h = len.to_ne_bytes().to_vec();
    h.extend_from_slice(&netlink::USERSOCK_MSG_TYPE.to_ne_bytes());
    h.extend_from_slice(&[0; 14]);
    h
}

/// Item 3: a message whose nlmsg_len is 16–19 ends the datagram (the record after it never
/// reaches Parquet) and counts once, under `malformed`; fewer than 16 trailing bytes are
/// counted too. Read from a netlink recording, so the framing is exactly the socket's.
#[test]
fn netlink_framing_holes_are_malformed_and_end_the_datagram() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("holes.nl");
    let mut cfg = EmuConfig::design();
    cfg.ports = 2;
    cfg.snapshots_per_message = 1;
    let mut e = Emulator::new(cfg).unwrap();
    let mut rec = NetlinkRecorder::new(Vec::new()).unwrap();
    let mut ipfix = Vec::new();
    e.template_message(&mut ipfix);
    rec.record(&framed(&ipfix)).unwrap();
    let msg = |e: &mut Emulator| {
        let mut i = Vec::new();
        e.data_message(&mut i);
        framed(&i)
    };
    // [good][len 18][good]: only the first is decoded.
    let mut d1 = msg(&mut e);
    d1.extend(bad_header(18));
    d1.extend(msg(&mut e));
    rec.record(&d1).unwrap();
    // [good][7 stray bytes]: decoded, the tail counted.
    let mut d2 = msg(&mut e);
    d2.extend_from_slice(&[0xee; 7]);
    rec.record(&d2).unwrap();
    std::fs::write(&f, rec.finish().unwrap()).unwrap();
    let (st, err, _o) = ingest_files(&[], &[&f]);
    let dec = metrics(&st);
    assert_eq!(dec.sum(M::DecodeRecords), 2, "{err}");
    assert_eq!(
        dec.reason(M::DecodeMalformed, "netlink_length_too_small"),
        1,
        "{dec:?}"
    );
    assert_eq!(
        dec.reason(M::DecodeMalformed, "netlink_trailing_bytes"),
        1,
        "{dec:?}"
    );
    assert_eq!(dec.sum(M::DecodeMalformed), 2, "{dec:?}");
    assert!(
        err.contains("malformed 2"),
        "the status line shows them: {err}"
    );
    // The skipped message shows as a one-message gap of domain 0.
    let doms = st["info"]["decode_domains"].as_array().unwrap();
    assert_eq!(doms.len(), 1);
    assert_eq!(n(&doms[0]["lost_messages"]), 1);
    assert_eq!(n(&doms[0]["gap_events"]), 1);
}

/// Item 3: with the user-space filter (--no-ebpf), a domain that mixes a registered and an
/// unregistered template: each filtered message is counted once (the status line used to add
/// the filter's and the dispatcher's counts) and never as sequence loss. Per-domain figures
/// tell real gaps apart: one outage of 3 messages in domain 5.
#[test]
fn filtered_messages_count_once_and_not_as_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EmuConfig::design();
    cfg.ports = 2;
    cfg.domain = 5;
    cfg.snapshots_per_message = 1;
    let mut a = Emulator::new(cfg.clone()).unwrap();
    let s = dir.path().join("s.json");
    session_file(&a, &s);
    let d = Ingestd::start(&[
        "--usersock-group",
        "31",
        "--no-ebpf",
        "--filter",
        "registered",
        "--session",
        s.to_str().unwrap(),
    ]);
    // Template 400 in the same domain, same sequence numbering (one exporter).
    let tx = sender();
    let mut enc = stel_emu::Encoder::new(5, stel_ingest::ipfix::SeqMode::PerMessage);
    let mut ipfix = Vec::new();
    a.template_message(&mut ipfix);
    tx.send_multicast(31, &framed(&ipfix)).unwrap();
    let mut other = a.template().clone();
    other.template_id = 400;
    let mut sent_a = 0;
    for i in 0..30u32 {
        ipfix.clear();
        if i % 3 == 2 {
            enc.data_message(
                &mut ipfix,
                0,
                &other,
                std::iter::once((1u64, &[0u64; 60][..])),
            );
        } else {
            a.data_message(&mut ipfix);
            sent_a += 1;
        }
        // One exporter numbers both templates' messages: an outage of 3 before #10, and #22
        // and #25 lost on the way.
        let seq = 1 + i + if i >= 10 { 3 } else { 0 };
        ipfix[8..12].copy_from_slice(&seq.to_be_bytes());
        if i == 22 || i == 25 {
            continue;
        }
        tx.send_multicast(31, &framed(&ipfix)).unwrap();
    }
    let (st, err, _k) = d.stop();
    let dec = metrics(&st);
    let filtered = metrics(&st).sum(M::FilterDroppedMessages);
    assert_eq!(filtered, 10, "{}", st["metrics"]);
    assert_eq!(dec.sum(M::DecodeSeqFilteredMessages), 10);
    assert_eq!(dec.sum(M::DecodeSeqLostMessages), 3 + 1 + 1, "{dec:?}");
    assert_eq!(dec.sum(M::DecodeSeqGaps), 3);
    let doms = st["info"]["decode_domains"].as_array().unwrap();
    let d5 = doms.iter().find(|d| d["domain"] == 5).unwrap();
    assert_eq!(n(&d5["lost_messages"]), 5);
    assert_eq!(n(&d5["gap_events"]), 3);
    assert_eq!(n(&d5["largest_gap"]), 3);
    assert_eq!(n(&d5["filtered_messages"]), 10);
    assert_eq!(dec.sum(M::DecodeRecords), sent_a - 2, "{err}");
    let line = err
        .lines()
        .rev()
        .find(|l| l.contains(" | filtered "))
        .unwrap_or_else(|| panic!("no status line: {err}"));
    assert!(line.contains(" | filtered 10 "), "{line}");
}

/// The status file's JSON, once `f` holds (the daemon rewrites it every interval).
fn wait_status(
    path: &Path,
    what: &str,
    f: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = serde_json::Value::Null;
    while Instant::now() < deadline {
        if let Ok(t) = std::fs::read_to_string(path) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) {
                if f(&v) {
                    return v;
                }
                last = v;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not reached in 30 s; last status: {last}");
}

/// Item 4: a session whose second template does not fit in the filter map (a real E2BIG from
/// the kernel: `[filter] max_templates = 2`) is refused as a whole — no template of it stays
/// in the map, no decoder has it, STATE_DB is not acknowledged — and once there is room the
/// same session registers cleanly (nothing left over blocks or doubles it).
#[test]
fn a_filter_insert_failure_leaves_no_trace() {
    use redis::Commands;
    let r = stel_testkit::redis::TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("d.toml");
    std::fs::write(
        &cfg,
        "[filter]\nmax_templates = 2\n[status]\ninterval_ms = 100\n[state_db]\nresync_interval_ms = 0\n",
    )
    .unwrap();
    let mut a_cfg = EmuConfig::design();
    a_cfg.ports = 2;
    a_cfg.stats = emu::default_stats(ObjectType::Port, 2);
    let a = Emulator::new(a_cfg.clone()).unwrap();
    stel_ingest::sources::fixture::publish(r.url(), &a, &Default::default()).unwrap();
    let d = Ingestd::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--usersock-group",
        "32",
        "--redis",
        r.url(),
        "--no-history",
    ]);
    let status = d.dir.path().join("status.json");
    wait_status(&status, "session A", |s| {
        metrics(s).sum(M::SessionRegisteredSessions) == 1
            && metrics(s).sum(M::SessionAppliedRegistrations) == 1
    });
    // Session B: one snapshot split over templates 257 and 258 (same objects).
    let part = |tid: u16, stats: &[&str]| {
        let mut c = a_cfg.clone();
        c.template_id = tid;
        c.stats = stats
            .iter()
            .map(|s| ObjectType::Port.stat_by_name(s).unwrap())
            .collect();
        Emulator::new(c).unwrap()
    };
    let (b1, b2) = (part(257, &["IF_IN_ERRORS"]), part(258, &["IF_OUT_ERRORS"]));
    let mut config = b1.session_config();
    config.extend(b2.session_config());
    let spec = b1.session_spec();
    let key = "HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|b|PORT";
    let mut c = r.connect(6);
    let publish_b = |c: &mut redis::Connection, suffix: &str| {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("stream_status")
            .arg("enabled")
            .arg("object_names")
            .arg(
                spec.object_names
                    .iter()
                    .map(|o| format!("{o}{suffix}"))
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .arg("object_ids")
            .arg(
                spec.object_ids
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .arg("session_type")
            .arg("ipfix")
            .arg("session_config")
            .arg(config.clone())
            .query(c)
            .unwrap();
    };
    publish_b(&mut c, "");
    let s = wait_status(&status, "B rejected", |s| {
        metrics(s).sum(M::SessionRejectedRegistrations) == 1
    });
    assert_eq!(s["info"]["filter"]["kind"], "kernel", "{}", s["info"]);
    assert_eq!(metrics(&s).sum(M::SessionRegisteredSessions), 1);
    assert_eq!(
        metrics(&s).sum(M::FilterTemplates),
        1,
        "257 was rolled back: {}",
        s["metrics"]
    );
    assert_eq!(metrics(&s).sum(M::SessionFilterRollbacks), 1);
    assert_eq!(
        metrics(&s).sum(M::DecodeAppliedSessions),
        1,
        "no decoder has B"
    );
    let v: Option<String> = c.hget(key, "config_version").unwrap();
    assert_eq!(v, None, "a refused session is not acknowledged");
    // A goes: the map is empty again. B, published again, now fits.
    let _: () = c
        .del("HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|stel_demo|PORT")
        .unwrap();
    wait_status(&status, "A gone", |s| {
        metrics(s).sum(M::SessionRegisteredSessions) == 0 && metrics(s).sum(M::FilterTemplates) == 0
    });
    // The same session again (renamed objects, so the watcher sees a change to apply).
    publish_b(&mut c, "_again");
    let s = wait_status(&status, "B registered", |s| {
        metrics(s).sum(M::SessionRegisteredSessions) == 1
            && metrics(s).sum(M::SessionAppliedRegistrations) == 2
    });
    assert_eq!(metrics(&s).sum(M::FilterTemplates), 2);
    assert_eq!(metrics(&s).sum(M::SessionRejectedRegistrations), 1);
    // The acknowledgement is written to STATE_DB after the status counts the session applied.
    let v = stel_testkit::redis::TestRedis::wait_for(30, "config_version acknowledged", || {
        c.hget::<_, _, Option<String>>(key, "config_version")
            .unwrap()
    });
    assert_eq!(v, "1");
    let (_, err, _k) = d.stop();
    assert!(err.contains("at most 2 template IDs"), "{err}");
}

/// Item 4: a session file without profile, group or domain is an error naming the field.
#[test]
fn a_session_file_missing_a_field_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let e = Emulator::new(EmuConfig::design()).unwrap();
    let s = dir.path().join("s.json");
    session_file(&e, &s);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&s).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("domain");
    std::fs::write(&s, v.to_string()).unwrap();
    let f = dir.path().join("x.ipfix");
    std::fs::write(&f, b"").unwrap();
    let out = Command::new(INGESTD)
        .args(["--no-inspect", "--no-history", "--session"])
        .arg(&s)
        .arg("--input")
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("missing \"domain\""), "{err}");
}

/// Item 4: 2,000 sessions registered and unregistered, one per daemon step, while one session's
/// data flows (~2 s of it): every one of its snapshots decoded exactly, every registration applied and
/// acknowledged, the filter back to that one session's template, and the reader never waited
/// for a decoder (the longest receive gap is printed; timing is asserted in no cargo test).
#[test]
fn two_thousand_session_changes_while_data_flows() {
    const CHANGES: u64 = 2_000;
    const MESSAGES: usize = 10_000;
    use std::sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    };
    use stel_ingest::{
        config::{DaemonConfig, SourceKind},
        daemon::Daemon,
        decode::CounterBatch,
        pipeline::Sink,
    };
    #[derive(Debug, Default)]
    struct Rows(AtomicU64);
    impl Sink for Rows {
        fn name(&self) -> &'static str {
            "rows"
        }
        fn submit(&self, b: &Arc<CounterBatch>) {
            if b.schema.profile == "stel_demo" {
                self.0.fetch_add(b.rows() as u64, Ordering::Relaxed);
            }
        }
    }
    let group = 19;
    let mut cfg = DaemonConfig::default();
    cfg.source.kind = SourceKind::Usersock;
    cfg.source.usersock_group = group;
    cfg.pipeline.decoders = 2;
    cfg.status.file = Default::default();
    cfg.filter.policy = stel_ingest::filter::FilterPolicy::Registered;
    let mut d = Daemon::setup(cfg, None).expect("daemon setup (run the tests as root)");
    let rows = Arc::new(Rows::default());
    d.start(vec![Arc::clone(&rows) as Arc<dyn Sink>]);
    let mut c = EmuConfig::design();
    c.ports = 4;
    c.snapshots_per_message = 2;
    let mut emu = Emulator::new(c).unwrap();
    d.register(emu.session_spec(), emu.session_config())
        .unwrap();
    // The churned sessions: other domains, their own templates.
    let churn: Vec<Emulator> = (0..64u32)
        .map(|i| {
            let mut c = EmuConfig::design();
            c.ports = 1;
            c.stats = emu::default_stats(ObjectType::Port, 2);
            c.domain = 100 + i;
            c.template_id = 1000 + i as u16;
            c.profile = format!("churn{i}");
            Emulator::new(c).unwrap()
        })
        .collect();
    let done = AtomicBool::new(false);
    let (sent, ops) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let tx = sender();
            let mut ipfix = Vec::new();
            emu.template_message(&mut ipfix);
            tx.send_multicast(group, &framed(&ipfix)).unwrap();
            // A fixed amount of data (~2 s at one message per 200 µs), not a fixed time: the
            // assertions below are on counts, whatever the speed of the box.
            for _ in 0..MESSAGES {
                ipfix.clear();
                emu.data_message(&mut ipfix);
                tx.send_multicast(group, &framed(&ipfix)).unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
            done.store(true, Ordering::Relaxed);
            emu.truth.records
        });
        let mut ops = 0u64;
        let mut registered = vec![false; churn.len()];
        // One change per step of the daemon while data flows, until both the changes and the
        // data are done.
        while !(done.load(Ordering::Relaxed) && ops >= CHANGES) {
            d.step().unwrap();
            if ops < CHANGES {
                let i = (ops as usize / 2) % churn.len();
                let e = &churn[i];
                if registered[i] {
                    assert!(d.unregister(&e.cfg.profile, "PORT"));
                } else {
                    d.register(e.session_spec(), e.session_config()).unwrap();
                }
                registered[i] = !registered[i];
                ops += 1;
            }
        }
        for (i, r) in registered.iter().enumerate() {
            if *r {
                assert!(d.unregister(&churn[i].cfg.profile, "PORT"));
                ops += 1;
            }
        }
        (h.join().unwrap(), ops)
    });
    let st = d.finish(None, Duration::from_secs(5));
    eprintln!(
        "churn: {ops} session changes while data flowed; longest receive gap {} us ({} over 10 ms)",
        st.receive_gap_max_us, st.receive_gaps_over_10ms
    );
    assert_eq!(rows.0.load(Ordering::Relaxed), sent);
    assert_eq!(st.pipeline.decode.records, sent);
    assert_eq!(st.kernel_drops, 0);
    assert_eq!(
        ops, CHANGES,
        "an even number of changes leaves every churn session unregistered"
    );
    let reg = st.session_registry;
    assert_eq!(reg.registrations_total, 1 + ops / 2);
    assert_eq!(reg.unregistrations_total, ops / 2);
    assert_eq!(reg.applied_total, reg.registrations_total);
    assert_eq!((reg.sessions, reg.applying, reg.rejected_total), (1, 0, 0));
    assert_eq!(st.filter.templates, 1);
    assert_eq!(
        st.pipeline.decode.sessions_registered,
        reg.registrations_total
    );
}

/// An IPFIX capture of what the emulator sends for `cfg` (templates + `messages` data messages)
/// and the snapshots in it.
fn capture(cfg: &EmuConfig, messages: usize) -> (Vec<Vec<u8>>, u64) {
    let mut e = Emulator::new(cfg.clone()).unwrap();
    let mut out = Vec::new();
    let mut m = Vec::new();
    e.template_message(&mut m);
    out.push(m);
    for _ in 0..messages {
        let mut m = Vec::new();
        e.data_message(&mut m);
        out.push(m);
    }
    (out, e.truth.records)
}

/// Ethernet + IPv4 + UDP frames of `payload`, fragmented at a 1500-byte MTU.
fn udp_frames(payload: &[u8], id: u16) -> Vec<Vec<u8>> {
    let mut udp = Vec::new();
    udp.extend_from_slice(&50000u16.to_be_bytes());
    udp.extend_from_slice(&4739u16.to_be_bytes());
    udp.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    udp.chunks(1480)
        .enumerate()
        .map(|(k, chunk)| {
            let more = (k + 1) * 1480 < udp.len();
            let mut e = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
            e.extend_from_slice(&[0x45, 0]);
            e.extend_from_slice(&((20 + chunk.len()) as u16).to_be_bytes());
            e.extend_from_slice(&id.to_be_bytes());
            let ff = ((k * 1480 / 8) as u16) | if more { 0x2000 } else { 0 };
            e.extend_from_slice(&ff.to_be_bytes());
            e.extend_from_slice(&[64, 17, 0, 0, 192, 0, 2, 1, 192, 0, 2, 2]);
            e.extend_from_slice(chunk);
            e
        })
        .collect()
}

/// Item 5: the same stream as an IPFIX file, a pcap of UDP export (fragmented), a pcapng
/// nlmon capture and a netlink recording made by `stel-emu --record`: `stel-ingestd --input`,
/// as `nobody`, writes exactly what was sent; damage in a capture is counted, never fatal.
#[test]
fn captures_of_every_kind_ingest_exactly_without_root() {
    use pcap_file::{
        pcap::{PcapHeader, PcapPacket, PcapWriter},
        pcapng::{
            blocks::{
                enhanced_packet::EnhancedPacketBlock,
                interface_description::InterfaceDescriptionBlock,
            },
            PcapNgWriter,
        },
        DataLink,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EmuConfig::design();
    cfg.ports = 8;
    let (msgs, records) = capture(&cfg, 12);
    let e = Emulator::new(cfg.clone()).unwrap();
    let s = dir.path().join("s.json");
    session_file(&e, &s);
    let session = ["--session", s.to_str().unwrap()];

    // 1. IPFIX file.
    let ipfix = dir.path().join("a.ipfix");
    std::fs::write(&ipfix, msgs.concat()).unwrap();
    let (st, err, out) = ingest_files(&session, &[&ipfix]);
    assert_eq!(metrics(&st).sum(M::DecodeRecords), records, "{err}");
    assert_exact(
        &out.path().join("data"),
        "stel_demo",
        "PORT",
        cfg.clone(),
        records,
    );

    // 2. pcap, UDP on port 4739, 1500-byte MTU, and a record cut by the end of the file.
    let pcap = dir.path().join("a.pcap");
    let header = PcapHeader {
        snaplen: 262144,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
    for (i, m) in msgs.iter().enumerate() {
        for f in udp_frames(m, i as u16) {
            let len = f.len() as u32;
            w.write_packet(&PcapPacket {
                timestamp: Duration::ZERO,
                orig_len: len,
                data: f.into(),
            })
            .unwrap();
        }
    }
    let mut bytes = w.into_writer();
    bytes.extend_from_slice(&[0u8; 16 + 5]); // a packet header promising more than is there
    let l = bytes.len();
    // incl_len of that record (the writer's default byte order is big-endian).
    bytes[l - 13..l - 9].copy_from_slice(&100u32.to_be_bytes());
    std::fs::write(&pcap, &bytes).unwrap();
    let (st, err, out) = ingest_files(&session, &[&pcap]);
    let dec = metrics(&st);
    assert_eq!(dec.sum(M::DecodeRecords), records, "{err}");
    assert_eq!(
        dec.reason(M::DecodeMalformed, "input_record_unreadable"),
        1,
        "{dec:?}"
    );
    // Counted once, under both names (the input's own series and the decoders' reason), and
    // by no other reason.
    assert_eq!(dec.sum(M::InputUnreadableRecords), 1, "{dec:?}");
    assert_eq!(dec.sum(M::DecodeMalformed), 1, "{dec:?}");
    assert_eq!(
        metrics(&st).sum(M::InputReassembledDatagrams),
        msgs.len() as u64,
        "{}",
        st["metrics"]
    );
    assert_exact(
        &out.path().join("data"),
        "stel_demo",
        "PORT",
        cfg.clone(),
        records,
    );

    // 3. pcapng of an nlmon capture (LINKTYPE_NETLINK).
    let ng = dir.path().join("a.pcapng");
    let mut w = PcapNgWriter::new(Vec::new()).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: DataLink::NETLINK,
        snaplen: 0,
        options: vec![],
    })
    .unwrap();
    for m in &msgs {
        let mut p = vec![0, 4];
        p.extend_from_slice(&824u16.to_be_bytes());
        p.extend_from_slice(&[0; 10]);
        p.extend_from_slice(&2u16.to_be_bytes());
        p.extend(framed(m));
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::ZERO,
            original_len: p.len() as u32,
            data: p.into(),
            options: vec![],
        })
        .unwrap();
    }
    std::fs::write(&ng, w.into_inner()).unwrap();
    let (st, err, out) = ingest_files(&session, &[&ng]);
    assert_eq!(metrics(&st).sum(M::DecodeRecords), records, "{err}");
    assert_exact(
        &out.path().join("data"),
        "stel_demo",
        "PORT",
        cfg.clone(),
        records,
    );

    // 4. What stel-emu sent, recorded datagram by datagram (root: it sends over netlink).
    let rec = dir.path().join("sent.nl");
    let truth = dir.path().join("truth.json");
    let o = Command::new(EMU)
        .args([
            "--ports",
            "8",
            "--netlink-group",
            "18",
            "--duration",
            "2ms",
            "--record",
        ])
        .arg(&rec)
        .arg("--truth")
        .arg(&truth)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    let records = n(&t["records"]);
    assert!(records > 100, "{t}");
    let (st, err, out) = ingest_files(&session, &[&rec]);
    assert_eq!(metrics(&st).sum(M::DecodeRecords), records, "{err}");
    assert_exact(&out.path().join("data"), "stel_demo", "PORT", cfg, records);
}

/// Item 5: `stel-emu --replay` sends a file's bad bytes too (a fault injector must) and says
/// so; the daemon counts them.
#[test]
fn replay_sends_bad_messages_and_says_what_it_sent() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EmuConfig::design();
    cfg.ports = 2;
    let (msgs, records) = capture(&cfg, 3);
    let f = dir.path().join("bad.ipfix");
    let mut bytes = msgs.concat();
    let mut v9 = vec![0u8; 20]; // a NetFlow v9-looking header: not IPFIX
    v9[1] = 9;
    v9[3] = 20;
    bytes.extend_from_slice(&v9);
    std::fs::write(&f, bytes).unwrap();
    let d = Ingestd::start(&["--usersock-group", "17"]);
    let r = Command::new(EMU)
        .args(["--netlink-group", "17", "--replay"])
        .arg(&f)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{said}");
    assert!(
        said.contains("sent 5 datagrams") && said.contains("1 of them not a well-formed IPFIX"),
        "{said}"
    );
    let (st, err, _k) = d.stop();
    let dec = metrics(&st);
    assert_eq!(dec.sum(M::DecodeRecords), records, "{err}");
    assert_eq!(dec.reason(M::DecodeMalformed, "bad_version"), 1, "{dec:?}");
}
