//! The daemon's registry through a real Prometheus server: `stel-ingestd --demo --metrics ADDR`
//! is scraped by `prometheus` (Debian's package, started here with a one-job config), and the
//! server's HTTP API returns our series with the values the daemon counted. The status file,
//! `/metrics`, the final status file and `stel-ingestd status` list the same series (one
//! registry), every metric that needs no option is registered by the demo, and the metrics
//! table in docs/metrics.md is the registry's. Also: `/health`.

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use stel_store::metrics::{Kind, Label, Metric, Sample, Snapshot};
use stel_testkit::KillOnDrop;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.0 GET (no chunking): (status line, body), or None if nothing listens yet.
fn get(addr: SocketAddr, path: &str) -> Option<(String, String)> {
    let mut c = TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut s = String::new();
    c.read_to_string(&mut s).ok()?;
    let (head, body) = s.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"_-.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Polls until `f` returns Some (each attempt is a real request; no fixed sleep decides).
fn wait<T>(what: &str, child: &mut Child, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "exited while waiting for {what}"
        );
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_real_prometheus_scrapes_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let maddr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut daemon = KillOnDrop::new(
        Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
            .args(["--demo", "--duration", "120s", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--inspect-socket")
            .arg(dir.path().join("inspect.sock"))
            .arg("--status-file")
            .arg(dir.path().join("status.json"))
            .args(["--metrics", &maddr.to_string(), "--status-line", "off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Live and counting: /health says ok and the first tick has published.
    let ours = wait("the daemon's /metrics", &mut daemon, || {
        let (st, body) = get(maddr, "/metrics")?;
        (st.contains("200") && body.contains("stel_decode_records_total")).then_some(body)
    });
    let (hs, hb) = get(maddr, "/health").unwrap();
    assert!(hs.contains("200"), "{hs} {hb}");
    assert!(get(maddr, "/nothing").unwrap().0.contains("404"));

    let paddr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let cfg = dir.path().join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: stel\n    static_configs:\n      - targets: ['{maddr}']\n"
        ),
    )
    .unwrap();
    let mut prom = KillOnDrop::new(
        Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={paddr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus; deploy/setup.sh --test installs it)"),
    );
    let query = |q: &str| -> Option<Vec<Value>> {
        let (st, body) = get(paddr, &format!("/api/v1/query?query={}", encode(q)))?;
        if !st.contains("200") {
            return None;
        }
        let v: Value = serde_json::from_str(&body).ok()?;
        let r = v["data"]["result"].as_array()?.clone();
        (!r.is_empty()).then_some(r)
    };
    // The scrape worked and the decode counter has a value above zero in Prometheus.
    let up = wait("Prometheus to scrape the daemon", &mut prom, || {
        query("up{job=\"stel\"} == 1")
    });
    assert_eq!(up.len(), 1);
    let records = wait("stel_decode_records_total in Prometheus", &mut prom, || {
        query("stel_decode_records_total > 0")
    });
    let v: f64 = records[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(v > 0.0);

    // Every series name the daemon exposes is stored by Prometheus.
    let exposed: BTreeSet<String> = ours
        .lines()
        .filter(|l| l.starts_with("stel_"))
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect();
    assert!(exposed.len() >= 15, "{exposed:?}");
    let stored = wait("every stel_ series in Prometheus", &mut prom, || {
        let r = query("count by (__name__) ({__name__=~\"stel_.*\"})")?;
        let names: BTreeSet<String> = r
            .iter()
            .filter_map(|x| x["metric"]["__name__"].as_str().map(String::from))
            .collect();
        names.is_superset(&exposed).then_some(names)
    });
    assert!(stored.contains("stel_daemon_healthy_state"), "{stored:?}");

    // The status file and /metrics read the same registry: every series of a tick's status
    // file is served by /metrics fetched after it.
    let status = dir.path().join("status.json");
    let read_status = || -> Option<Snapshot> {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&status).ok()?).ok()?;
        let s = Snapshot::from_json(&v["metrics"]);
        (s.has(Metric::DecodeRecords)).then_some(s)
    };
    let tick = wait("the status file's metrics", &mut daemon, read_status);
    let served = exposed_series(&get(maddr, "/metrics").unwrap().1);
    for x in &tick.samples {
        assert!(
            served.contains(&prometheus_series(x)),
            "{} is in the status file but not in /metrics",
            x.series_name()
        );
    }

    // SIGTERM: the daemon still stops cleanly with the endpoint running.
    stel_testkit::sigterm(daemon.id());
    assert!(daemon.wait().unwrap().success());

    // The final status file has every series /metrics served (none disappears), and every
    // metric that needs nothing but a running daemon is among them.
    let last = read_status().expect("the final status file");
    let finals: BTreeSet<String> = last.samples.iter().map(prometheus_series).collect();
    for x in &served {
        assert!(
            finals.contains(x),
            "{x} served by /metrics, not in the final status file"
        );
    }
    for m in Metric::ALL {
        assert!(
            m.condition().is_some() || last.has(*m),
            "{m} is defined and needs no option, but the demo never registered it (wire it or delete it)"
        );
    }
    assert!(last.has(Metric::DaemonScrapes) && last.sum(Metric::DaemonScrapes) >= 2);
    // Accounted across stages, from the registry alone: every decoded value reached the
    // Parquet sink, and each is written or dropped for a counted reason.
    let parquet = |m| last.sum_where(m, Label::Sink, "parquet");
    assert!(last.sum(Metric::DecodeValues) > 0);
    assert_eq!(
        parquet(Metric::SinkReceivedSamples),
        last.sum(Metric::DecodeValues)
    );
    assert_eq!(
        parquet(Metric::SinkDeliveredSamples) + parquet(Metric::SinkDroppedSamples),
        parquet(Metric::SinkReceivedSamples)
    );

    // `stel-ingestd status` prints the registry from the status file: every series (the
    // daemon has stopped, so the file is stale: exit 1, with the final counters).
    let out = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .args(["status", "--file"])
        .arg(&status)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let table = String::from_utf8(out.stdout).unwrap();
    for x in &last.samples {
        assert!(
            table.contains(&x.series_name()),
            "{} missing from `stel-ingestd status`",
            x.series_name()
        );
    }
    for m in Metric::ALL {
        assert!(
            table.contains(m.name()),
            "{m} missing from `stel-ingestd status`"
        );
    }
}

/// `name{k="v",…}` of every `stel_` sample line of an exposition (a histogram's `_count`).
fn exposed_series(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|l| l.starts_with("stel_"))
        .filter_map(|l| l.rsplit_once(' ').map(|(series, _)| series.to_string()))
        .collect()
}

/// How Prometheus spells a registry series (a histogram: by its `_count` series).
fn prometheus_series(s: &Sample) -> String {
    if s.metric.kind() == Kind::Histogram {
        let name = s.series_name();
        let (n, rest) = name.split_at(s.metric.name().len());
        format!("{n}_count{rest}")
    } else {
        s.series_name()
    }
}

/// docs/metrics.md's table is the registry's (name, type, labels, when registered, help).
#[test]
fn the_metrics_doc_table_lists_every_metric() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"),
    )
    .unwrap();
    let table = Metric::markdown_table();
    assert!(
        doc.contains(&table),
        "docs/metrics.md's table differs from the registry's; replace it with:\n{table}"
    );
}
