//! Rollup tiers through the real binaries: `stel-ingestd --input` writes them live next to the
//! raw history; `stel-ingestd rollup` builds them again from that raw history; both are read
//! by pyarrow (equal, value for value) and checked against the raw files by DuckDB.

use std::{path::Path, process::Command};

use stel_emu::{EmuConfig, Emulator, Pattern};
use stel_store::sai::ObjectType;

const INGESTD: &str = env!("CARGO_BIN_EXE_stel-ingestd");

/// The test's switch: 6 ports × 10 stats every 1 ms, microbursts of 3 ms every 20 ms (RX and
/// TX at line rate: above both thresholds), one counter reset, 130 s of switch time from
/// 2023-11-14T22:13:20Z (three minutes touched).
fn emu_cfg() -> EmuConfig {
    let mut c = EmuConfig::design();
    c.ports = 6;
    c.stats = stel_emu::default_stats(ObjectType::Port, 10);
    c.interval_ns = 1_000_000;
    c.pattern = Pattern::Microburst;
    c.burst_ns = 3_000_000;
    c.burst_period_ns = 20_000_000;
    c.reset_at_snapshot = Some(70_000);
    c
}

const SNAPSHOTS: u64 = 130_000;

fn inputs(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut emu = Emulator::new(emu_cfg()).unwrap();
    let mut f = Vec::new();
    emu.template_message(&mut f);
    while emu.snapshots() < SNAPSHOTS {
        emu.data_message(&mut f);
    }
    let ipfix = dir.join("capture.ipfix");
    std::fs::write(&ipfix, f).unwrap();
    let session = dir.join("session.json");
    std::fs::write(
        &session,
        stel_ingest::config::SessionFile::to_json(&emu.session_spec(), &emu.session_config())
            .to_string(),
    )
    .unwrap();
    (ipfix, session)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    err
}

#[test]
fn live_tiers_equal_tiers_rebuilt_from_raw_and_agree_with_the_raw_files() {
    let dir = tempfile::tempdir().unwrap();
    let (ipfix, session) = inputs(dir.path());
    // Nothing may be shed: the comparison is value for value.
    let cfg = dir.path().join("cfg.toml");
    std::fs::write(
        &cfg,
        "[parquet]\nwhen_full = \"block\"\nblock_timeout_ms = 600000\nswitch_name = \"sw7\"\n\
         [rollup]\nenabled = true\nwhen_full = \"block\"\nblock_timeout_ms = 600000\n",
    )
    .unwrap();
    let live = dir.path().join("live");
    let err = run(Command::new(INGESTD)
        .arg("--config")
        .arg(&cfg)
        .args(["--no-inspect", "--status-line", "off", "--session"])
        .arg(&session)
        .arg("--data-dir")
        .arg(&live)
        .arg("--status-file")
        .arg(dir.path().join("status.json"))
        .arg("--input")
        .arg(&ipfix));
    assert!(err.contains("writing rollup tiers 1s, 1m"), "{err}");
    assert!(err.contains(", 0 shed"), "{err}");
    let rebuilt = dir.path().join("rebuilt");
    let err = run(Command::new(INGESTD)
        .args(["rollup", "--data-dir"])
        .arg(&live)
        .arg("--out")
        .arg(&rebuilt)
        .arg("--config")
        .arg(&cfg));
    assert!(err.contains("tier files under"), "{err}");
    // A second rebuild into the same place is refused (it would duplicate rows).
    let again = Command::new(INGESTD)
        .args(["rollup", "--data-dir"])
        .arg(&live)
        .arg("--out")
        .arg(&rebuilt)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already holds rollup tiers"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    let got = stel_testkit::python3_json(&format!(
        r#"
import json, duckdb, pyarrow as pa, pyarrow.dataset as ds
live, rebuilt = {live:?}, {rebuilt:?}
def tier(root, t):
    tab = ds.dataset(root + "/tier=" + t, format="parquet", partitioning="hive").to_table()
    return tab.sort_by([("object", "ascending"), ("ts", "ascending")])
out = {{}}
for t in ["1s", "1m"]:
    a, b = tier(live, t), tier(rebuilt, t)
    diff = [c for c in a.column_names if not a[c].equals(b[c])]
    out[t] = {{"rows": a.num_rows, "same_columns": a.column_names == b.column_names, "diff": diff,
              "resets": pa.compute.sum(a["resets"]).as_py(), "lost": pa.compute.sum(a["lost"]).as_py(),
              "samples": pa.compute.sum(a["samples"]).as_py()}}
con = duckdb.connect()
raw = f"read_parquet('{{live}}/profile=*/group=*/date=*/hour=*/*.parquet', hive_partitioning=1)"
tiers = f"read_parquet('{{live}}/tier=1m/*/*/*/*.parquet', hive_partitioning=1)"
# Per minute, Ethernet8: the raw value at the minute's last snapshot, and the largest delta
# between consecutive snapshots whose later one is in the minute.
q_raw = f"""
with r as (select ts, "Ethernet8.IF_IN_OCTETS" v,
            "Ethernet8.IF_IN_OCTETS"::BIGINT - lag("Ethernet8.IF_IN_OCTETS"::BIGINT) over (order by ts) d
           from {{raw}})
select time_bucket(interval 1 minute, ts) m, arg_max(v, ts),
       max(case when d >= 0 then d end) from r group by m order by m"""
q_tier = f"""select ts, "IF_IN_OCTETS.last", "IF_IN_OCTETS.peak" from {{tiers}}
             where object = 'Ethernet8' order by ts"""
out["raw"] = [[str(a), int(b), int(c)] for a, b, c in con.execute(q_raw).fetchall()]
out["tier"] = [[str(a), int(b), int(c)] for a, b, c in con.execute(q_tier).fetchall()]
out["switch"] = con.execute(f"select distinct kv.value::varchar from parquet_kv_metadata('{{live}}/tier=1m/*/*/*/*.parquet') kv where kv.key::varchar = 'stel.switch'").fetchall()
print(json.dumps(out))
"#,
        live = live.display().to_string(),
        rebuilt = rebuilt.display().to_string()
    ));
    for t in ["1s", "1m"] {
        let g = &got[t];
        assert_eq!(g["same_columns"], true, "{t}: {g}");
        assert_eq!(
            g["diff"],
            serde_json::json!([]),
            "{t}: columns that differ: {g}"
        );
        assert_eq!(
            g["samples"],
            SNAPSHOTS * 6,
            "{t}: every snapshot of every port"
        );
        assert_eq!(
            g["resets"],
            6 * 7,
            "{t}: one reset of every cumulative counter (IF_IN_DISCARDS stays 0: none to reset)"
        );
        assert_eq!(g["lost"], 0, "{t}");
    }
    assert_eq!(got["1s"]["rows"], 130 * 6);
    assert_eq!(got["1m"]["rows"], 3 * 6);
    assert_eq!(got["raw"], got["tier"], "DuckDB on raw vs the 1m tier");
    assert_eq!(got["switch"], serde_json::json!([["sw7"]]));
}

/// `stel-ingestd rollup` writes history, so it takes the output directory's lock like a daemon:
/// refused (exit 2, naming the holder) while a daemon writes that directory, and it runs once
/// the daemon has exited.
#[test]
fn rollup_is_refused_while_a_daemon_writes_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("raw-only.toml");
    std::fs::write(&cfg, "[rollup]\nenabled = false\n").unwrap();
    let data = dir.path().join("data");
    let daemon = Command::new(INGESTD)
        .arg("--config")
        .arg(&cfg)
        .args([
            "--demo",
            "--no-ebpf",
            "--no-inspect",
            "--ports",
            "2",
            "--stats",
            "2",
        ])
        // Runs until stopped, so that the rollup meets it however slow the box.
        .args(["--interval", "1ms", "--duration", "600s", "--data-dir"])
        .arg(&data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Killed if an assertion fails before it is stopped.
    let daemon = stel_testkit::KillOnDrop::new(daemon);
    let status = data.join("status.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !status.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let err = rollup_refused(&data, None);
    assert!(
        err.contains(&format!(
            "{} is being written by another stel-ingestd (pid {}, since ",
            data.display(),
            daemon.id()
        )),
        "{err}"
    );
    assert!(err.contains("give this one another --out"), "{err}");
    stel_testkit::sigterm(daemon.id());
    let out = daemon.into_inner().wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = run(Command::new(INGESTD)
        .args(["rollup", "--data-dir"])
        .arg(&data));
    assert!(err.contains("tier files under"), "{err}");
}

/// `stel-ingestd rollup --data-dir data [--out out]`, which must be refused (exit 2): its
/// stderr.
fn rollup_refused(data: &Path, out: Option<&Path>) -> String {
    let mut c = Command::new(INGESTD);
    c.args(["rollup", "--data-dir"]).arg(data);
    if let Some(out) = out {
        c.arg("--out").arg(out);
    }
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    err
}

/// `stel-ingestd rollup` on a directory without raw history is an error (exit 2) that names
/// the directory, not "0 raw files → 0 tier files" and exit 0: neither a mistyped --data-dir
/// nor a new --out is created, and nothing but the lock file is left in an existing one.
#[test]
fn rollup_without_raw_history_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("stel-dta");
    let err = rollup_refused(&missing, None);
    assert!(
        err.contains(&format!(
            "{} does not exist or is not a directory (is --data-dir right?)",
            missing.display()
        )),
        "{err}"
    );
    assert!(!missing.exists(), "rollup created {}", missing.display());

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = dir.path().join("tiers");
    let err = rollup_refused(&empty, Some(&out));
    assert!(
        err.contains(&format!("{} holds no raw history", empty.display())),
        "{err}"
    );
    assert!(!out.exists(), "rollup created {}", out.display());
    let err = rollup_refused(&empty, None);
    assert!(
        err.contains(&format!("{} holds no raw history", empty.display())),
        "{err}"
    );
    // Nothing but the lock it took (an existing directory is locked first).
    let left: Vec<_> = std::fs::read_dir(&empty)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != ".stel-ingestd.lock")
        .collect();
    assert!(left.is_empty(), "rollup wrote {left:?}");
}
