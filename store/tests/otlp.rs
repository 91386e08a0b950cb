//! The OTLP sink against a real OTLP receiver (`deploy/otlp_receiver.py`: grpcio and the
//! OpenTelemetry protobuf definitions, started per test; see `stel_testkit::otlp`).
//! Values are compared exactly. Run with `--features otlp,redis`.
#![cfg(all(feature = "otlp", feature = "redis"))]

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Read,
    net::TcpListener,
    sync::Arc,
    time::Duration,
};

use stel_store::{
    labels,
    metrics::{Label, Metric, Registry},
    otlp::{
        ConfigDbConfig, DropReason, OtlpConfig, OtlpSink, OtlpStats, Protocol, WhenFull,
        PROFILE_TABLE,
    },
    sai::{ObjectType, StatKey},
    CounterBatch, CounterColumn, SessionSchema,
};
use stel_testkit::{
    otlp::{test_pki, Point, Receiver, ReceiverOptions},
    redis::TestRedis,
};

const WAIT: Duration = Duration::from_secs(30);

fn schema(profile: &str, t: ObjectType, objects: &[&str], stats: &[&str]) -> Arc<SessionSchema> {
    let mut columns = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        for s in stats {
            columns.push(CounterColumn {
                label: i as u16 + 1,
                object: o.to_string(),
                key: StatKey {
                    object_type: t as u32,
                    stat_id: t.stat_by_name(s).expect("known stat").id,
                },
            });
        }
    }
    Arc::new(SessionSchema::one_template(
        profile.into(),
        t.name().into(),
        columns,
    ))
}

fn port_schema(profile: &str) -> Arc<SessionSchema> {
    schema(
        profile,
        ObjectType::Port,
        &["Ethernet0", "Ethernet4", "Ethernet8"],
        &[
            "IF_IN_OCTETS",
            "IF_OUT_UCAST_PKTS",
            "IN_CURR_OCCUPANCY_BYTES",
        ],
    )
}

/// `rows` snapshots from `t0` (1 ms apart), value = a distinct function of (row, column); the
/// counters rise, the occupancy (column 2 of each object) goes up and down.
fn batch(s: &Arc<SessionSchema>, t0: i64, rows: usize) -> Arc<CounterBatch> {
    let w = s.width();
    let mut values = Vec::with_capacity(rows * w);
    let mut ts = Vec::with_capacity(rows);
    for r in 0..rows {
        let t = t0 + r as i64 * 1_000_000;
        ts.push(t);
        for c in 0..w {
            let level = s.columns[c].key.is_level();
            values.push(if level {
                ((t / 1_000_000) as u64 * 7 + c as u64) % 1000
            } else {
                (t / 1_000_000) as u64 * 1_000 + c as u64 + (1 << 40)
            });
        }
    }
    Arc::new(CounterBatch {
        schema: Arc::clone(s),
        ts,
        values,
        part_masks: Vec::new(),
    })
}

/// What the receiver must have got for `b` (first snapshot of each series at `start`).
fn expected(b: &CounterBatch, start: u64, names: &str) -> BTreeSet<String> {
    let s = &b.schema;
    let mut out = BTreeSet::new();
    for r in 0..b.rows() {
        for (c, col) in s.columns.iter().enumerate() {
            let level = col.key.is_level();
            let name = match names {
                "countersyncd" => format!(
                    "sai_counter_type_{}_stat_{}",
                    col.key.object_type, col.key.stat_id
                ),
                _ => format!(
                    "sai.{}.{}",
                    col.key.object_type_name().to_lowercase(),
                    col.key.short_name().to_lowercase()
                ),
            };
            out.insert(format!(
                "{name} {} mono={} temp={} attrs=[{} {} {}] start={} time={} value={}",
                if level { "gauge" } else { "sum" },
                !level,
                if level { 0 } else { 2 },
                col.object,
                col.key.full_name(),
                s.profile,
                if level { 0 } else { start },
                b.ts[r],
                b.row(r)[c] as i64,
            ));
        }
    }
    out
}

fn got(points: &[Point]) -> BTreeSet<String> {
    points
        .iter()
        .filter(|p| !p.metric.starts_with("stel_"))
        .map(|p| {
            format!(
                "{} {} mono={} temp={} attrs=[{} {} {}] start={} time={} value={}",
                p.metric,
                p.kind,
                p.monotonic,
                p.temporality,
                p.attrs["object_name"],
                p.attrs["sai_stat"],
                p.attrs["profile"],
                p.start,
                p.time,
                p.value
            )
        })
        .collect()
}

fn assert_accounted(st: &OtlpStats) {
    assert_eq!(
        st.samples_received,
        st.samples_delivered + st.samples_downsampled + st.dropped_samples.total(),
        "accounting identity: {st:#?}"
    );
    assert_eq!(st.in_flight_samples(), 0, "{st:#?}");
    assert_eq!(st.requests_in_flight, 0, "{st:#?}");
}

fn export_exactly(protocol: Protocol) {
    let rx = Receiver::start(ReceiverOptions {
        grpc: protocol == Protocol::Grpc,
        http: protocol == Protocol::HttpProtobuf,
        ..Default::default()
    });
    let ep = match protocol {
        Protocol::Grpc => rx.grpc_endpoint(),
        Protocol::HttpProtobuf => rx.http_endpoint(),
    };
    let mut cfg = OtlpConfig::for_test(&ep);
    cfg.protocol = protocol;
    // Several requests per batch, and batches that share a request.
    cfg.max_points_per_request = 40;
    let sink = OtlpSink::start(cfg, None).unwrap();
    let s = port_schema("p1");
    let t0 = 1_700_000_000_000_000_000;
    let b1 = batch(&s, t0, 10);
    let b2 = batch(&s, t0 + 10_000_000, 3);
    sink.submit(Arc::clone(&b1)).unwrap();
    sink.submit(Arc::clone(&b2)).unwrap();
    let st = sink.shutdown();
    assert_accounted(&st);
    assert_eq!(st.samples_delivered, 13 * 9, "{st:#?}");
    assert_eq!(st.dropped_samples.total(), 0, "{st:#?}");
    let points = rx.points();
    assert_eq!(points.len(), 13 * 9);
    let mut want = expected(&b1, t0 as u64, "sai");
    want.extend(expected(&b2, t0 as u64, "sai"));
    assert_eq!(got(&points), want);
    let p = &points[0];
    assert_eq!(p.resource["service.name"], "stel");
    assert_eq!(p.resource["host.name"], "test-switch");
    assert_eq!(p.scope, "stel");
    let units: BTreeMap<&str, &str> = points
        .iter()
        .map(|p| (p.metric.as_str(), p.unit.as_str()))
        .collect();
    assert_eq!(units["sai.port.if_in_octets"], "By");
    assert_eq!(units["sai.port.if_out_ucast_pkts"], "{packet}");
    assert!(points
        .iter()
        .any(|p| p.description == "SAI_PORT_STAT_IF_IN_OCTETS"));
}

#[test]
fn grpc_points_arrive_exactly() {
    export_exactly(Protocol::Grpc);
}

#[test]
fn http_protobuf_points_arrive_exactly() {
    export_exactly(Protocol::HttpProtobuf);
}

#[test]
fn tls_with_a_private_ca_over_both_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let pki = test_pki(dir.path());
    let rx = Receiver::start(ReceiverOptions {
        grpc: true,
        http: true,
        tls: Some((pki.cert.clone(), pki.key.clone())),
        ..Default::default()
    });
    let s = port_schema("tls");
    let t0 = 1_700_000_000_000_000_000;
    for (i, (protocol, ep)) in [
        (Protocol::Grpc, rx.grpc_endpoint()),
        (Protocol::HttpProtobuf, rx.http_endpoint()),
    ]
    .into_iter()
    .enumerate()
    {
        assert!(ep.starts_with("https://"));
        let mut cfg = OtlpConfig::for_test(&ep);
        cfg.protocol = protocol;
        cfg.tls.ca_file = Some(pki.ca.clone());
        let sink = OtlpSink::start(cfg, None).unwrap();
        sink.submit(batch(&s, t0 + i as i64 * 1_000_000_000, 2))
            .unwrap();
        let st = sink.shutdown();
        assert_accounted(&st);
        assert_eq!(st.samples_delivered, 18, "{protocol:?}: {st:#?}");
    }
    assert_eq!(rx.points().len(), 36);
    // Without the CA the certificate is not trusted: nothing is delivered, every point counted.
    let mut cfg = OtlpConfig::for_test(&rx.grpc_endpoint());
    cfg.retry_max_elapsed_ms = 200;
    let sink = OtlpSink::start(cfg, None).unwrap();
    sink.submit(batch(&s, t0, 2)).unwrap();
    let st = sink.shutdown();
    assert_accounted(&st);
    assert_eq!(st.samples_delivered, 0);
    assert_eq!(
        st.dropped_samples.retries_exhausted + st.dropped_samples.rejected,
        18,
        "{st:#?}"
    );
}

#[test]
fn a_receiver_that_disappears_and_returns() {
    let mut rx = Receiver::start(ReceiverOptions {
        grpc: true,
        ..Default::default()
    });
    let mut cfg = OtlpConfig::for_test(&rx.grpc_endpoint());
    cfg.retry_max_ms = 100;
    // Room for the whole burst below: this test is about retries, not the queue's policy.
    cfg.queue_batches = 64;
    let sink = OtlpSink::start(cfg, None).unwrap();
    let s = port_schema("p");
    let t0 = 1_700_000_000_000_000_000;
    let before = batch(&s, t0, 5);
    sink.submit(Arc::clone(&before)).unwrap();
    rx.wait_points(45, WAIT);

    rx.kill();
    // While it is gone: the batches collect in a request that fails and is retried with
    // backoff (the endpoint is marked failing; later data would be dropped before encoding
    // while the one request slot is busy). Nothing blocks.
    let mut gone = Vec::new();
    for k in 0..20 {
        let b = batch(&s, t0 + (5 + k) * 1_000_000, 1);
        sink.submit(Arc::clone(&b)).unwrap();
        gone.push(b);
    }
    let deadline = std::time::Instant::now() + WAIT;
    while sink.stats().errors_unavailable == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no failed attempt while it was gone"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    rx.restart();
    // Back: the retried request goes through, and new data flows again.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let st = sink.stats();
        if st.in_flight_samples() == 0 && st.requests_in_flight == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "retries never settled: {st:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = batch(&s, t0 + 100_000_000, 5);
    sink.submit(Arc::clone(&after)).unwrap();
    let st = sink.shutdown();
    assert_accounted(&st);
    assert!(st.retries > 0, "{st:#?}");
    // Everything arrived exactly once, values intact: the request held while the receiver was
    // gone was retried until it was back.
    assert_eq!(st.samples_delivered, (5 + 20 + 5) * 9, "{st:#?}");
    let points = rx.points();
    assert_eq!(points.len() as u64, st.samples_delivered, "{st:#?}");
    let mut want = expected(&before, t0 as u64, "sai");
    for b in gone.iter().chain([&after]) {
        want.extend(expected(b, t0 as u64, "sai"));
    }
    assert_eq!(got(&points), want);
}

/// While an endpoint is down and its request slot is busy retrying, new data is dropped
/// before it is encoded (`unavailable`), and the accounting still closes.
#[test]
fn an_unreachable_collector_costs_nothing_upstream() {
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = OtlpConfig::for_test(&format!("http://127.0.0.1:{port}"));
    cfg.max_points_per_request = 9;
    cfg.retry_max_elapsed_ms = 60_000;
    cfg.shutdown_timeout_ms = 200;
    let sink = OtlpSink::start(cfg, None).unwrap();
    let s = port_schema("p");
    let t0 = 1_700_000_000_000_000_000;
    sink.submit(batch(&s, t0, 1)).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while sink.stats().errors_unavailable == 0 {
        assert!(std::time::Instant::now() < deadline, "no failed attempt");
        std::thread::sleep(Duration::from_millis(10));
    }
    for k in 1..=100 {
        let _ = sink.submit(batch(&s, t0 + k * 1_000_000, 1));
    }
    let st = sink.shutdown();
    assert_accounted(&st);
    assert_eq!(st.samples_delivered, 0);
    // Dropped unencoded by the exporter, or (the burst outran it) evicted from the queue.
    let d = &st.dropped_samples;
    assert!(d.unavailable > 0, "{st:#?}");
    assert_eq!(
        d.unavailable + d.queue_evicted + d.queue_full,
        100 * 9,
        "{st:#?}"
    );
    assert_eq!(d.shutdown, 9, "{st:#?}");
}

#[test]
fn rejected_and_partially_rejected_requests_are_counted_not_retried() {
    let s = port_schema("p");
    let t0 = 1_700_000_000_000_000_000;
    let rx = Receiver::start(ReceiverOptions {
        grpc: true,
        reject: true,
        ..Default::default()
    });
    let sink = OtlpSink::start(OtlpConfig::for_test(&rx.grpc_endpoint()), None).unwrap();
    sink.submit(batch(&s, t0, 2)).unwrap();
    let st = sink.shutdown();
    assert_accounted(&st);
    assert_eq!(st.dropped_samples.rejected, 18, "{st:#?}");
    assert_eq!((st.errors_rejected, st.retries), (1, 0), "{st:#?}");

    let rx = Receiver::start(ReceiverOptions {
        http: true,
        partial: 4,
        ..Default::default()
    });
    let mut cfg = OtlpConfig::for_test(&rx.http_endpoint());
    cfg.protocol = Protocol::HttpProtobuf;
    let sink = OtlpSink::start(cfg, None).unwrap();
    sink.submit(batch(&s, t0, 2)).unwrap();
    let st = sink.shutdown();
    assert_accounted(&st);
    assert_eq!(st.dropped_samples.partially_rejected, 4, "{st:#?}");
    assert_eq!(st.samples_delivered, 14, "{st:#?}");
}

/// A collector that accepts connections and never answers: the only way to hold a request
/// slot for as long as the test wants (a real collector answers or refuses). The sink must
/// keep `submit` non-blocking and shed by its policy.
fn black_hole() -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        l.set_nonblocking(false).unwrap();
        let mut conns = Vec::new();
        // Accept the sink's connection(s), read and discard until it goes away.
        if let Ok((mut c, _)) = l.accept() {
            let mut b = [0u8; 65536];
            while matches!(c.read(&mut b), Ok(n) if n > 0) {}
            conns.push(c);
        }
    });
    (port, h)
}

#[test]
fn a_full_queue_sheds_by_policy_and_never_blocks() {
    let s = port_schema("p");
    let t0 = 1_700_000_000_000_000_000;
    for policy in [WhenFull::DropNewest, WhenFull::DropOldest] {
        let (port, h) = black_hole();
        let mut cfg = OtlpConfig::for_test(&format!("http://127.0.0.1:{port}"));
        cfg.when_full = policy;
        cfg.queue_batches = 2;
        cfg.max_points_per_request = 9; // one request per snapshot
        cfg.timeout_ms = 60_000;
        cfg.shutdown_timeout_ms = 300;
        let sink = OtlpSink::start(cfg, None).unwrap();
        let mut drops = 0;
        for k in 0..50 {
            // 3 snapshots each: the exporter blocks on the second request of the first batch.
            match sink.submit(batch(&s, t0 + k * 3_000_000, 3)) {
                Ok(()) => {}
                Err(r) => {
                    assert_eq!(r, DropReason::QueueFull, "{policy:?}");
                    drops += 1;
                }
            }
        }
        let st = sink.stats();
        match policy {
            WhenFull::DropNewest => {
                assert!(
                    drops > 0 && st.dropped_batches.queue_full == drops,
                    "{st:#?}"
                );
            }
            WhenFull::DropOldest => {
                assert!(st.dropped_batches.queue_evicted > 0, "{st:#?}");
            }
        }
        let st = sink.shutdown();
        assert_accounted(&st);
        assert_eq!(st.samples_received, 50 * 27);
        assert_eq!(st.samples_delivered, 0);
        assert!(st.dropped_samples.shutdown > 0, "{st:#?}");
        drop(h);
    }
}

#[test]
fn profiles_with_their_own_otel_endpoint_go_there() {
    let main_rx = Receiver::start(ReceiverOptions {
        grpc: true,
        ..Default::default()
    });
    let own_rx = Receiver::start(ReceiverOptions {
        grpc: true,
        ..Default::default()
    });
    let redis = TestRedis::start();
    let mut c = redis.connect(4);
    redis::cmd("HSET")
        .arg(format!("{PROFILE_TABLE}|p2"))
        .arg("stream_state")
        .arg("enabled")
        .arg("otel_endpoint")
        .arg(own_rx.grpc_endpoint())
        .query::<()>(&mut c)
        .unwrap();
    redis::cmd("HSET")
        .arg(format!("{PROFILE_TABLE}|p1"))
        .arg("stream_state")
        .arg("enabled")
        .query::<()>(&mut c)
        .unwrap();
    let mut cfg = OtlpConfig::for_test(&main_rx.grpc_endpoint());
    cfg.config_db = Some(ConfigDbConfig {
        url: redis.url().to_string(),
        refresh_ms: 50,
        ..ConfigDbConfig::default()
    });
    let registry = Registry::new();
    let sink = OtlpSink::start(cfg, Some(Arc::clone(&registry))).unwrap();
    let t0 = 1_700_000_000_000_000_000;
    let (s1, s2) = (port_schema("p1"), port_schema("p2"));
    let (b1, b2) = (batch(&s1, t0, 2), batch(&s2, t0, 3));
    sink.submit(Arc::clone(&b1)).unwrap();
    sink.submit(Arc::clone(&b2)).unwrap();
    let st = sink.shutdown();
    assert_accounted(&st);
    assert_eq!(st.profile_endpoints, 1);
    assert_eq!(got(&main_rx.points()), expected(&b1, t0 as u64, "sai"));
    assert_eq!(got(&own_rx.points()), expected(&b2, t0 as u64, "sai"));
    // The registry has the same counts.
    let snap = registry.snapshot();
    assert_eq!(snap.sum(Metric::SinkDeliveredSamples), 45);
    assert_eq!(
        snap.sum_where(Metric::SinkProfileEndpoints, Label::Sink, "otlp"),
        1
    );
}

#[test]
fn the_daemon_s_own_registry_goes_out_too_and_names_can_be_countersyncd_s() {
    let rx = Receiver::start(ReceiverOptions {
        grpc: true,
        ..Default::default()
    });
    let registry = Registry::new();
    let extra = registry.counter(Metric::ReaderDatagrams, labels!(Source = "demo"));
    extra.add(41);
    let lag = registry.histogram(Metric::CountersDbLag, labels!());
    for us in [150, 2_500, 40_000] {
        lag.record_us(us);
    }
    let mut cfg = OtlpConfig::for_test(&rx.grpc_endpoint());
    cfg.own_metrics_interval_ms = 50;
    cfg.metric_names = stel_store::otlp::MetricNames::Countersyncd;
    let sink = OtlpSink::start(cfg, Some(Arc::clone(&registry))).unwrap();
    let s = port_schema("p");
    let t0 = 1_700_000_000_000_000_000;
    let b = batch(&s, t0, 2);
    sink.submit(Arc::clone(&b)).unwrap();
    // At least one periodic export of the registry arrives while running.
    let deadline = std::time::Instant::now() + WAIT;
    while !rx
        .points()
        .iter()
        .any(|p| p.metric == "stel_reader_datagrams_total")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no own metrics arrived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = sink.shutdown();
    assert_accounted(&st);
    let points = rx.points();
    assert_eq!(got(&points), expected(&b, t0 as u64, "countersyncd"));
    let own: Vec<&Point> = points
        .iter()
        .filter(|p| p.metric == "stel_reader_datagrams_total")
        .collect();
    assert!(own
        .iter()
        .all(|p| p.value == 41 && p.kind == "sum" && p.monotonic && p.attrs["source"] == "demo"));
    // A histogram goes out as one: cumulative, its count as the receiver reads it.
    let lags: Vec<&Point> = points
        .iter()
        .filter(|p| p.metric == "stel_counters_db_lag_seconds")
        .collect();
    assert!(!lags.is_empty());
    assert!(lags
        .iter()
        .all(|p| p.kind == "histogram" && p.value == 3 && p.temporality == 2 && p.unit == "s"));
    // Every series of the registry arrives (the last export is at shutdown).
    let arrived: std::collections::BTreeSet<(String, std::collections::BTreeMap<String, String>)> =
        points
            .iter()
            .filter(|p| p.metric.starts_with("stel_"))
            .map(|p| (p.metric.clone(), p.attrs.clone()))
            .collect();
    for s in &registry.snapshot().samples {
        let attrs = s
            .label_pairs()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert!(
            arrived.contains(&(s.metric.name().to_string(), attrs)),
            "{} never reached the receiver",
            s.series_name()
        );
    }
    // The last export (at shutdown) saw every batch the sink received.
    let last = points
        .iter()
        .filter(|p| p.metric == "stel_sink_received_batches_total")
        .max_by_key(|p| p.time)
        .unwrap();
    assert_eq!(last.value, 1);
    assert_eq!(last.attrs["sink"], "otlp");
    assert_eq!(
        st.own_points_delivered as usize,
        points
            .iter()
            .filter(|p| p.metric.starts_with("stel_"))
            .count()
    );
}
