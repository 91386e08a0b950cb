//! `stel-bench fleet`: many switches, one lake, fleet questions on a distributed engine.
//!
//! ```text
//!  per switch (one real stel-ingestd each, a few at a time, each with its own data dir):
//!    this process = the switch: Emulator(s) ─ NETLINK_USERSOCK multicast ─▶ stel-ingestd
//!       (PORT, some also QUEUE or PG)            reader → decoder → Parquet → uploader
//!                                                                   │ s3://lake/fleet/switch=<name>/…
//!                                                                   ▼
//!                                       moto (local S3) ◀── Sail, local-cluster (driver + workers)
//!                                                                   ▲ Spark Connect (gRPC)
//!  stel-query --engine spark --remote sc://… top --by bursts / --by drops --per switch
//!  stel-query (local engine, same s3:// lake)  ── answers compared row by row
//! ```
//!
//! The fleet is reduced per switch so that a hundred switches fit on two cores: a few ports at
//! the 10 µs design interval for a few tens of ms of switch time, in two legs three hours apart
//! (so a one-hour window prunes whole hours of files), mixed templates (4–16 ports, 6–13 PORT
//! stats; every second switch also a QUEUE or PG session; every fourth switch restarted with a
//! changed template, so its files carry two schemas) and per-switch load (line rate, queue
//! size), so answers differ per switch.
//!
//! Why a bench and not `cargo test`: a hundred daemon runs, Sail and moto take a minute on two
//! cores; the test suite runs the same path with six switches (`query/tests/fleet.rs`).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};
use stel_emu::{default_stats, EmuConfig, Emulator, Pattern};

use serde_json::{json, Value};
use stel_ingest::{netlink, sys::netlink::NetlinkSocket};
use stel_store::{
    metrics::{Metric, Snapshot},
    sai::ObjectType,
};

/// 2024-05-01T12:00:00Z: the recent leg's hour (switch time; fixed, so runs are comparable).
pub const T_RECENT: u64 = 1_714_564_800_000_000_000;
/// The old leg: three hours earlier.
pub const T_OLD: u64 = T_RECENT - 3 * 3_600_000_000_000;

/// The lake the daemons upload to.
pub const LAKE: &str = "s3://lake/fleet";

/// How big a fleet and how much data per switch.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub switches: usize,
    /// Snapshots of the recent leg of switch 0 (switch i has `recent + i * recent_step`).
    pub recent: u64,
    pub recent_step: u64,
    /// Snapshots of the old leg.
    pub old: u64,
    /// Daemons running at once (each on its own NETLINK_USERSOCK group).
    pub concurrency: usize,
    /// First usersock group used (groups `first_group..first_group + concurrency`).
    pub first_group: u32,
}

impl FleetConfig {
    /// 100 switches, under a minute on two cores once built.
    pub fn quick() -> Self {
        Self {
            switches: 100,
            recent: 1_000,
            recent_step: 10,
            old: 300,
            concurrency: 4,
            first_group: 24,
        }
    }

    /// 100 switches, ten times the data per switch.
    pub fn full() -> Self {
        Self {
            recent: 10_000,
            recent_step: 100,
            old: 3_000,
            ..Self::quick()
        }
    }

    /// A few switches for the test suite.
    pub fn for_test(switches: usize) -> Self {
        Self {
            switches,
            recent: 600,
            recent_step: 50,
            old: 200,
            concurrency: 2,
            first_group: 20,
        }
    }
}

/// One emulated session of a daemon run.
#[derive(Debug, Clone)]
pub struct SessionPlan {
    pub cfg: EmuConfig,
}

/// One daemon run of a switch: its sessions and the legs of switch time they stream.
#[derive(Debug, Clone)]
pub struct Run {
    pub sessions: Vec<SessionPlan>,
    /// (first timestamp, snapshots) per leg.
    pub legs: Vec<(u64, u64)>,
}

/// A switch of the fleet.
#[derive(Debug, Clone)]
pub struct SwitchPlan {
    pub name: String,
    pub runs: Vec<Run>,
}

fn emu_cfg(
    group: ObjectType,
    ports: usize,
    per_port: usize,
    stats: usize,
    domain: u32,
    template_id: u16,
) -> EmuConfig {
    let mut c = EmuConfig::design();
    c.group = group;
    c.ports = ports;
    c.per_port = per_port;
    c.stats = default_stats(group, stats);
    c.domain = domain;
    c.template_id = template_id;
    c.profile = "fleet".into();
    c.pattern = Pattern::Microburst;
    c
}

/// The fleet: distinct names, mixed templates and loads (deterministic in the index).
pub fn plan(cfg: &FleetConfig) -> Vec<SwitchPlan> {
    (0..cfg.switches)
        .map(|i| {
            let kind = i % 4;
            let name = match i % 3 {
                0 => format!("leaf-{i:03}"),
                1 => format!("spine-{i:03}.dc1"),
                _ => format!("tor{i:03}"),
            };
            let ports = [8, 16, 4, 8][kind];
            let stats = [6, 10, 13, 6][kind];
            let mut port = emu_cfg(ObjectType::Port, ports, 1, stats, 0, 256);
            // Line rate seen by the load model: bursts at 1.3 × this; the query's --speed is
            // 100G, so slower switches burst less (or not at all above 90 %).
            port.speed_gbps = [100.0, 80.0, 120.0, 60.0][i % 4] + (i % 5) as f64;
            // Small queues drop during bursts; a different size per switch.
            port.queue_bytes = 20_000 + 7_000 * (i as u64 % 11);
            let recent = cfg.recent + cfg.recent_step * i as u64;
            let start_recent = T_RECENT + (i as u64 % 50) * 60_000_000_000;
            let legs = vec![
                (T_OLD + i as u64 * 1_000_000_000, cfg.old),
                (start_recent, recent),
            ];
            let mut sessions = vec![SessionPlan { cfg: port.clone() }];
            match kind {
                1 => sessions.push(SessionPlan {
                    cfg: emu_cfg(ObjectType::Queue, 4, 8, 5, 1, 300),
                }),
                2 => sessions.push(SessionPlan {
                    cfg: emu_cfg(ObjectType::IngressPriorityGroup, 4, 8, 4, 2, 301),
                }),
                _ => {}
            }
            let mut runs = vec![Run {
                sessions,
                legs: legs.clone(),
            }];
            if kind == 3 {
                // The template changed: the first run streams the old leg with 6 stats, a
                // restart streams the recent leg with 10 (a new template id).
                runs[0].legs.truncate(1);
                let mut changed = port;
                changed.stats = default_stats(ObjectType::Port, 10);
                changed.template_id = 257;
                runs.push(Run {
                    sessions: vec![SessionPlan { cfg: changed }],
                    legs: legs[1..].to_vec(),
                });
            }
            SwitchPlan { name, runs }
        })
        .collect()
}

impl SwitchPlan {
    /// Per run, for its session of `group`: (stats in the template, snapshots sent), counting
    /// whole messages as the emulator sends them.
    pub fn rows(&self, group: ObjectType) -> Vec<(usize, u64)> {
        let mut out = Vec::new();
        for run in &self.runs {
            for s in run.sessions.iter().filter(|s| s.cfg.group == group) {
                let per = Emulator::new(s.cfg.clone())
                    .map(|e| e.snapshots_per_message() as u64)
                    .unwrap_or(1)
                    .max(1);
                let n: u64 = run.legs.iter().map(|(_, n)| n.div_ceil(per) * per).sum();
                out.push((s.cfg.stats.len(), n));
            }
        }
        out
    }
}

/// What generating the fleet did.
#[derive(Debug, Clone, Default)]
pub struct Generated {
    pub switches: usize,
    pub daemon_runs: usize,
    /// Raw files and rollup tier files uploaded.
    pub files_uploaded: u64,
    /// Of those, raw files (what the lake's raw view reads).
    pub raw_files_uploaded: u64,
    pub bytes_uploaded: u64,
    pub samples: u64,
    pub lost: u64,
    pub elapsed_s: f64,
}

/// The session file `stel-emu --session` writes.
fn session_json(emu: &Emulator) -> Value {
    stel_ingest::config::SessionFile::to_json(&emu.session_spec(), &emu.session_config())
}

/// The registry's series of a status file (its `metrics` section).
fn registry(st: &Value) -> Snapshot {
    Snapshot::from_json(&st["metrics"])
}

/// The registry's series of a `metrics` section itself.
fn registry_of(metrics: &Value) -> Snapshot {
    Snapshot::from_json(metrics)
}

/// A registry series from a status file's `metrics` section: unlabelled metrics are a number,
/// labelled ones a list of `{labels, value}` (summed); absent (unregistered) counts as 0.
fn metric(section: &Value, name: &str) -> u64 {
    match &section[name] {
        Value::Number(n) => n.as_u64().unwrap_or(0),
        Value::Array(a) => a.iter().map(|x| x["value"].as_u64().unwrap_or(0)).sum(),
        _ => 0,
    }
}

fn read_json(path: &Path) -> Option<Value> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
}

/// Runs one daemon for `run` of switch `name` on usersock `group`; returns its final counters.
fn daemon_run(
    daemon: &Path,
    work: &Path,
    name: &str,
    run: &Run,
    k: usize,
    group: u32,
    env: &[(String, String)],
) -> Result<Value, String> {
    let dir = work.join(name.replace(['/', ' '], "_"));
    let data = dir.join("data");
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    let status = dir.join(format!("status-{k}.json"));
    let _ = std::fs::remove_file(&status);
    let mut emus = Vec::new();
    let mut args: Vec<String> = vec![
        "--usersock-group".into(),
        group.to_string(),
        "--no-ebpf".into(),
        "--no-inspect".into(),
        "--json".into(),
        "--decoders".into(),
        "1".into(),
        "--rcvbuf".into(),
        (64 << 20).to_string(),
    ];
    for (j, s) in run.sessions.iter().enumerate() {
        let emu = Emulator::new(s.cfg.clone()).map_err(|e| format!("{name}: {e}"))?;
        let p = dir.join(format!("session-{k}-{j}.json"));
        std::fs::write(&p, session_json(&emu).to_string()).map_err(|e| e.to_string())?;
        args.push("--session".into());
        args.push(p.display().to_string());
        emus.push(emu);
    }
    let cfg = dir.join(format!("stel-ingestd-{k}.toml"));
    // The raw-lake questions: the daemons write no tiers (the rollup question below has a lake
    // of its own, a day of the 1 min tier per switch).
    std::fs::write(
        &cfg,
        format!(
            "[parquet]\ndir = {data:?}\nswitch_name = {name:?}\n[status]\nfile = {status:?}\ninterval_ms = 100\n[upload]\nto = {LAKE:?}\nswitch = {name:?}\nscan_interval_ms = 200\nshutdown_timeout_ms = 30000\n[rollup]\nenabled = false\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut c = Command::new(daemon);
    c.arg("--config").arg(&cfg).args(&args);
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", daemon.display()))?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The status file appears once the socket has joined the group.
    while !status.exists() {
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            let o = child.wait_with_output().map_err(|e| e.to_string())?;
            return Err(format!(
                "{name}: the daemon did not start: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let sock = NetlinkSocket::usersock().map_err(|e| format!("{e} (the fleet needs root)"))?;
    let _ = sock.set_sndbuf(8 << 20);
    let (mut ipfix, mut frame) = (Vec::new(), Vec::new());
    let mut sent = 0u64;
    let mut seq = 0u32;
    let mut send = |ipfix: &[u8], frame: &mut Vec<u8>| -> Result<(), String> {
        frame.clear();
        netlink::frame(frame, netlink::USERSOCK_MSG_TYPE, seq, ipfix);
        seq = seq.wrapping_add(1);
        sent += 1;
        sock.send_multicast(group, frame).map_err(|e| e.to_string())
    };
    for (start, n) in &run.legs {
        for emu in emus.iter_mut() {
            // Switch time jumps to the leg's start; sequence numbers and counters carry on.
            emu.cfg.start_ns = start - emu.snapshots() * emu.cfg.interval_ns;
            ipfix.clear();
            emu.template_message(&mut ipfix);
            send(&ipfix, &mut frame)?;
            let mut done = 0;
            while done < *n {
                ipfix.clear();
                done += emu.data_message(&mut ipfix) as u64;
                send(&ipfix, &mut frame)?;
            }
        }
    }
    // Everything sent is in the daemon's socket or read already: wait until it was read.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = read_json(&status)
            .map(|s| registry(&s).sum(Metric::ReaderDatagrams))
            .unwrap_or(0);
        if got >= sent {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{name}: the daemon read {got} of {sent} datagrams in 60 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let o = child.wait_with_output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "{name}: stel-ingestd failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let fin: Value =
        serde_json::from_slice(&o.stdout).map_err(|e| format!("{name}: final counters: {e}"))?;
    let samples: u64 = emus.iter().map(|e| e.truth.samples).sum();
    Ok(json!({"status": fin, "samples": samples}))
}

/// Streams every switch's runs through real daemons uploading to [`LAKE`] (S3 settings in
/// `env`), `cfg.concurrency` at a time, and checks that every published file was uploaded and
/// nothing was lost.
///
/// # Errors
/// A daemon that fails, loses data or does not upload everything.
pub fn generate(
    cfg: &FleetConfig,
    daemon: &Path,
    work: &Path,
    env: &[(String, String)],
) -> Result<Generated, String> {
    let t = Instant::now();
    let fleet = plan(cfg);
    // Runs of one switch stay in order (the template change), on one worker.
    let next = AtomicUsize::new(0);
    let out = Mutex::new(Generated {
        switches: fleet.len(),
        ..Generated::default()
    });
    let err: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|sc| {
        for w in 0..cfg.concurrency.max(1) {
            let (fleet, next, out, err) = (&fleet, &next, &out, &err);
            let group = cfg.first_group + w as u32;
            sc.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(sw) = fleet.get(i) else { break };
                if err.lock().map(|e| e.is_some()).unwrap_or(true) {
                    break;
                }
                for (k, run) in sw.runs.iter().enumerate() {
                    match daemon_run(daemon, work, &sw.name, run, k, group, env).and_then(|v| {
                        let st = &v["status"];
                        let (up, pq) = (&st["metrics"], &st["metrics"]);
                        let r = registry(st);
                        let lost = r.sum(Metric::DecodeSeqLostMessages)
                            + r.sum(Metric::ReaderKernelDroppedDatagrams);
                        // The status file's sink sections are their registry series.
                        let files_uploaded = metric(up, "stel_upload_files_total");
                        if files_uploaded != metric(pq, "stel_sink_published_files_total")
                            || metric(up, "stel_upload_failures_total") != 0
                            || metric(up, "stel_upload_pending_files") != 0
                        {
                            return Err(format!(
                                "{}: not everything was uploaded: {up}\n{pq}",
                                sw.name
                            ));
                        }
                        Ok((v["samples"].as_u64().unwrap_or(0), lost, up.clone()))
                    }) {
                        Ok((samples, lost, up)) => {
                            if let Ok(mut o) = out.lock() {
                                o.daemon_runs += 1;
                                o.samples += samples;
                                o.lost += lost;
                                o.files_uploaded += metric(&up, "stel_upload_files_total");
                                o.raw_files_uploaded += metric(&up, "stel_upload_files_total")
                                    - stel_store::rollup::accounting::files(&registry_of(&up));
                                o.bytes_uploaded += metric(&up, "stel_upload_bytes_total");
                            }
                        }
                        Err(e) => {
                            if let Ok(mut g) = err.lock() {
                                g.get_or_insert(e);
                            }
                            return;
                        }
                    }
                }
                if (i + 1) % 10 == 0 {
                    eprintln!(
                        "fleet: {} switches streamed and uploaded ({:.1} s)",
                        i + 1,
                        t.elapsed().as_secs_f64()
                    );
                }
            });
        }
    });
    if let Some(e) = err.into_inner().map_err(|e| e.to_string())? {
        return Err(e);
    }
    let mut g = out.into_inner().map_err(|e| e.to_string())?;
    g.elapsed_s = t.elapsed().as_secs_f64();
    Ok(g)
}

/// The daemons' own data dirs as a local lake under `dir` (`switch=<name>/…`, hard links: the
/// very files the uploader copied, byte for byte), so the local engine answers without the S3
/// round trips. Returns the number of files.
///
/// # Errors
/// A file that cannot be linked.
pub fn local_lake(cfg: &FleetConfig, work: &Path, dir: &Path) -> Result<usize, String> {
    let mut n = 0;
    for sw in plan(cfg) {
        let data = work.join(sw.name.replace(['/', ' '], "_")).join("data");
        n += link_published(&data, &sw.name, dir)?;
    }
    Ok(n)
}

/// The rollup lake: 100 switches × 24 h of the 1 min tier.
pub const ROLLUP_LAKE: &str = "s3://lake/rollup";

/// Per switch, 24 h (ending at [`T_RECENT`]) of synthetic counters of 8 ports every 5 s —
/// loads differing per switch and port, each port at 95 % for 5–60 s of one minute in 17 —
/// through the
/// real rollup writer (1 min tier) into a data dir of its own under `data/<name>/`, the last
/// minute also as raw files (so the local engine has a session); then every published file
/// linked into `lake` at the key the uploader gives it ([`stel_store::paths::lake_key`]: raw
/// under `switch=<name>/`, the tier under `_tiers/tier=1m/switch=<name>/`). Returns the files.
///
/// # Errors
/// A writer failing, a file that cannot be linked.
pub fn rollup_lake(switches: usize, data: &Path, lake: &Path) -> Result<usize, String> {
    use std::sync::Arc;
    use stel_store::{
        parquet::{ParquetSink, ParquetSinkConfig},
        rollup::{RollupConfig, RollupWriter, TierConfig},
        sai::StatKey,
        schema::{CounterColumn, SessionSchema},
        BudgetHandle, CounterBatch,
    };
    const STEP: i64 = 5_000_000_000;
    let stats = [
        "IF_IN_OCTETS",
        "IF_IN_UCAST_PKTS",
        "IF_OUT_OCTETS",
        "IF_OUT_UCAST_PKTS",
    ];
    let end = T_RECENT as i64;
    let start = end - 86_400_000_000_000;
    let mut files = 0;
    for i in 0..switches {
        let name = format!("sw{i:03}");
        let root = data.join(&name);
        let mut columns = Vec::new();
        for p in 0..8u16 {
            for st in stats {
                columns.push(CounterColumn {
                    label: p + 1,
                    object: format!("Ethernet{}", 4 * p),
                    key: StatKey {
                        object_type: 1,
                        stat_id: ObjectType::Port.stat_by_name(st).ok_or(st)?.id,
                    },
                });
            }
        }
        let schema = Arc::new(SessionSchema::one_template(
            "fleet".into(),
            "PORT".into(),
            columns,
        ));
        let cfg = RollupConfig {
            tiers: vec![TierConfig::new("1m")],
            ..RollupConfig::for_test()
        };
        let mut w = RollupWriter::new(&cfg, root.clone(), name.clone(), BudgetHandle::default())
            .map_err(|e| e.to_string())?;
        let raw = ParquetSink::start(
            ParquetSinkConfig {
                switch_name: Some(name.clone()),
                flush_interval_ms: 3_600_000,
                ..ParquetSinkConfig::for_test(&root)
            },
            None,
        )
        .map_err(|e| e.to_string())?;
        let line = 100e9 / 8.0 * STEP as f64 / 1e9;
        let mut state = vec![0u64; 32];
        let mut t = start;
        while t < end {
            let rows = 2048.min(((end - t) / STEP) as usize);
            let mut ts = Vec::with_capacity(rows);
            let mut values = Vec::with_capacity(rows * 32);
            for r in 0..rows {
                let tt = t + r as i64 * STEP;
                ts.push(tt);
                let minute = tt / 60_000_000_000;
                for p in 0..8usize {
                    // Hot for the first 1–12 of the minute's twelve 5 s steps (per switch
                    // and port), so burst times differ and the ranking is not all ties.
                    let step = (tt / STEP).rem_euclid(12) as usize;
                    let hot =
                        (minute + (i * 3 + p * 5) as i64) % 17 == 0 && step <= (i * 7 + p) % 12;
                    let util = if hot {
                        0.95
                    } else {
                        0.1 + 0.7 * ((i + p) % 9) as f64 / 8.0
                    };
                    let octets = (util * line) as u64 / 800 * 800;
                    let tx = (util * 0.9 * line) as u64 / 800 * 800;
                    for (k, v) in [octets, octets / 800, tx, tx / 800].into_iter().enumerate() {
                        state[p * 4 + k] += v;
                    }
                }
                values.extend_from_slice(&state);
            }
            let b = CounterBatch::new(Arc::clone(&schema), ts, values, Vec::new())
                .map_err(|e| e.to_string())?;
            w.push(&b);
            if b.ts.last().is_some_and(|l| *l >= end - 60_000_000_000) {
                raw.submit(Arc::new(b)).map_err(|e| format!("{e:?}"))?;
            }
            t += rows as i64 * STEP;
        }
        w.finish();
        raw.shutdown().map_err(|e| e.to_string())?;
        files += link_published(&root, &name, lake)?;
    }
    Ok(files)
}

/// Links every published file of the data dir `root` of switch `name` into `lake` at its
/// uploader key (hard links; a copy across file systems). Returns how many.
fn link_published(root: &Path, name: &str, lake: &Path) -> Result<usize, String> {
    let mut n = 0;
    for (rel, path, _) in stel_store::paths::published_parts(root) {
        let to = lake.join(stel_store::paths::lake_key(name, &rel));
        if let Some(p) = to.parent() {
            std::fs::create_dir_all(p).map_err(|e| e.to_string())?;
        }
        std::fs::hard_link(&path, &to)
            .or_else(|_| std::fs::copy(&path, &to).map(drop))
            .map_err(|e| format!("{}: {e}", to.display()))?;
        n += 1;
    }
    Ok(n)
}

/// Copies the tree under `dir` to `s3://lake/rollup/` of the moto server at `url` (boto3).
///
/// # Errors
/// The upload failing.
pub fn upload_tree(dir: &Path, env: &[(String, String)]) -> Result<usize, String> {
    let script = format!(
        r#"
import os, json, boto3
from concurrent.futures import ThreadPoolExecutor
root = {root:?}
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".parquet")]
def put(p):
    s3.upload_file(p, "lake", "rollup/" + os.path.relpath(p, root))
with ThreadPoolExecutor(8) as ex:
    list(ex.map(put, files))
print(json.dumps({{"files": len(files)}}))
"#,
        root = dir.display().to_string()
    );
    let mut c = stel_testkit::python3(&script);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "upload to moto: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim())
        .map_err(|e| e.to_string())?;
    Ok(v["files"].as_u64().unwrap_or(0) as usize)
}

/// One `stel-query … --json` run: its rows, its summary and how long it took.
#[derive(Debug, Clone)]
pub struct Asked {
    pub rows: Vec<Value>,
    pub summary: Value,
    pub secs: f64,
}

/// Runs `stel_query` with `args` (plus `--json`) and parses its JSON Lines.
///
/// # Errors
/// A non-zero exit other than "no rows" (exit 1 with a summary), or output that is not JSON
/// Lines.
pub fn ask(stel_query: &Path, args: &[String], env: &[(String, String)]) -> Result<Asked, String> {
    let t = Instant::now();
    let mut c = Command::new(stel_query);
    c.args(args).arg("--json");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c
        .output()
        .map_err(|e| format!("{}: {e}", stel_query.display()))?;
    let secs = t.elapsed().as_secs_f64();
    if !o.status.success() && o.status.code() != Some(1) {
        return Err(format!(
            "stel-query {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let mut rows = Vec::new();
    let mut summary = Value::Null;
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let v: Value = serde_json::from_str(l).map_err(|e| format!("{l}: {e}"))?;
        match v["type"].as_str() {
            Some("row") => rows.push(v["data"].clone()),
            Some("summary") => summary = v["data"].clone(),
            _ => {}
        }
    }
    // Exit 1 with a summary is "no rows"; without one it is an error (nothing found).
    if summary.is_null() {
        return Err(format!(
            "stel-query {} ({}): {}",
            args.join(" "),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(Asked {
        rows,
        summary,
        secs,
    })
}

/// The two fleet questions, as stel-query arguments (engine flags added by the caller):
/// the top 10 ports by microburst time in the last hour, and per-switch drop totals.
pub fn questions() -> [(&'static str, Vec<String>, &'static [&'static str]); 2] {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    [
        (
            "top 10 ports by microburst time, last hour",
            v(&[
                "top",
                "--by",
                "bursts",
                "-n",
                "10",
                "--last",
                "1h",
                "--threshold",
                "90",
                "--min-duration",
                "20us",
            ]),
            &["switch", "object", "burst_time"],
        ),
        (
            "per-switch drop totals, last hour",
            v(&[
                "top", "--by", "drops", "--per", "switch", "-n", "100000", "--last", "1h",
            ]),
            &["switch", "drops"],
        ),
    ]
}

/// The compared part of each row (`keys`), as text.
pub fn answer(rows: &[Value], keys: &[&str]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| keys.iter().map(|k| r[*k].to_string()).collect())
        .collect()
}

/// A binary of this workspace in the running executable's target dir (`release` picks the
/// profile), built there with cargo when it is missing, or always when `rebuild` (a no-op when
/// it is up to date).
///
/// # Errors
/// cargo cannot build it.
pub fn workspace_binary(
    package: &str,
    bin: &str,
    release: bool,
    rebuild: bool,
) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/<exe> or target/<profile>/deps/<exe>
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let target = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    let path = target
        .join(if release { "release" } else { "debug" })
        .join(bin);
    let mut c = stel_testkit::nested_cargo();
    c.args(["build", "-q", "-p", package, "--bin", bin])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        c.arg("--release");
    }
    if path.exists() && !rebuild {
        return Ok(path);
    }
    eprintln!(
        "fleet: cargo build -p {package} --bin {bin}{}",
        if release { " --release" } else { "" }
    );
    let st = c.status().map_err(|e| format!("cargo build {bin}: {e}"))?;
    if !st.success() || !path.exists() {
        return Err(format!("cargo build -p {package} --bin {bin} failed"));
    }
    Ok(path)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `stel-bench fleet [--quick]`.
///
/// # Errors
/// Any step failing (no root, moto or Sail missing, a daemon failing, a query failing).
pub fn bench(quick: bool, switches: usize) -> Result<Value, String> {
    let mut cfg = if quick {
        FleetConfig::quick()
    } else {
        FleetConfig::full()
    };
    cfg.switches = switches;
    // The daemons in release (as deployed); stel-query's debug build is the one `cargo test`
    // builds: its Spark side is a gRPC client, and a release DataFusion build would add ~18 min
    // to a cold CI run (docs/fleet.md).
    let daemon = workspace_binary("stel-ingest", "stel-ingestd", true, true)?;
    let stel_query = workspace_binary("stel-query", "stel-query", false, true)?;
    let moto = stel_testkit::MotoS3::start("lake");
    let url = moto.url();
    let env: Vec<(String, String)> = stel_testkit::s3_client_env(&url)
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let workers = 2;
    let sail = stel_testkit::SailServer::start(workers, &env_ref);
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    eprintln!(
        "fleet: {} switches ({} snapshots each recent leg + {}, 10 µs), daemons {} at a time → {LAKE} (moto)",
        cfg.switches, cfg.recent, cfg.old, cfg.concurrency
    );
    let g = generate(&cfg, &daemon, work.path(), &env)?;
    eprintln!(
        "fleet: {} daemon runs, {} files ({} bytes, {:.1} M samples) uploaded in {:.1} s; lost {}",
        g.daemon_runs,
        g.files_uploaded,
        g.bytes_uploaded,
        g.samples as f64 / 1e6,
        g.elapsed_s,
        g.lost
    );
    let spark = |q: &[String]| {
        let mut a = vec![
            "--engine".to_string(),
            "spark".into(),
            "--remote".into(),
            sail.remote(),
            "-d".into(),
            LAKE.into(),
        ];
        a.splice(0..0, q.iter().cloned());
        a
    };
    // The local engine reads the same files from the daemons' data dirs (the S3 copies are
    // byte-identical: the uploader checked every size, and the daemons' counters say all were
    // uploaded); `query/tests/fleet.rs` runs it on the S3 lake itself.
    let lake_dir = work.path().join("lake");
    let linked = local_lake(&cfg, work.path(), &lake_dir)?;
    if linked as u64 != g.files_uploaded {
        return Err(format!(
            "{linked} local files but {} uploaded",
            g.files_uploaded
        ));
    }
    let lake_arg = lake_dir.display().to_string();
    let local = |q: &[String]| {
        let mut a = q.to_vec();
        a.extend(["-d".to_string(), lake_arg.clone()]);
        a
    };
    let runs = if quick { 1 } else { 3 };
    let mut results = Vec::new();
    let mut all_match = true;
    for (what, q, keys) in questions() {
        let mut times = Vec::new();
        let mut remote = None;
        for _ in 0..runs {
            let r = ask(&stel_query, &spark(&q), &env)?;
            times.push(r.secs);
            remote = Some(r);
        }
        let remote = remote.ok_or("no run")?;
        let loc = ask(&stel_query, &local(&q), &env)?;
        let (ra, la) = (answer(&remote.rows, keys), answer(&loc.rows, keys));
        let same = !ra.is_empty() && ra == la;
        all_match &= same;
        eprintln!(
            "fleet: {what}: spark {:.2} s ({} of {} files read, from the {}), local {:.2} s, {} rows, answers {}",
            median(times.clone()),
            remote.summary["files_read"],
            remote.summary["files_in_lake"],
            remote.summary["files_read_from"].as_str().unwrap_or("?"),
            loc.secs,
            ra.len(),
            if same { "match" } else { "DIFFER" }
        );
        if !same {
            eprintln!("fleet: spark: {ra:?}\nfleet: local: {la:?}");
        }
        for r in remote.rows.iter().take(3) {
            eprintln!("fleet:   {r}");
        }
        results.push(
            json!({"question": what, "query_s": median(times), "local_query_s": loc.secs,
            "rows": ra.len(), "files_read": remote.summary["files_read"],
            "files_in_lake": remote.summary["files_in_lake"], "answers_match": same}),
        );
    }
    // The rollup question: top ports by burst time over the last day, 100 switches × 24 h of
    // the 1 min tier, on Sail vs the local engine.
    let rollup_dir = work.path().join("rollup-lake");
    let t = Instant::now();
    let written = rollup_lake(cfg.switches, &work.path().join("rollup-data"), &rollup_dir)?;
    let uploaded = upload_tree(&rollup_dir, &env)?;
    eprintln!(
        "fleet: rollup lake: {} switches × 24 h of the 1 min tier: {written} files written, {uploaded} uploaded to {ROLLUP_LAKE} in {:.1} s",
        cfg.switches,
        t.elapsed().as_secs_f64()
    );
    let day = [
        "top".to_string(),
        "--by".into(),
        "bursts".into(),
        "-n".into(),
        "10".into(),
        "--threshold".into(),
        "90".into(),
        "--from".into(),
        (T_RECENT - 86_400_000_000_000).to_string(),
        "--to".into(),
        T_RECENT.to_string(),
    ];
    let mut rq = day.to_vec();
    rq.extend([
        "--engine".to_string(),
        "spark".into(),
        "--remote".into(),
        sail.remote(),
        "-d".into(),
        ROLLUP_LAKE.into(),
    ]);
    let mut rtimes = Vec::new();
    let mut rremote = None;
    for _ in 0..runs {
        let r = ask(&stel_query, &rq, &env)?;
        rtimes.push(r.secs);
        rremote = Some(r);
    }
    let rremote = rremote.ok_or("no run")?;
    let mut lq = day.to_vec();
    lq.extend(["-d".to_string(), rollup_dir.display().to_string()]);
    let rlocal = ask(&stel_query, &lq, &env)?;
    let keys = ["switch", "object", "burst_time"];
    let (ra, la) = (answer(&rremote.rows, &keys), answer(&rlocal.rows, &keys));
    let rollup_match = !ra.is_empty()
        && ra == la
        && rremote.summary["tier"] == "1m"
        && rlocal.summary["tier"] == "1m";
    eprintln!(
        "fleet: top 10 ports by burst time over the last day (1 min tier): spark {:.2} s (tier {}), local {:.2} s (tier {}), answers {}",
        median(rtimes.clone()),
        rremote.summary["tier"],
        rlocal.secs,
        rlocal.summary["tier"],
        if rollup_match { "match" } else { "DIFFER" }
    );
    if !rollup_match {
        eprintln!("fleet: spark: {ra:?}\nfleet: local: {la:?}");
    }
    Ok(json!({
        "bench": "fleet",
        "rollup_query_s": median(rtimes),
        "rollup_answers_match": rollup_match,
        "rollup_local_query_s": rlocal.secs,
        "switches": g.switches,
        "files_in_lake": results[0]["files_in_lake"],
        "files_read": results[0]["files_read"],
        "query_s": results[0]["query_s"],
        "engine": format!("sail local-cluster ({workers} workers) via Spark Connect"),
        "answers_match": all_match,
        "drops_query_s": results[1]["query_s"],
        "drops_files_read": results[1]["files_read"],
        "local_query_s": results[0]["local_query_s"],
        "daemon_runs": g.daemon_runs,
        "files_uploaded": g.files_uploaded,
        "bytes_uploaded": g.bytes_uploaded,
        "samples": g.samples,
        "lost": g.lost,
        "generate_s": g.elapsed_s,
        "questions": results,
    }))
}
