//! STATE_DB watcher and the whole SONiC path against a real redis-server (one private server per
//! test on a temp unix socket; `STEL_REDIS_URL` to use another — see
//! `stel_testkit::redis`). A missing redis-server fails these tests.

use std::{
    collections::HashMap,
    sync::{mpsc::Receiver, Arc},
    time::Duration,
};
use stel_emu::{EmuConfig, Emulator};

use redis::Commands;
use stel_ingest::{
    decode::{CounterBatch, DecodeConfig, Decoder},
    sources::{
        fixture::{self, FixtureOptions},
        state_db::{SessionEvent, SessionTable, StateDbConfig, StateDbWatcher},
    },
};
use stel_store::{
    rate::parse_lua_number,
    sai::ObjectType,
    sonic::{CountersDbConfig, CountersDbSink},
};
use stel_testkit::redis::TestRedis;

const HFT_KEY: &str = "HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|stel_demo|PORT";

fn emulator(ports: usize, interval_ns: u64) -> Emulator {
    let mut c = EmuConfig::design();
    c.ports = ports;
    c.stats = [
        "IF_IN_OCTETS",
        "IF_OUT_OCTETS",
        "IF_IN_UCAST_PKTS",
        "IF_OUT_UCAST_PKTS",
        "IF_IN_ERRORS",
    ]
    .iter()
    .map(|s| ObjectType::Port.stat_by_name(s).unwrap())
    .collect();
    c.interval_ns = interval_ns;
    c.snapshots_per_message = 10;
    Emulator::new(c).unwrap()
}

fn next(rx: &Receiver<SessionEvent>) -> SessionEvent {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a session event within 10 s")
}

/// No event arrives while the watcher processes a marker key: everything before it was seen.
fn assert_quiet(r: &TestRedis, rx: &Receiver<SessionEvent>, w: &StateDbWatcher) {
    let n = w.stats().notifications;
    let mut c = r.connect(6);
    let _: () = c
        .hset("STREAM_TELEMETRY_SESSION||marker", "x", "1")
        .unwrap();
    let _: () = c.del("STREAM_TELEMETRY_SESSION||marker").unwrap();
    TestRedis::wait_for(10, "marker notifications", || {
        (w.stats().notifications >= n + 2).then_some(())
    });
    assert!(rx.try_recv().is_err(), "unexpected event");
}

#[test]
fn register_ack_disable_enable_delete() {
    let r = TestRedis::start();
    let emu = emulator(4, 1_000_000);
    fixture::publish(r.url(), &emu, &FixtureOptions::default()).unwrap();
    let (w, rx) = StateDbWatcher::start(StateDbConfig::for_test(r.url())).unwrap();

    let SessionEvent::Register {
        key,
        spec,
        session_config,
        template_ids,
        config_version,
    } = next(&rx)
    else {
        panic!("expected Register")
    };
    assert_eq!(key.table, SessionTable::HighFrequency);
    assert_eq!(spec, emu.session_spec());
    assert_eq!(session_config, emu.session_config());
    assert_eq!(template_ids, vec![256]);
    assert_eq!(config_version, None);
    // Keyspace notifications were off in the fresh server: turned on, and said so.
    assert_eq!(w.stats().notifications_enabled_by_us, 1);
    let mut c = r.connect(6);
    // The daemon applied it: config_version 0 → 1, and our own write is not a new session.
    w.acker().applied(&key, config_version);
    TestRedis::wait_for(10, "config_version = 1", || {
        let v: Option<String> = c.hget(HFT_KEY, "config_version").ok()?;
        (v.as_deref() == Some("1")).then_some(())
    });
    assert_quiet(&r, &rx, &w);

    let _: () = c.hset(HFT_KEY, "stream_status", "disabled").unwrap();
    let SessionEvent::Unregister {
        profile,
        group,
        domain,
        template_ids,
        ..
    } = next(&rx)
    else {
        panic!("expected Unregister")
    };
    assert_eq!(
        (profile.as_str(), group.as_str(), domain, template_ids),
        ("stel_demo", "PORT", 0, vec![256])
    );
    let _: () = c.hset(HFT_KEY, "stream_status", "enabled").unwrap();
    assert!(matches!(next(&rx), SessionEvent::Register { .. }));
    let _: () = c.del(HFT_KEY).unwrap();
    assert!(matches!(next(&rx), SessionEvent::Unregister { .. }));
    // A deleted key is never resurrected by a late acknowledgement.
    w.acker().applied(&key, Some(1));
    assert_quiet(&r, &rx, &w);
    assert!(!c.exists::<_, bool>(HFT_KEY).unwrap());
    let st = w.stats();
    assert_eq!(
        (st.registers, st.unregisters, st.bad_entries),
        (2, 2, 0),
        "{st:?}"
    );
    w.shutdown();
}

#[test]
fn bad_entries_are_counted_and_ignored_others_unaffected() {
    let r = TestRedis::start();
    let emu = emulator(2, 1_000_000);
    let cfg = emu.session_config();
    let mut c = r.connect(6);
    let put = |c: &mut redis::Connection, key: &str, names: &str, ids: &str, conf: &[u8]| {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("stream_status")
            .arg("enabled")
            .arg("object_names")
            .arg(names)
            .arg("object_ids")
            .arg(ids)
            .arg("session_type")
            .arg("ipfix")
            .arg("session_config")
            .arg(conf)
            .query(c)
            .unwrap();
    };
    let k = |g: &str| format!("HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|p|{g}");
    put(&mut c, &k("GOOD"), "Ethernet0,Ethernet4", "1,2", &cfg);
    put(&mut c, &k("MISMATCH"), "Ethernet0,Ethernet4", "1", &cfg);
    put(&mut c, &k("NONNUMERIC"), "Ethernet0,Ethernet4", "1,x", &cfg);
    put(
        &mut c,
        &k("TRUNCATED"),
        "Ethernet0",
        "1",
        &cfg[..cfg.len() - 3],
    );
    let mut bad_len = cfg.clone();
    bad_len[2..4].copy_from_slice(&((cfg.len() + 10) as u16).to_be_bytes());
    put(&mut c, &k("BADLEN"), "Ethernet0", "1", &bad_len);
    let (w, rx) = StateDbWatcher::start(StateDbConfig::for_test(r.url())).unwrap();
    let SessionEvent::Register { key, .. } = next(&rx) else {
        panic!("expected Register")
    };
    assert_eq!(key.group, "GOOD");
    assert_quiet(&r, &rx, &w);
    assert_eq!(w.stats().bad_entries, 4);
    // Fixing an entry registers it.
    put(&mut c, &k("MISMATCH"), "Ethernet0,Ethernet4", "1,2", &cfg);
    let SessionEvent::Register { key, spec, .. } = next(&rx) else {
        panic!("expected Register")
    };
    assert_eq!(
        (key.group.as_str(), spec.object_ids),
        ("MISMATCH", vec![1, 2])
    );
    // A bad update of a registered session leaves it registered (no event).
    put(&mut c, &k("GOOD"), "Ethernet0,Ethernet4", "1,1", &cfg);
    assert_quiet(&r, &rx, &w);
    assert_eq!(w.stats().bad_entries, 5);
    w.shutdown();
}

#[test]
fn seed_hld_tables_and_config_version() {
    let r = TestRedis::start();
    let emu = emulator(2, 1_000_000);
    let cfg = emu.session_config();
    let mut c = r.connect(6);
    let _: () = redis::cmd("HSET")
        .arg("STREAM_TELEMETRY_SESSION|p1|PORT")
        .arg("session_status")
        .arg("enabled")
        .arg("session_type")
        .arg("ipfix")
        .arg("session_config")
        .arg(&cfg)
        .arg("config_version")
        .arg("7")
        .query(&mut c)
        .unwrap();
    let (w, rx) = StateDbWatcher::start(StateDbConfig::for_test(r.url())).unwrap();
    let SessionEvent::Register {
        key,
        spec,
        config_version,
        ..
    } = next(&rx)
    else {
        panic!("expected Register")
    };
    assert_eq!(key.table, SessionTable::Stream);
    assert_eq!(config_version, Some(7));
    assert!(spec.object_names.is_empty());
    w.acker().applied(&key, config_version);
    TestRedis::wait_for(10, "config_version = 8", || {
        let v: Option<String> = c
            .hget("STREAM_TELEMETRY_SESSION|p1|PORT", "config_version")
            .ok()?;
        (v.as_deref() == Some("8")).then_some(())
    });
    // The deprecated per-profile form, template as hex text: group from the template.
    let hex: String = cfg.iter().map(|b| format!("{b:02x}")).collect();
    let _: () = c
        .hset("STREAM_TELEMETRY_SESSION|legacy", "session_template", hex)
        .unwrap();
    let SessionEvent::Register { key, spec, .. } = next(&rx) else {
        panic!("expected Register")
    };
    assert_eq!(key.table, SessionTable::StreamLegacy);
    assert_eq!(
        (spec.profile.as_str(), spec.group.as_str()),
        ("legacy", "PORT")
    );
    w.shutdown();
}

#[test]
fn watcher_resyncs_after_redis_restart() {
    let mut r = TestRedis::start_private();
    let emu = emulator(2, 1_000_000);
    fixture::publish(r.url(), &emu, &FixtureOptions::default()).unwrap();
    let (w, rx) = StateDbWatcher::start(StateDbConfig::for_test(r.url())).unwrap();
    assert!(matches!(next(&rx), SessionEvent::Register { .. }));
    r.kill();
    TestRedis::wait_for(10, "disconnect seen", || {
        (!w.stats().connected).then_some(())
    });
    r.restart();
    // The new server has a different session; the old one is gone.
    let mut c = r.connect(6);
    let _: () = redis::cmd("HSET")
        .arg("HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|other|PORT")
        .arg("stream_status")
        .arg("enabled")
        .arg("object_names")
        .arg("Ethernet0,Ethernet4")
        .arg("object_ids")
        .arg("1,2")
        .arg("session_config")
        .arg(emu.session_config())
        .query(&mut c)
        .unwrap();
    let mut evs = vec![next(&rx), next(&rx)];
    evs.sort_by_key(|e| matches!(e, SessionEvent::Register { .. }));
    assert!(
        matches!(&evs[0], SessionEvent::Unregister { profile, .. } if profile == "stel_demo"),
        "{evs:?}"
    );
    assert!(
        matches!(&evs[1], SessionEvent::Register { spec, .. } if spec.profile == "other"),
        "{evs:?}"
    );
    let st = w.stats();
    assert!(
        st.connects >= 2 && st.redis_errors >= 1 && st.full_scans >= 2,
        "{st:?}"
    );
    // Notifications were re-enabled on the new server.
    assert!(st.notifications_enabled_by_us >= 2);
    w.shutdown();
}

/// The whole SONiC path: stel-emu's fixture → STATE_DB watcher → a real Decoder fed the
/// emulator's IPFIX → COUNTERS_DB writer. Values must equal the last record the emulator sent;
/// RATES must match the emulator's load model, across a counter reset.
#[test]
fn state_db_session_to_counters_db_exact() {
    let r = TestRedis::start();
    let mut emu = {
        let mut c = EmuConfig::design();
        c.ports = 4;
        c.stats = emulator(1, 1).cfg.stats;
        c.interval_ns = 1_000_000; // 1 ms
        c.snapshots_per_message = 10;
        c.reset_at_snapshot = Some(1_500);
        Emulator::new(c).unwrap()
    };
    let report = fixture::publish(r.url(), &emu, &FixtureOptions::default()).unwrap();
    let (w, rx) = StateDbWatcher::start(StateDbConfig::for_test(r.url())).unwrap();
    let SessionEvent::Register {
        key,
        spec,
        session_config,
        config_version,
        ..
    } = next(&rx)
    else {
        panic!("expected Register")
    };
    let mut sink_cfg = CountersDbConfig::for_test(r.url());
    sink_cfg.rate_interval_ms = 100;
    let sink = CountersDbSink::start(sink_cfg, None).unwrap();
    let mut dec = Decoder::new(DecodeConfig::for_test());
    let mut batches: Vec<CounterBatch> = Vec::new();
    dec.register_session(spec.clone(), &session_config, &mut |b| batches.push(b))
        .unwrap();
    w.acker().applied(&key, config_version);

    // 3 s of switch time; submit as we go, like the daemon.
    let mut buf = Vec::new();
    for _ in 0..300 {
        buf.clear();
        emu.data_message(&mut buf);
        dec.decode(&buf, &mut |b| batches.push(b));
        for b in batches.drain(..) {
            sink.submit(Arc::new(b)).unwrap();
        }
    }
    dec.flush(&mut |b| batches.push(b));
    for b in batches.drain(..) {
        sink.submit(Arc::new(b)).unwrap();
    }
    // Expected: the last record of the last message, decoded by hand (not by the Decoder).
    let width = emu.width();
    let rec = &buf[buf.len() - (8 + 8 * width)..];
    let value = |i: usize| u64::from_be_bytes(rec[8 + 8 * i..16 + 8 * i].try_into().unwrap());
    let oid_of: HashMap<_, _> = report
        .oids
        .iter()
        .map(|(n, _, o)| (n.clone(), o.clone()))
        .collect();
    let mut c = r.connect(2);
    for (i, f) in emu.template().fields.iter().enumerate() {
        let pos = spec.object_ids.iter().position(|l| *l == f.label).unwrap();
        let oid = &oid_of[&spec.object_names[pos]];
        let stat = ObjectType::Port.stat(f.stat_id).unwrap().full;
        let key = format!("COUNTERS:{oid}");
        let want = value(i).to_string();
        TestRedis::wait_for(10, &format!("{key} {stat} = {want}"), || {
            let v: Option<String> = c.hget(&key, stat).ok()?;
            (v.as_deref() == Some(want.as_str())).then_some(())
        });
    }
    // RATES: steady load, object i at 20 % + 60 % × (i mod 7)/6 of 100G, in bytes/s.
    for (i, name) in spec.object_names.iter().enumerate() {
        let oid = &oid_of[name];
        let want = (0.2 + 0.6 * (i % 7) as f64 / 6.0) * 100e9 / 8.0;
        let h: HashMap<String, String> = c.hgetall(format!("RATES:{oid}")).unwrap();
        let bps = parse_lua_number(&h["RX_BPS"]).unwrap();
        assert!(
            (bps / want - 1.0).abs() < 1e-3,
            "{name}: RX_BPS {bps} vs {want}"
        );
        let util = parse_lua_number(&h["RX_UTIL"]).unwrap();
        assert!(
            (util - want / 12.5e9 * 100.0).abs() < 0.1,
            "{name}: RX_UTIL {util}"
        );
        let st: String = c.hget(format!("RATES:{oid}:PORT"), "INIT_DONE").unwrap();
        assert_eq!(st, "DONE");
    }
    let st = sink.stats();
    use stel_store::metrics::{Label, Metric};
    assert!(
        st.get(Metric::CountersDbRateResets) >= 4,
        "one reset per port: {st:?}"
    );
    assert_eq!(
        st.sum_where(Metric::SinkDroppedBatches, Label::Reason, "queue_full"),
        0
    );
    assert_eq!(st.get(Metric::CountersDbObjectsWithoutOid), 0);
    sink.shutdown();
    w.shutdown();
}
