//! The live inspect endpoint end to end: the real `stel-ingestd --demo` serving its unix
//! socket, read with the protocol's client (`stel_store::live::Client`, what `stel-query
//! inspect` uses); bad requests get an error line and do not disturb the daemon or other clients.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use stel_store::live::{Client, Message, Request, Snapshot};

fn next_snapshot(c: &mut Client) -> Snapshot {
    match c.next_message().expect("read") {
        Some(Message::Snapshot(s)) => s,
        m => panic!("expected a snapshot, got {m:?}"),
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

#[test]
fn live_snapshots_from_the_running_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("inspect.sock");
    let status = dir.path().join("status.json");
    let child = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args(["--demo", "--no-ebpf", "--no-history"])
        .args(["--ports", "8", "--stats", "10", "--interval", "1ms"])
        .args(["--decoders", "1", "--duration", "6s"])
        .arg("--status-file")
        .arg(&status)
        .arg("--inspect-socket")
        .arg(&sock)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Duration::from_secs(5);
    // Wait for the socket and for the demo session's first data.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut c = loop {
        let r = Client::connect(
            &sock,
            &Request {
                profile: "stel_demo".into(),
                interval_ms: 50,
            },
            t,
        );
        if let Ok(mut c) = r {
            let started = Instant::now();
            match c.next_message() {
                Ok(Some(Message::Snapshot(_))) => {
                    eprintln!("first snapshot after {:?}", started.elapsed());
                    break c;
                }
                Ok(Some(Message::Error { profiles, .. })) if profiles.is_empty() => {}
                m => panic!("{m:?}"),
            }
        }
        assert!(Instant::now() < deadline, "inspect socket never answered");
        std::thread::sleep(Duration::from_millis(50));
    };
    let a = next_snapshot(&mut c);
    assert_eq!(
        (a.profile.as_str(), a.group.as_str()),
        ("stel_demo", "PORT")
    );
    assert_eq!(a.objects.len(), 8);
    assert_eq!(a.objects[0], "Ethernet0");
    assert_eq!(a.stats.len(), 10);
    assert!(a.stats.iter().any(|s| s == "IF_IN_OCTETS"), "{:?}", a.stats);
    assert!(a.values.iter().flatten().all(Option::is_some));
    let oct = a.stats.iter().position(|s| s == "IF_IN_OCTETS").unwrap();

    // Bad requests while the good client streams: each gets an error line, nothing else.
    for bad in [
        &b"hello\n"[..],
        b"{\"profile\": \"stel_demo\", \"every\": 1}\n",
    ] {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(t)).unwrap();
        s.write_all(bad).unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["type"], "error", "{line}");
    }
    let mut u = Client::connect(
        &sock,
        &Request {
            profile: "nope".into(),
            interval_ms: 50,
        },
        t,
    )
    .unwrap();
    match u.next_message().unwrap() {
        Some(Message::Error { profiles, .. }) => assert_eq!(profiles, vec!["stel_demo"]),
        m => panic!("{m:?}"),
    }

    // Values advance, timestamps are recent (demo switch time = wall clock).
    let mut lag_ms = Vec::new();
    let mut last = a.clone();
    for _ in 0..20 {
        let b = next_snapshot(&mut c);
        lag_ms.push((now_ns() - b.ts) as f64 / 1e6);
        assert!(b.seq >= last.seq && b.ts >= last.ts);
        assert!(b.values[0][oct] >= last.values[0][oct]);
        last = b;
    }
    assert!(
        last.seq > a.seq && last.ts > a.ts,
        "no new data: {a:?} {last:?}"
    );
    assert!(last.values[0][oct] > a.values[0][oct]);
    lag_ms.sort_by(f64::total_cmp);
    eprintln!(
        "snapshot age when received: median {:.1} ms, max {:.1} ms",
        lag_ms[lag_ms.len() / 2],
        lag_ms[lag_ms.len() - 1]
    );
    assert!(lag_ms[lag_ms.len() / 2] < 1000.0, "{lag_ms:?}");
    drop(c);

    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st: Value = serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    let i = &st["metrics"];
    // The registry's JSON form: one entry per series, with its labels.
    let series = |name: &str, reason: Option<&str>| -> u64 {
        // Unlabelled metrics are a number, labelled ones a list of series.
        match &i[name] {
            Value::Number(n) => n.as_u64().unwrap_or(0),
            Value::Array(a) => a
                .iter()
                .filter(|x| reason.is_none_or(|r| x["labels"]["reason"] == r))
                .map(|x| x["value"].as_u64().unwrap_or(0))
                .sum(),
            v => panic!("{name} is {v} in {i}"),
        }
    };
    let bad = "stel_inspect_bad_requests_total";
    assert_eq!(series(bad, Some("bad_request")), 2, "{i}");
    // At least "nope"; connecting before the demo's first batch counts too.
    assert!(series(bad, Some("unknown_profile")) >= 1, "{i}");
    assert!(series("stel_inspect_snapshots_total", None) >= 22, "{i}");
    assert!(!sock.exists(), "the socket is removed at exit");
}
