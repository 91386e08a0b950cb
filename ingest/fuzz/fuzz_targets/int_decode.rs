//! Arbitrary bytes through the INT report decoder (every report version, the inner packet, every
//! INT stack version), under each config variant that changes parsing: v2.0 spec/Tofino headers,
//! DSCP/UDP-port INT signalling, hop limits. Must never panic or loop, every report must be
//! decoded or counted, and every batch must become consistent Arrow record batches and encode
//! through the INT tables' column encoder, split per switch and hour as the writer splits it;
//! `decode_batch` of the same datagrams must count the same.
#![no_main]
use std::net::{IpAddr, Ipv4Addr};

use libfuzzer_sys::fuzz_target;
use stel_ingest::int::{IntBatch, IntDecodeConfig, IntDecoder, V2Header};
use stel_store::int::{encode::encode_in_memory, IntSinkConfig};

fuzz_target!(|data: &[u8]| {
    let knobs = data.first().copied().unwrap_or(0);
    let cfg = IntDecodeConfig {
        v2_header: if knobs & 1 == 0 { V2Header::Spec } else { V2Header::Tofino },
        int_udp_ports: if knobs & 2 == 0 { vec![] } else { vec![5000, 4790] },
        int_dscp: if knobs & 4 == 0 { Some(0x17) } else { Some(0x01) },
        int_dscp_mask: if knobs & 4 == 0 { 0x3f } else { 0x01 },
        max_hops: if knobs & 8 == 0 { 10 } else { 64 },
        initial_hop_count: Some(10),
        latency_threshold_ns: Some(1000),
        clocks_synchronized: knobs & 16 != 0,
        max_flows: 4,
        batch_reports: 3,
        ..IntDecodeConfig::default()
    };
    let mut d = IntDecoder::new(cfg);
    let mut sink = |mut b: IntBatch| {
        let mut scratch = IntBatch::default();
        for p in b.split(&mut scratch) {
            encode_in_memory(std::slice::from_ref(&p), &IntSinkConfig::default())
                .expect("encodes");
        }
        b.finish().expect("consistent batch");
    };
    let src = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut datagrams = vec![(src, 1, data)];
    if data.len() > 1 {
        datagrams.push((src, 2, &data[1..]));
    }
    // A second decoder takes the same datagrams as one batch: the same counters (reports,
    // hops, drops, batches, every malformed reason).
    let mut batched = IntDecoder::new(d.config().clone());
    for &(src, ts, p) in &datagrams {
        d.decode(src, ts, p, &mut sink);
    }
    d.flush(3, &mut sink);
    batched.decode_batch(datagrams.iter().copied(), &mut |_: IntBatch| {});
    batched.flush(3, &mut |_: IntBatch| {});
    let s = d.stats();
    assert_eq!(s.reports, s.reports_decoded + s.reports_malformed);
    assert_eq!(batched.stats(), s, "decode_batch counts as decode");
});
