//! Decoder tests on packets written by hand from the spec tables (reference §5–6), not from the
//! generator; then generator round trips for loss, paths, EVCs.

use std::net::{IpAddr, Ipv4Addr};

use arrow_array::{cast::AsArray, types::*, Array, RecordBatch};
use arrow_schema::DataType;

use stel_emu::int as gen;

use super::*;

const SRC: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9));
const T0: i64 = 1_700_000_000_000_000_000;

/// Decodes `packets` and returns (reports, hops, drops) as record batches plus the events.
fn decode_all(cfg: IntDecodeConfig, packets: &[Vec<u8>]) -> (Tables, IntDecoder) {
    let mut d = IntDecoder::new(IntDecodeConfig {
        batch_reports: 1 << 20,
        ..cfg
    });
    let mut out = Collect::default();
    for (i, p) in packets.iter().enumerate() {
        d.decode(SRC, T0 + i as i64, p, &mut out);
    }
    d.flush(T0, &mut out);
    let mut b = out
        .batches
        .pop()
        .unwrap_or_else(|| IntBatch::with_capacity(0, 0));
    assert!(out.batches.is_empty(), "one batch expected");
    let [(_, r), (_, h), (_, x)] = b.finish().unwrap();
    (
        Tables {
            reports: r,
            hops: h,
            drops: x,
        },
        d,
    )
}

#[derive(Default)]
struct Collect {
    batches: Vec<IntBatch>,
    events: Vec<IntEvent>,
}
impl IntSink for Collect {
    fn on_batch(&mut self, b: IntBatch) {
        self.batches.push(b);
    }
    fn on_event(&mut self, e: &IntEvent) {
        self.events.push(e.clone());
    }
}

struct Tables {
    reports: RecordBatch,
    hops: RecordBatch,
    drops: RecordBatch,
}

/// An unsigned/boolean cell as u64 (`None` = null).
fn cell(rb: &RecordBatch, col: &str, row: usize) -> Option<u64> {
    let c = rb
        .column_by_name(col)
        .unwrap_or_else(|| panic!("no column {col}"));
    if c.is_null(row) {
        return None;
    }
    Some(match c.data_type() {
        DataType::UInt8 => u64::from(c.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => u64::from(c.as_primitive::<UInt16Type>().value(row)),
        DataType::UInt32 => u64::from(c.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => c.as_primitive::<UInt64Type>().value(row),
        DataType::Boolean => u64::from(c.as_boolean().value(row)),
        t => panic!("{col}: {t}"),
    })
}

fn text(rb: &RecordBatch, col: &str, row: usize) -> Option<String> {
    let c = rb.column_by_name(col).unwrap().as_string::<i32>();
    (!c.is_null(row)).then(|| c.value(row).to_string())
}

fn addr(rb: &RecordBatch, col: &str, row: usize) -> Option<IpAddr> {
    let c = rb.column_by_name(col).unwrap().as_fixed_size_binary();
    if c.is_null(row) {
        return None;
    }
    let b: [u8; 16] = c.value(row).try_into().unwrap();
    let v6 = std::net::Ipv6Addr::from(b);
    Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
}

// ---- packet pieces, written from the tables ----

fn eth(tags: &[(u16, u16)], ethertype: u16) -> Vec<u8> {
    let mut b = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    for (tpid, tci) in tags {
        b.extend_from_slice(&tpid.to_be_bytes());
        b.extend_from_slice(&tci.to_be_bytes());
    }
    b.extend_from_slice(&ethertype.to_be_bytes());
    b
}

fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, tos: u8, payload_len: usize) -> Vec<u8> {
    let mut b = vec![0x45, tos];
    b.extend_from_slice(&((20 + payload_len) as u16).to_be_bytes());
    b.extend_from_slice(&[0, 1, 0, 0, 64, proto, 0, 0]);
    b.extend_from_slice(&src);
    b.extend_from_slice(&dst);
    b
}

fn udp(sport: u16, dport: u16, payload_len: usize) -> Vec<u8> {
    let mut b = sport.to_be_bytes().to_vec();
    b.extend_from_slice(&dport.to_be_bytes());
    b.extend_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    b
}

fn tcp(sport: u16, dport: u16, options: &[u8]) -> Vec<u8> {
    let mut b = sport.to_be_bytes().to_vec();
    b.extend_from_slice(&dport.to_be_bytes());
    b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]);
    b.push((((20 + options.len()) / 4) as u8) << 4);
    b.extend_from_slice(&[0x18, 4, 0, 0, 0, 0, 0]);
    b.extend_from_slice(options);
    b
}

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Reference §6.3: AmLight's one-hop test packet.
fn amlight_vector() -> Vec<u8> {
    // Telemetry Report v1.0: Ver 1, Length 4, NProt 0, RepMdBits 0, F, hw_id 0.
    let report = cat(&[
        &[0x14, 0x00, 0x00, 0x40],
        &words(&[0xFB65_D675, 1_408_972_298, 980_327_565]),
    ]);
    let int = cat(&[
        &[0x01, 0x00, 9, 0x02 << 2], // shim: Type 1, Length 9, DSCP 0x02
        &[0x10, 0x00, 6, 9, 0xFC, 0x00, 0x00, 0x00], // Ver 1, Hop ML 6, RHC 9, 0xFC00
        &words(&[
            0xFB65_D675,
            (23 << 16) | 11,
            0xFFFF_FFFF,
            (2 << 24) | 111,
            980_325_604,
            980_327_060,
        ]),
    ]);
    cat(&[
        &report,
        &eth(&[(0x8100, 42)], 0x0800),
        &ipv4([9, 9, 9, 9], [8, 8, 8, 8], 17, 0x17 << 2, 8 + int.len()),
        &udp(50000, 50001, int.len()),
        &int,
    ])
}

#[test]
fn amlight_test_vector_decodes_exactly() {
    let (t, d) = decode_all(IntDecodeConfig::amlight(), &[amlight_vector()]);
    let r = &t.reports;
    assert_eq!(r.num_rows(), 1);
    let s = d.stats();
    assert_eq!(s.reports_malformed, 0, "{s:?}");
    assert_eq!(s.hop_count_rhc_mismatch, 0);
    for (col, v) in [
        ("switch_id", Some(0xFB65_D675)),
        ("report_version", Some(1)),
        ("hw_id", Some(0)),
        ("seq", Some(1_408_972_298)),
        ("seq_gap", Some(0)),
        ("dropped", Some(0)),
        ("tracked", Some(1)),
        ("intermediate", None),
        ("rep_type", None),
        ("report_ingress_ts", Some(980_327_565)),
        ("rep_egress_port", None),
        ("vlan", Some(42)),
        ("inner_vlan", None),
        ("ip_version", Some(4)),
        ("ip_proto", Some(17)),
        ("src_port", Some(50000)),
        ("dst_port", Some(50001)),
        ("dscp", Some(0x17)),
        ("int_version", Some(1)),
        ("hop_count", Some(1)),
        ("hop_ml", Some(6)),
        ("instructions", Some(0xFC00)),
        ("remaining_hop_count", Some(9)),
        ("latency_sum_ns", Some(980_327_060 - 980_325_604)),
        ("latency_e2e_ns", None),
        ("path_changed", Some(0)),
    ] {
        assert_eq!(cell(r, col, 0), v, "{col}");
    }
    assert_eq!(addr(r, "src_addr", 0), Some("9.9.9.9".parse().unwrap()));
    assert_eq!(addr(r, "dst_addr", 0), Some("8.8.8.8".parse().unwrap()));
    assert_eq!(text(r, "evc_id", 0), None);
    let h = &t.hops;
    assert_eq!(h.num_rows(), 1);
    for (col, v) in [
        ("hop_index", Some(0)),
        ("node_id", Some(0xFB65_D675)),
        ("ingress_port", Some(23)),
        ("egress_port", Some(11)),
        ("hop_latency", None),
        ("queue_id", Some(2)),
        ("queue_occupancy", Some(111)),
        ("ingress_ts", Some(980_325_604)),
        ("egress_ts", Some(980_327_060)),
        ("latency_ns", Some(1456)),
        ("l2_ingress_port", None),
        ("tx_util", None),
        ("report_index", Some(0)),
    ] {
        assert_eq!(cell(h, col, 0), v, "{col}");
    }
    // The hop row names its report; the flow and VLAN are the report's only.
    for col in ["switch_id", "hw_id", "seq", "report_index"] {
        assert_eq!(cell(h, col, 0), cell(r, col, 0), "{col}");
    }
    assert!(h.column_by_name("flow_key").is_none() && h.column_by_name("vlan").is_none());
    assert_eq!(t.drops.num_rows(), 0);
}

#[test]
fn v05_switch_local_and_drop_reports() {
    // INT v0.5 over TCP: Ins Cnt 3 (switch id, ports, hop latency), 2 hops, newest first; the
    // older hop's latency is all-ones (unavailable).
    let stack = words(&[7, (1 << 16) | 2, 1500, 5, (3 << 16) | 4, 0xFFFF_FFFF]);
    let int = cat(&[
        &[1, 0, (1 + 2 + 6 + 1) as u8, 0],
        &[0x00, 3, 8, 2, 0xE0, 0x00, 0, 0],
        &stack,
        &[6, 0x1F, 0x90, 0], // tail: proto 6, dport 8080, DSCP
    ]);
    let inner = cat(&[
        &eth(&[], 0x0800),
        &ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, 0x17 << 2, 20 + int.len()),
        &tcp(1234, 8080, &[]),
        &int,
    ]);
    // v0.5 fixed header: Ver 0, NProto 2; Q and F; hw_id 5; seq 77; ingress ts 1000.
    let local = cat(&[
        &[0x02, 0x60, 0x00, 0x05],
        &words(&[77, 1000]),
        &words(&[7, (9 << 16) | 10, (3 << 24) | 0x00_0100, 2000]),
        &inner,
    ]);
    // NProto 1 drop report: switch 7, ports 9/10, queue 3, reason 42; D flag.
    let drop = cat(&[
        &[0x01, 0x80, 0x00, 0x05],
        &words(&[78, 1100]),
        &words(&[7, (9 << 16) | 10]),
        &[3, 42, 0, 0],
        &inner,
    ]);
    let (t, d) = decode_all(IntDecodeConfig::default(), &[local, drop]);
    assert_eq!(d.stats().reports_malformed, 0, "{:?}", d.stats());
    let r = &t.reports;
    assert_eq!(r.num_rows(), 2);
    assert_eq!(cell(r, "switch_id", 0), Some(7));
    assert_eq!(cell(r, "report_version", 0), Some(0));
    assert_eq!(cell(r, "hw_id", 0), Some(5));
    assert_eq!(cell(r, "congested", 0), Some(1));
    assert_eq!(cell(r, "rep_ingress_port", 0), Some(9));
    assert_eq!(cell(r, "rep_queue_id", 0), Some(3));
    assert_eq!(cell(r, "rep_queue_occupancy", 0), Some(256));
    assert_eq!(cell(r, "rep_egress_ts", 0), Some(2000));
    assert_eq!(cell(r, "int_version", 0), Some(0));
    assert_eq!(cell(r, "hop_count", 0), Some(2));
    assert_eq!(cell(r, "vlan", 0), None);
    // The oldest hop has no latency: the sum is unknown.
    assert_eq!(cell(r, "latency_sum_ns", 0), None);
    assert_eq!(cell(r, "seq_gap", 1), Some(0));
    let h = &t.hops;
    assert_eq!(h.num_rows(), 4);
    // Path order: hop_index 0 is the bottom of the stack (node 5).
    assert_eq!(cell(h, "node_id", 0), Some(5));
    assert_eq!(cell(h, "hop_latency", 0), None);
    assert_eq!(cell(h, "node_id", 1), Some(7));
    assert_eq!(cell(h, "ingress_port", 1), Some(1));
    assert_eq!(cell(h, "latency_ns", 1), Some(1500));
    let x = &t.drops;
    assert_eq!(x.num_rows(), 1);
    assert_eq!(cell(x, "drop_reason", 0), Some(42));
    assert_eq!(cell(x, "queue_id", 0), Some(3));
    assert_eq!(cell(x, "egress_port", 0), Some(10));
    assert_eq!(cell(x, "seq", 0), Some(78));
}

#[test]
fn v1_with_report_metadata_ipv4_nprot_and_int_by_udp_port() {
    // RepMdBits 0b101000: ingress/egress port, queue id + occupancy. Length 4 + 2.
    let rep_md: u8 = 0b10_1000;
    let hdr = cat(&[
        &[0x16, (1 << 5) | (rep_md >> 1), (rep_md & 1) << 7, 0xC0 | 9],
        &words(&[0x0A0B_0C0D, 0xFFFF_FFFE, 5]),
        &words(&[(100 << 16) | 0xFFFF, (6 << 24) | 0xFF_FFFF]),
    ]);
    // INT v1.0 with L2 ports (bit 6): Hop ML 1 + 2 = 3, 2 hops.
    let int = cat(&[
        &[1, 0, (3 + 3 * 2) as u8, 0],
        &[0x10, 0, 3, 8, 0x82, 0x00, 0, 0],
        &words(&[22, 0x100, 0x200, 11, 0x10, 0x20]),
    ]);
    let pkt = cat(&[
        &hdr,
        &ipv4([1, 1, 1, 1], [2, 2, 2, 2], 17, 0, 8 + int.len()),
        &udp(7, 6000, int.len()),
        &int,
    ]);
    let cfg = IntDecodeConfig {
        int_udp_ports: vec![6000],
        initial_hop_count: Some(10),
        ..IntDecodeConfig::default()
    };
    let (t, d) = decode_all(cfg, &[pkt]);
    let s = d.stats();
    assert_eq!(s.reports_malformed, 0, "{s:?}");
    let r = &t.reports;
    assert_eq!(cell(r, "switch_id", 0), Some(0x0A0B_0C0D));
    assert_eq!(cell(r, "hw_id", 0), Some(9));
    assert_eq!(cell(r, "congested", 0), Some(1));
    assert_eq!(cell(r, "seq", 0), Some(0xFFFF_FFFE));
    // Only a whole all-ones word is "unavailable": all-ones fields inside a word are values.
    assert_eq!(cell(r, "rep_ingress_port", 0), Some(100));
    assert_eq!(cell(r, "rep_egress_port", 0), Some(0xFFFF));
    assert_eq!(cell(r, "rep_queue_id", 0), Some(6));
    assert_eq!(cell(r, "rep_queue_occupancy", 0), Some(0xFF_FFFF));
    assert_eq!(cell(r, "vlan", 0), None);
    assert_eq!(cell(r, "hop_ml", 0), Some(3));
    assert_eq!(cell(r, "hop_count", 0), Some(2));
    let h = &t.hops;
    assert_eq!(cell(h, "node_id", 0), Some(11));
    assert_eq!(cell(h, "l2_ingress_port", 0), Some(0x10));
    assert_eq!(cell(h, "l2_egress_port", 1), Some(0x200));
    assert_eq!(cell(h, "latency_ns", 0), None);
}

/// v2.0: the spec's example (RepType INT, InType IPv4, MD Length 2, RepMdBits 0x5000, Report
/// Length 14, F) coalesced with a second report (InType Ethernet, Report Length 0xFF) whose
/// packet carries INT v2.1 with 8-byte timestamps, and domain-specific metadata to skip.
#[test]
fn v2_coalesced_reports_exact() {
    let group = cat(&[&[0x20, (3 << 6) | 0x3F, 0xFF, 0xFF], &words(&[0x0102_0304])]);
    // hw_id 3 and sequence 0x3FFFFF (the largest 22-bit value).
    let ip = ipv4([10, 1, 1, 1], [10, 2, 2, 2], 6, 0, 20);
    let first = cat(&[
        &[0x14, 14, 2, 0x20],
        &[0x50, 0x00, 0, 0, 0, 0, 0, 0],
        &words(&[(5 << 16) | 6, (1 << 24) | 99]),
        &ip,
        &tcp(443, 55000, &[]),
    ]);
    // INT v2.1 INT-MD over UDP: bitmap 0x8C00 (node, ingress ts 8 B, egress ts 8 B) = Hop ML 5.
    let int = cat(&[
        &[0x10, 3 + 5 * 2, 0, 0x17 << 2],
        &[0x20, 0, 5, 8, 0x8C, 0x00, 0, 0, 0, 0, 0, 0],
        &words(&[2, 0, 3000, 0, 3700]),
        &words(&[1, 0, 1000, 0, 1900]),
    ]);
    let pkt2 = cat(&[
        &eth(&[(0x8100, 0x2000 | 300)], 0x0800),
        &ipv4([10, 3, 3, 3], [10, 4, 4, 4], 17, 0x17 << 2, 8 + int.len()),
        &udp(1, 2, int.len()),
        &int,
    ]);
    // RepMdBits: bit 5 (egress ts, 8 B); MD Length 3: one word of domain-specific MD skipped.
    let second = cat(&[
        &[0x13, 0xFF, 3, 0x10],
        &[0x04, 0x00, 0x00, 0x07, 0x80, 0x00, 0, 0],
        &words(&[0, 123_456, 0xDEAD_BEEF]),
        &pkt2,
    ]);
    let (t, d) = decode_all(
        IntDecodeConfig::default(),
        &[cat(&[&group, &first, &second])],
    );
    let s = d.stats();
    assert_eq!(s.reports_malformed, 0, "{s:?}");
    assert_eq!(s.reports, 2);
    assert_eq!(s.domain_specific_bytes_skipped, 4);
    let r = &t.reports;
    assert_eq!(r.num_rows(), 2);
    for row in 0..2 {
        assert_eq!(cell(r, "switch_id", row), Some(0x0102_0304));
        assert_eq!(cell(r, "hw_id", row), Some(3));
        assert_eq!(cell(r, "seq", row), Some(0x3F_FFFF));
        assert_eq!(cell(r, "report_version", row), Some(2));
    }
    assert_eq!(cell(r, "rep_type", 0), Some(1));
    assert_eq!(cell(r, "in_type", 0), Some(4));
    assert_eq!(cell(r, "tracked", 0), Some(1));
    assert_eq!(cell(r, "intermediate", 0), Some(0));
    assert_eq!(cell(r, "rep_ingress_port", 0), Some(5));
    assert_eq!(cell(r, "rep_egress_port", 0), Some(6));
    assert_eq!(cell(r, "rep_queue_id", 0), Some(1));
    assert_eq!(cell(r, "rep_queue_occupancy", 0), Some(99));
    assert_eq!(cell(r, "src_port", 0), Some(443));
    assert_eq!(cell(r, "int_version", 0), None);
    assert_eq!(cell(r, "in_type", 1), Some(3));
    assert_eq!(cell(r, "intermediate", 1), Some(1));
    assert_eq!(cell(r, "rep_egress_ts", 1), Some(123_456));
    assert_eq!(cell(r, "vlan", 1), Some(300));
    assert_eq!(cell(r, "int_version", 1), Some(2));
    assert_eq!(cell(r, "hop_count", 1), Some(2));
    assert_eq!(cell(r, "remaining_hop_count", 1), Some(8));
    assert_eq!(cell(r, "latency_sum_ns", 1), Some(900 + 700));
    let h = &t.hops;
    assert_eq!(h.num_rows(), 2);
    assert_eq!(cell(h, "node_id", 0), Some(1));
    assert_eq!(cell(h, "ingress_ts", 0), Some(1000));
    assert_eq!(cell(h, "egress_ts", 1), Some(3700));
    assert_eq!(cell(h, "ingress_port", 0), None);
    // The group's reports share hw_id and sequence number; report_index tells them apart, and
    // the hop rows carry the key of the report they belong to (the second one).
    assert_eq!(cell(r, "report_index", 0), Some(0));
    assert_eq!(cell(r, "report_index", 1), Some(1));
    for row in 0..2 {
        assert_eq!(cell(h, "switch_id", row), Some(0x0102_0304));
        assert_eq!(cell(h, "hw_id", row), Some(3));
        assert_eq!(cell(h, "seq", row), Some(0x3F_FFFF));
        assert_eq!(cell(h, "report_index", row), Some(1));
    }
}

#[test]
fn v2_tlv_inner_and_tofino_header() {
    let ip = ipv4([10, 9, 9, 9], [10, 8, 8, 8], 17, 0, 8);
    let body = cat(&[&ip, &udp(5, 6, 0)]);
    // TLV: type 0 (DS, 1 word) then type 2 (IPv4, 7 words).
    let tlvs = cat(&[
        &[0x00, 1, 0x12, 0x34],
        &[0, 0, 0, 0],
        &[0x20, 7, 0, 0],
        &body,
    ]);
    let rep = cat(&[&[0x01, (tlvs.len() / 4) as u8, 0, 0], &tlvs]);
    // Tofino: 4-bit hw_id 0xA, 24-bit sequence 0xABCDEF.
    let group = cat(&[&[0x2A, 0xAB, 0xCD, 0xEF], &words(&[99])]);
    let cfg = IntDecodeConfig {
        v2_header: V2Header::Tofino,
        ..IntDecodeConfig::default()
    };
    let (t, d) = decode_all(cfg, &[cat(&[&group, &rep])]);
    assert_eq!(d.stats().reports_malformed, 0, "{:?}", d.stats());
    assert_eq!(d.stats().domain_specific_bytes_skipped, 4);
    let r = &t.reports;
    assert_eq!(cell(r, "hw_id", 0), Some(0xA));
    assert_eq!(cell(r, "seq", 0), Some(0xAB_CDEF));
    assert_eq!(cell(r, "rep_type", 0), Some(0));
    assert_eq!(addr(r, "src_addr", 0), Some("10.9.9.9".parse().unwrap()));
    assert_eq!(cell(r, "dst_port", 0), Some(6));
}

#[test]
fn int_over_vxlan_gpe_and_tcp_before_options() {
    // VXLAN-GPE (next protocol 0x82) + GPE INT shim (Length 3 + 1 hop × 1 word, next 0x01
    // IPv4) + INT v2 header, then the encapsulated IPv4/UDP packet names the flow.
    let int = cat(&[&[0x20, 0, 1, 9, 0x80, 0, 0, 0, 0, 0, 0, 0], &words(&[55])]);
    let enc = cat(&[
        &ipv4([172, 16, 0, 1], [172, 16, 0, 2], 17, 0, 8),
        &udp(9, 10, 0),
    ]);
    let gpe = cat(&[
        &[0x0C, 0, 0, 0x82, 0, 0, 1, 0],
        &[0x00, (int.len() / 4) as u8, 0, 0x01],
        &int,
        &enc,
    ]);
    let pkt = cat(&[
        &[0x14, 0x00, 0x00, 0x40],
        &words(&[1, 1, 1]),
        &eth(&[], 0x0800),
        &ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, 0, 8 + gpe.len()),
        &udp(1000, 4790, gpe.len()),
        &gpe,
    ]);
    // NoviFlow: INT right after the fixed TCP header, before 8 bytes of options.
    let int1 = cat(&[
        &[1, 0, 4, 0],
        &[0x10, 0, 1, 9, 0x80, 0, 0, 0],
        &words(&[66]),
    ]);
    let mut seg = tcp(1, 2, &[]);
    seg[12] = 7 << 4; // data offset 7 words: 8 bytes of options follow the INT block
    let pkt2 = cat(&[
        &[0x14, 0x00, 0x00, 0x40],
        &words(&[2, 1, 1]),
        &eth(&[], 0x0800),
        &ipv4([10, 0, 0, 1], [10, 0, 0, 3], 6, 0x17 << 2, 28 + int1.len()),
        &seg,
        &int1,
        &[1, 1, 1, 1, 1, 1, 1, 1],
    ]);
    let (t, d) = decode_all(IntDecodeConfig::default(), &[pkt, pkt2]);
    let s = d.stats();
    assert_eq!(s.reports_malformed, 0, "{s:?}");
    assert_eq!(s.tcp_int_before_options, 1);
    let r = &t.reports;
    assert_eq!(addr(r, "src_addr", 0), Some("172.16.0.1".parse().unwrap()));
    assert_eq!(cell(r, "dst_port", 0), Some(10));
    assert_eq!(cell(r, "hop_count", 0), Some(1));
    assert_eq!(cell(&t.hops, "node_id", 0), Some(55));
    assert_eq!(cell(&t.hops, "node_id", 1), Some(66));
}

#[test]
fn malformed_reports_are_counted_by_reason() {
    let good = amlight_vector();
    let cases: Vec<(Vec<u8>, Malformed)> = vec![
        (vec![], Malformed::Empty),
        (vec![0x30, 0, 0, 0], Malformed::UnknownReportVersion),
        (good[..10].to_vec(), Malformed::V1HeaderTruncated),
        // Length 3 words.
        (
            {
                let mut p = good.clone();
                p[0] = 0x13;
                p
            },
            Malformed::V1LengthTooSmall,
        ),
        // Length 5 but RepMdBits 0.
        (
            {
                let mut p = good.clone();
                p[0] = 0x15;
                p
            },
            Malformed::V1LengthMdMismatch,
        ),
        // NProt 3.
        (
            {
                let mut p = good.clone();
                p[1] = 3 << 5;
                p
            },
            Malformed::V1UnknownNextProto,
        ),
        // Hop ML 5 does not divide a 24-byte stack.
        (
            {
                let mut p = good.clone();
                p[16 + 18 + 20 + 8 + 6] = 5;
                p
            },
            Malformed::HopMlMismatch,
        ),
        // Hop ML 4 is smaller than the 6 instructions it must hold.
        (
            {
                let mut p = good.clone();
                p[16 + 18 + 20 + 8 + 6] = 4;
                p[16 + 18 + 20 + 8 + 2] = 9;
                p
            },
            Malformed::HopMlMismatch,
        ),
        // INT header version 3.
        (
            {
                let mut p = good.clone();
                p[16 + 18 + 20 + 8 + 4] = 0x30;
                p
            },
            Malformed::UnknownIntVersion,
        ),
        // Shim Length beyond the packet.
        (
            {
                let mut p = good.clone();
                p[16 + 18 + 20 + 8 + 2] = 15;
                p
            },
            Malformed::ShimPastPacket,
        ),
        // Shim type 7.
        (
            {
                let mut p = good.clone();
                p[16 + 18 + 20 + 8] = 7;
                p
            },
            Malformed::ShimBadType,
        ),
        (vec![0x20, 0, 0], Malformed::V2GroupTruncated),
        (
            vec![0x20, 0, 0, 1, 0, 0, 0, 1, 0x13, 5, 0, 0],
            Malformed::V2ReportPastPayload,
        ),
        (
            vec![0x20, 0, 0, 1, 0, 0, 0, 1, 0x23, 0, 0, 0],
            Malformed::V2Ioam,
        ),
        (
            vec![0x20, 0, 0, 1, 0, 0, 0, 1, 0x53, 0, 0, 0],
            Malformed::V2UnknownRepType,
        ),
        (
            vec![0x20, 0, 0, 1, 0, 0, 0, 1, 0x09, 0, 0, 0],
            Malformed::V2UnknownInType,
        ),
        (
            vec![
                0x20, 0, 0, 1, 0, 0, 0, 1, 0x13, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
            Malformed::V2MdPastReport,
        ),
        (
            vec![
                0x20, 0, 0, 1, 0, 0, 0, 1, 0x10, 3, 1, 0, 0x0C, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
            Malformed::V2MdBitsExceedMdLength,
        ),
        (
            vec![0x05, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Malformed::V05UnknownNextProto,
        ),
        (
            vec![0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Malformed::V05SubHeaderTruncated,
        ),
    ];
    for (pkt, reason) in cases {
        let (_, d) = decode_all(IntDecodeConfig::default(), std::slice::from_ref(&pkt));
        let s = d.stats();
        assert_eq!(s.malformed(reason), 1, "{reason:?} {pkt:02x?} {s:?}");
        assert_eq!(s.reports_malformed, 1, "{reason:?}");
        assert_eq!(s.reports_decoded, 0, "{reason:?}");
    }
    // Too many hops: an 11-hop AmLight stack.
    let mut g = gen::Generator::new(gen::GenConfig {
        min_hops: 10,
        max_hops: 10,
        ..gen::GenConfig::default()
    });
    let mut buf = Vec::new();
    let p = g.next_packet(&mut buf).payload.to_vec();
    let cfg = IntDecodeConfig {
        max_hops: 9,
        ..IntDecodeConfig::default()
    };
    let (_, d) = decode_all(cfg, &[p]);
    assert_eq!(d.stats().malformed(Malformed::TooManyHops), 1);
}

/// The hand-built AmLight vector, then `each` generator packets of every format in `formats`
/// (v2.0 groups of 3 reports, half of them with drops).
fn sample_packets(formats: &[gen::Format], each: usize) -> Vec<Vec<u8>> {
    let mut pkts = vec![amlight_vector()];
    for &format in formats {
        let mut g = gen::Generator::new(gen::GenConfig {
            format,
            coalesce: 3,
            drop_rate: 0.5,
            ..gen::GenConfig::default()
        });
        let mut buf = Vec::new();
        for _ in 0..each {
            pkts.push(g.next_packet(&mut buf).payload.to_vec());
        }
    }
    pkts
}

#[test]
fn every_truncation_is_counted_never_a_panic() {
    let pkts = sample_packets(&[gen::Format::V05, gen::Format::V1, gen::Format::V2], 1);
    for p in &pkts {
        for cut in 0..p.len() {
            let mut d = IntDecoder::new(IntDecodeConfig::default());
            let mut sink = |_b: IntBatch| {};
            d.decode(SRC, T0, &p[..cut], &mut sink);
            let s = d.stats();
            // Every report either decoded or counted; v2 may decode the reports before the cut.
            assert_eq!(
                s.reports,
                s.reports_decoded + s.reports_malformed,
                "cut {cut} of {}: {s:?}",
                p.len()
            );
            assert!(
                s.reports_malformed >= 1 || cut >= 8 && p[0] >> 4 == 2,
                "cut {cut}"
            );
        }
        // The whole packet decodes cleanly.
        let (_, d) = decode_all(IntDecodeConfig::default(), std::slice::from_ref(p));
        assert_eq!(d.stats().reports_malformed, 0, "{:?}", d.stats());
    }
}

/// Every format from the generator: counts and latencies match what it sent, loss matches its
/// truth exactly across the sequence field's wrap; a second run reorders reports of a stream
/// inside the window (reordered, not lost).
#[test]
fn generator_round_trip_loss_wraparound_paths() {
    for (format, tofino, seq_start) in [
        (gen::Format::Amlight, false, u32::MAX - 40),
        (gen::Format::V1, false, 0),
        (gen::Format::V05, false, u32::MAX - 3),
        (gen::Format::V2, false, (1 << 22) - 30),
        (gen::Format::V2, true, (1 << 24) - 30),
    ] {
        for reorder in [false, true] {
            let mut g = gen::Generator::new(gen::GenConfig {
                format,
                tofino,
                seq_start,
                flows: 6,
                min_hops: 1,
                max_hops: 10,
                loss_rate: 0.05,
                drop_rate: 0.1,
                path_change_every: if reorder { 0 } else { 7 },
                coalesce: 2,
                ..gen::GenConfig::default()
            });
            let mut buf = Vec::new();
            let mut pkts: Vec<Vec<u8>> = Vec::new();
            let mut last_of: std::collections::HashMap<(u32, u8), usize> = Default::default();
            let mut swaps = 0;
            for i in 0..2000 {
                let p = g.next_packet(&mut buf);
                if !p.send {
                    continue;
                }
                pkts.push(p.payload.to_vec());
                let at = pkts.len() - 1;
                if let Some(prev) = last_of.insert(p.stream, at) {
                    if reorder && i % 37 == 0 {
                        pkts.swap(prev, at);
                        swaps += 1;
                    }
                }
            }
            let truth = g.truth();
            let cfg = IntDecodeConfig {
                v2_header: if tofino {
                    V2Header::Tofino
                } else {
                    V2Header::Spec
                },
                ..IntDecodeConfig::for_test()
            };
            let mut d = IntDecoder::new(cfg);
            let mut out = Collect::default();
            for p in &pkts {
                d.decode(SRC, T0, p, &mut out);
            }
            d.flush(T0, &mut out);
            d.finish_sequences();
            let s = d.stats();
            let what = format!("{format:?} tofino={tofino} reorder={reorder}");
            assert_eq!(s.reports_malformed, 0, "{what}: {s:?}");
            assert_eq!(s.reports_decoded, truth.reports_sent, "{what}");
            assert_eq!(s.hops, truth.hops_sent, "{what}");
            assert_eq!(s.drops, truth.drops_sent, "{what}");
            assert!(truth.packets_lost_detectable > 50, "{what}");
            assert_eq!(s.seq_lost, truth.packets_lost_detectable, "{what}: {s:?}");
            assert_eq!(s.seq_reordered, swaps, "{what}");
            assert_eq!(s.seq_duplicates + s.seq_stale, 0, "{what}");
            if !reorder {
                assert!(truth.path_changes > 0);
                assert_eq!(s.path_changes, truth.path_changes, "{what}");
            }
            let rows: usize = out.batches.iter().map(|b| b.reports.rows()).sum();
            assert_eq!(rows as u64, truth.reports_sent);
            // Every hop of every format carries a latency (or both timestamps).
            let mut sum = 0u128;
            for b in &mut out.batches {
                let [(_, r), _, _] = b.finish().unwrap();
                let c = r
                    .column_by_name("latency_sum_ns")
                    .unwrap()
                    .as_primitive::<UInt64Type>();
                assert_eq!(c.null_count(), 0, "{what}");
                sum += c.values().iter().map(|v| u128::from(*v)).sum::<u128>();
            }
            assert_eq!(sum, truth.latency_sum_ns, "{what}");
        }
    }
}

#[test]
fn evc_attribution_from_kytos_listing_and_threshold_events() {
    let mut g = gen::Generator::new(gen::GenConfig {
        flows: 4,
        congestion_rate: 0.3,
        ..gen::GenConfig::default()
    });
    let mut map = evc::EvcMap::default();
    assert_eq!(map.add_kytos_json(&g.kytos_evcs_json()).unwrap(), 4);
    let mut d = IntDecoder::new(IntDecodeConfig {
        latency_threshold_ns: Some(40_000),
        ..IntDecodeConfig::amlight()
    });
    d.set_evc_map(std::sync::Arc::new(map));
    let mut out = Collect::default();
    let mut buf = Vec::new();
    for _ in 0..400 {
        let p = g.next_packet(&mut buf);
        d.decode(SRC, T0, p.payload, &mut out);
    }
    d.flush(T0, &mut out);
    let s = d.stats();
    assert_eq!(s.evc_matched, 400, "{s:?}");
    assert_eq!(s.evc_unmatched, 0);
    assert!(s.latency_crossings_up > 0 && s.latency_crossings_down > 0);
    let ups = out
        .events
        .iter()
        .filter(|e| matches!(e, IntEvent::LatencyCrossed { up: true, .. }))
        .count() as u64;
    assert_eq!(ups, s.latency_crossings_up);
    let [(_, r), _, _] = out.batches[0].finish().unwrap();
    for row in 0..r.num_rows() {
        let vlan = cell(&r, "vlan", row).unwrap();
        assert_eq!(text(&r, "evc_id", row), Some(format!("evc-{vlan}")));
        assert_eq!(text(&r, "evc_name", row), Some(format!("vlan_{vlan}")));
    }
}

/// Reports of every format with random bytes changed or cut off, then random bytes, through one
/// decoder (its scratch and flow state carried from report to report): never a panic, every
/// report decoded or counted, every batch consistent.
#[test]
fn mutated_reports_after_good_ones_never_panic_and_are_counted() {
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let pkts = sample_packets(
        &[
            gen::Format::V05,
            gen::Format::V1,
            gen::Format::V2,
            gen::Format::Amlight,
        ],
        4,
    );
    let mut d = IntDecoder::new(IntDecodeConfig {
        batch_reports: 3,
        ..IntDecodeConfig::default()
    });
    let mut sink = |mut b: IntBatch| {
        b.finish().unwrap();
    };
    for k in 0..60_000u64 {
        let mut p = pkts[(rnd() % pkts.len() as u64) as usize].clone();
        for _ in 0..1 + rnd() % 4 {
            let i = (rnd() % p.len() as u64) as usize;
            p[i] = rnd() as u8;
        }
        if k % 7 == 0 {
            p.truncate((rnd() % (p.len() as u64 + 1)) as usize);
        }
        d.decode(SRC, T0 + k as i64, &p, &mut sink);
    }
    let mut junk = [0u8; 300];
    for k in 0..20_000u64 {
        let n = 12 + (rnd() % 280) as usize;
        for b in junk[..n].iter_mut() {
            *b = rnd() as u8;
        }
        d.decode(SRC, T0 + k as i64, &junk[..n], &mut sink);
    }
    let s = d.stats();
    assert_eq!(s.reports, s.reports_decoded + s.reports_malformed, "{s:?}");
    assert!(s.reports_decoded > 0 && s.reports_malformed > 0, "{s:?}");
}

/// Decodes `packets` with the one-pass AmLight parse on (`fast`) or off: every table's rows,
/// the counters and the events.
fn decode_with(
    cfg: &IntDecodeConfig,
    fast: bool,
    packets: &[Vec<u8>],
) -> (Vec<RecordBatch>, IntStats, Vec<IntEvent>) {
    let mut d = IntDecoder::new(IntDecodeConfig {
        batch_reports: 256,
        ..cfg.clone()
    });
    d.fast = fast;
    let mut out = Collect::default();
    for (i, p) in packets.iter().enumerate() {
        d.decode(SRC, T0 + i as i64, p, &mut out);
    }
    d.flush(T0 + packets.len() as i64, &mut out);
    d.finish_sequences();
    let mut tables = Vec::new();
    for mut b in out.batches {
        tables.extend(b.finish().unwrap().into_iter().map(|(_, rb)| rb));
    }
    (tables, d.stats(), out.events)
}

/// The one-pass parse of AmLight's layout gives what the general parse gives — rows, counters,
/// loss, events — on AmLight reports of 1 to 10 hops, untagged, and on every one of them with
/// each byte changed (to 0, to 0xFF, one bit flipped) or cut short, mixed into one stream, under
/// AmLight's settings, the defaults and INT signalled by UDP port only.
#[test]
fn amlight_one_pass_parse_matches_the_general_parse() {
    let mut base = vec![amlight_vector()];
    for hops in [1, 2, 5, 10] {
        let mut g = gen::Generator::new(gen::GenConfig {
            format: gen::Format::Amlight,
            min_hops: hops,
            max_hops: hops,
            flows: 4,
            ..gen::GenConfig::default()
        });
        let mut buf = Vec::new();
        for _ in 0..3 {
            base.push(g.next_packet(&mut buf).payload.to_vec());
        }
    }
    // The reference vector without its VLAN tag (everything after the tag moves up 4 bytes).
    let v = amlight_vector();
    base.push(cat(&[&v[..16 + 12], &v[16 + 16..]]));
    let changes: [fn(u8) -> u8; 4] = [|_| 0, |_| 0xff, |b| b ^ 0x01, |b| b ^ 0x80];
    let mut packets = base.clone();
    for p in &base {
        for i in 0..p.len() {
            for f in changes {
                let mut m = p.clone();
                m[i] = f(m[i]);
                packets.push(m);
                // A good report after each changed one: flows and streams carry on.
                packets.push(p.clone());
            }
            packets.push(p[..i].to_vec());
        }
    }
    let by_port = IntDecodeConfig {
        int_dscp: None,
        int_udp_ports: vec![50001],
        ..IntDecodeConfig::default()
    };
    for cfg in [
        IntDecodeConfig::amlight(),
        IntDecodeConfig::default(),
        by_port,
    ] {
        let fast = decode_with(&cfg, true, &packets);
        let general = decode_with(&cfg, false, &packets);
        assert!(fast.1.reports_decoded > 0 && fast.1.reports_malformed > 0);
        assert_eq!(fast.1, general.1, "counters, {cfg:?}");
        assert_eq!(fast.2, general.2, "events, {cfg:?}");
        assert_eq!(fast.0.len(), general.0.len());
        for (a, b) in fast.0.iter().zip(&general.0) {
            assert_eq!(a, b, "rows, {cfg:?}");
        }
    }
}

/// [`IntDecoder::decode_batch`] gives what [`IntDecoder::decode`] of each datagram gives — rows,
/// counters, loss, events — in batches of every size, on reports of every format with bytes
/// changed, cut short or random, mixed with good ones.
#[test]
fn batch_decode_matches_decoding_one_datagram_at_a_time() {
    let mut seed = 0x0bad_cafe_f00d_1234u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let good = sample_packets(
        &[
            gen::Format::V05,
            gen::Format::V1,
            gen::Format::V2,
            gen::Format::Amlight,
        ],
        20,
    );
    let mut packets = Vec::new();
    for k in 0..3_000u64 {
        let mut p = good[(rnd() % good.len() as u64) as usize].clone();
        match k % 5 {
            0 => {
                let i = (rnd() % p.len() as u64) as usize;
                p[i] = rnd() as u8;
            }
            1 => p.truncate((rnd() % (p.len() as u64 + 1)) as usize),
            2 => p.iter_mut().for_each(|b| *b = rnd() as u8),
            _ => {}
        }
        packets.push(p);
    }
    packets.push(Vec::new());
    let cfg = IntDecodeConfig {
        batch_reports: 100,
        latency_threshold_ns: Some(5_000),
        ..IntDecodeConfig::amlight()
    };
    let run = |chunk: usize| {
        let mut d = IntDecoder::new(cfg.clone());
        let mut out = Collect::default();
        let items: Vec<_> = (0..packets.len())
            .map(|i| (SRC, T0 + i as i64 * 1_000, packets[i].as_slice()))
            .collect();
        if chunk == 0 {
            for &(src, ts, p) in &items {
                d.decode(src, ts, p, &mut out);
            }
        } else {
            for c in items.chunks(chunk) {
                d.decode_batch(c.iter().copied(), &mut out);
            }
        }
        d.flush(T0 + packets.len() as i64 * 1_000, &mut out);
        d.finish_sequences();
        let mut tables = Vec::new();
        for mut b in out.batches {
            tables.extend(b.finish().unwrap().into_iter().map(|(_, rb)| rb));
        }
        (tables, d.stats(), out.events)
    };
    let one = run(0);
    assert!(
        one.1.reports_decoded > 1_000 && one.1.reports_malformed > 500,
        "{:?}",
        one.1
    );
    assert!(!one.2.is_empty());
    for chunk in [1, 2, 7, 64, packets.len()] {
        let b = run(chunk);
        assert_eq!(b.1, one.1, "counters, batches of {chunk}");
        assert_eq!(b.2, one.2, "events, batches of {chunk}");
        assert_eq!(b.0, one.0, "rows, batches of {chunk}");
    }
}
