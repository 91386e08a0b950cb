//! Issue 13 §3, through the daemon as stel-ingestd builds it (`ingest::topology`): with the
//! Parquet history artificially slowed (its test knob), the decode thread never waits for it,
//! every batch it sheds is counted, and COUNTERS_DB keeps receiving every batch and ends on the
//! exact last values sent. Real parts: NETLINK_USERSOCK multicast (root), the eBPF filter, the
//! io_uring reader, a decoder thread, the Parquet writer and a real redis-server. The lag figure
//! itself is timing and lives in the bench (`STEL_BENCH_PARQUET_DELAY_US=… stel-bench e2e`).
use std::{collections::HashMap, time::Duration};
use stel_emu::{EmuConfig, Emulator};

use redis::Commands;
use stel_ingest::{
    config::{DaemonConfig, SourceKind},
    netlink,
    sources::fixture::{self, FixtureOptions},
    sys::netlink::NetlinkSocket,
    topology::Topology,
};
use stel_store::{
    metrics::{Label, Metric, Snapshot},
    parquet::{accounting, ParquetSinkConfig},
    sai::ObjectType,
    sonic::CountersDbConfig,
};
use stel_testkit::redis::TestRedis;

/// A sink's batch counter, summed over the other labels (`reason` = `None`: any).
fn batches(s: &Snapshot, m: Metric, sink: &str, reason: Option<&str>) -> u64 {
    s.series(m)
        .filter(|x| {
            x.label(Label::Sink) == sink && reason.is_none_or(|r| x.label(Label::Reason) == r)
        })
        .map(|x| x.value)
        .sum()
}

#[test]
fn a_slow_history_sheds_counted_while_counters_db_gets_every_batch_exactly() {
    let group = 25;
    let redis = TestRedis::start_private();
    let mut cfg = EmuConfig::design();
    cfg.ports = 8;
    let mut emu = Emulator::new(cfg).unwrap();
    let report = fixture::publish(redis.url(), &emu, &FixtureOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();

    let mut dc = DaemonConfig::default();
    dc.source.kind = SourceKind::Usersock;
    dc.source.usersock_group = group;
    dc.pipeline.decoders = 1;
    dc.status.file = Default::default();
    dc.inspect.enabled = false;
    // History takes 100 ms per batch and queues two: it cannot keep up and must shed (the
    // default policy, drop_newest), never make the decoder wait.
    dc.parquet = Some(ParquetSinkConfig {
        dir: dir.path().to_path_buf(),
        queue_batches: 2,
        test_write_delay_us: 100_000,
        ..ParquetSinkConfig::default()
    });
    dc.counters_db = Some(CountersDbConfig::for_test(redis.url()));
    let mut topo = Topology::build(dc, None).expect("daemon set-up (run the tests as root)");
    let spec = emu.session_spec();
    topo.daemon
        .register(spec.clone(), emu.session_config())
        .unwrap();
    let counters = std::sync::Arc::clone(topo.counters_db().unwrap());

    let tx = NetlinkSocket::usersock().unwrap();
    let (mut ipfix, mut f) = (Vec::new(), Vec::new());
    let mut send = |emu: &mut Emulator, ipfix: &mut Vec<u8>, template: bool| {
        ipfix.clear();
        f.clear();
        if template {
            emu.template_message(ipfix);
        } else {
            emu.data_message(ipfix);
        }
        netlink::frame(&mut f, netlink::USERSOCK_MSG_TYPE, 0, ipfix);
        tx.send_multicast(group, &f).unwrap();
    };
    send(&mut emu, &mut ipfix, true);
    // In rounds of 20 messages, each received before the next round (no kernel drops even in a
    // debug build); 1,500 messages are ~50 decoder batches, far more than the slow history takes.
    let messages = 1_500u64;
    for round in 0..messages / 20 {
        for _ in 0..20 {
            send(&mut emu, &mut ipfix, false);
        }
        let want = 1 + (round + 1) * 20;
        TestRedis::wait_for(30, &format!("{want} datagrams received"), || {
            topo.daemon.step().unwrap();
            (topo.daemon.status().recv.datagrams >= want).then_some(())
        });
    }

    // COUNTERS_DB ends on the last record sent, exactly (decoded by hand, not by the Decoder),
    // while the history is still sleeping through its backlog.
    let width = emu.width();
    let rec = &ipfix[ipfix.len() - (8 + 8 * width)..];
    let value = |i: usize| u64::from_be_bytes(rec[8 + 8 * i..16 + 8 * i].try_into().unwrap());
    let oid_of: HashMap<_, _> = report
        .oids
        .iter()
        .map(|(n, _, o)| (n.clone(), o.clone()))
        .collect();
    let mut c = redis.connect(2);
    for (i, fd) in emu.template().fields.iter().enumerate() {
        let pos = spec.object_ids.iter().position(|l| *l == fd.label).unwrap();
        let key = format!("COUNTERS:{}", oid_of[&spec.object_names[pos]]);
        let stat = ObjectType::Port.stat(fd.stat_id).unwrap().full;
        let want = value(i).to_string();
        TestRedis::wait_for(30, &format!("{key} {stat} = {want}"), || {
            topo.daemon.step().unwrap();
            let v: Option<String> = c.hget(&key, stat).ok()?;
            (v.as_deref() == Some(want.as_str())).then_some(())
        });
    }
    let live = counters.stats();
    drop(counters);
    let n = messages;
    let drained = move |r: &stel_ingest::sys::uring::RecvStats| r.datagrams > n;
    let fin = topo.finish(Some(&drained), Duration::from_secs(10));
    let p = fin.parquet.expect("the history's final counters");
    let st = fin.status;

    // Everything sent was decoded and offered to both sinks; the decoder never fell behind.
    assert_eq!(st.kernel_drops, 0);
    assert_eq!(st.pipeline.dispatch.shed_decoder_full_messages, 0);
    assert_eq!(st.pipeline.decode.counters, emu.truth.samples);
    assert_eq!(accounting::submitted(&p), emu.truth.samples);
    // History could not keep up: it shed whole batches at once (drop_newest, never a wait that
    // timed out) and counted every one; nothing is unaccounted.
    let dropped = |reason| batches(&p, Metric::SinkDroppedBatches, "parquet", Some(reason));
    assert!(dropped("queue_full") > 0, "{p:?}");
    assert!(accounting::written(&p) > 0, "{p:?}");
    assert_eq!(dropped("queue_timeout"), 0, "{p:?}");
    assert_eq!(
        accounting::submitted(&p),
        accounting::written(&p) + accounting::shed(&p) + accounting::lost(&p),
        "{p:?}"
    );
    assert_eq!(
        accounting::shed(&p),
        accounting::dropped(&p, "queue_full"),
        "{p:?}"
    );
    // The live view took every batch the history was offered, none shed.
    let cdb = |m| batches(&live, m, "counters_db", None);
    assert_eq!(cdb(Metric::SinkDroppedBatches), 0, "{live:?}");
    assert_eq!(
        cdb(Metric::SinkDequeuedBatches),
        cdb(Metric::SinkReceivedBatches),
        "{live:?}"
    );
    assert!(
        cdb(Metric::SinkReceivedBatches)
            >= batches(&p, Metric::SinkQueuedBatches, "parquet", None) + dropped("queue_full"),
        "{live:?} {p:?}"
    );
}
