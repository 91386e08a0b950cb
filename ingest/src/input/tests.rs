use std::{borrow::Cow, time::Duration};

use pcap_file::{
    pcap::{PcapHeader, PcapPacket, PcapWriter},
    pcapng::{
        blocks::{
            enhanced_packet::EnhancedPacketBlock, interface_description::InterfaceDescriptionBlock,
        },
        PcapNgWriter,
    },
    DataLink,
};

use super::*;
use crate::netlink;

fn ipfix_message(domain: u32, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&VERSION.to_be_bytes());
    m.extend_from_slice(&((16 + body.len()) as u16).to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&domain.to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn all_units(mut input: FileInput) -> (Vec<(Vec<u8>, UnitFraming)>, InputStats) {
    let mut buf = vec![0u8; 1 << 17];
    let mut out = Vec::new();
    while let Some(u) = input.next_unit(&mut buf) {
        if let Unit::Data { len, framing } = u {
            out.push((buf[..len].to_vec(), framing));
        }
    }
    (out, input.stats())
}

#[test]
fn formats_are_detected_from_their_first_bytes() {
    assert_eq!(
        detect_bytes(&[0xd4, 0xc3, 0xb2, 0xa1]),
        Some(InputFormat::Pcap)
    );
    assert_eq!(
        detect_bytes(&[0xa1, 0xb2, 0x3c, 0x4d]),
        Some(InputFormat::Pcap)
    );
    assert_eq!(
        detect_bytes(&[0x0a, 0x0d, 0x0d, 0x0a]),
        Some(InputFormat::Pcap)
    );
    assert_eq!(
        detect_bytes(NETLINK_RECORDING_MAGIC),
        Some(InputFormat::Netlink)
    );
    assert_eq!(
        detect_bytes(&ipfix_message(1, 2, b"")),
        Some(InputFormat::Ipfix)
    );
    let mut d = Vec::new();
    netlink::frame(&mut d, netlink::USERSOCK_MSG_TYPE, 0, b"xy");
    let mut rec = (d.len() as u32).to_le_bytes().to_vec();
    rec.extend_from_slice(&d);
    assert_eq!(detect_bytes(&rec), Some(InputFormat::Netlink));
    assert_eq!(detect_bytes(b"hello world, bye"), None);
}

#[test]
fn ipfix_file_gives_one_message_per_unit_and_hands_over_a_bad_tail() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.ipfix");
    let mut f = ipfix_message(1, 0, &[0; 8]);
    f.extend(ipfix_message(2, 1, &[1; 4]));
    f.extend_from_slice(&[0xff; 40]); // not a header: the decoder must see (and count) it
    std::fs::write(&p, &f).unwrap();
    let (units, st) = all_units(FileInput::new(vec![p], InputFormat::Auto));
    assert_eq!(units.len(), 3);
    assert_eq!(units[0].0, ipfix_message(1, 0, &[0; 8]));
    assert_eq!(units[2].0, vec![0xff; 40]);
    assert!(units.iter().all(|u| u.1 == UnitFraming::Ipfix));
    assert_eq!(st.bytes_read, f.len() as u64);
    assert_eq!(st.files, 1);
}

#[test]
fn netlink_recording_round_trips_and_skips_what_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.nl");
    let mut rec = NetlinkRecorder::new(Vec::new()).unwrap();
    let mut d1 = Vec::new();
    netlink::frame(
        &mut d1,
        netlink::USERSOCK_MSG_TYPE,
        0,
        &ipfix_message(0, 0, &[]),
    );
    rec.record(&d1).unwrap();
    rec.record(&[7; 200_000]).unwrap(); // larger than the 128 KiB test slot: skipped, counted
    rec.record(b"bad framing is handed over").unwrap();
    let mut bytes = rec.finish().unwrap();
    bytes.extend_from_slice(&100u32.to_le_bytes());
    bytes.extend_from_slice(&[1, 2, 3]); // cut short: counted, ends the file
    std::fs::write(&p, &bytes).unwrap();
    let (units, st) = all_units(FileInput::new(vec![p], InputFormat::Auto));
    assert_eq!(units.len(), 2);
    assert_eq!(units[0].0, d1);
    assert_eq!(units[1].0, b"bad framing is handed over");
    assert!(units.iter().all(|u| u.1 == UnitFraming::Netlink));
    assert_eq!(st.unreadable_records, 2);
    assert_eq!(st.discarded_bytes, 200_000);
}

fn udp_ipv4(payload: &[u8], frag: Option<(u16, bool, usize)>) -> Vec<u8> {
    // Ethernet II + VLAN tag + IPv4 + (UDP header + payload, or a fragment of it).
    let mut e = vec![0u8; 12];
    e.extend_from_slice(&0x8100u16.to_be_bytes());
    e.extend_from_slice(&[0, 5]);
    e.extend_from_slice(&0x0800u16.to_be_bytes());
    let (id, more, off) = frag.unwrap_or((1, false, 0));
    let ip_len = 20 + payload.len();
    e.extend_from_slice(&[0x45, 0]);
    e.extend_from_slice(&(ip_len as u16).to_be_bytes());
    e.extend_from_slice(&id.to_be_bytes());
    let ff = ((off / 8) as u16) | if more { 0x2000 } else { 0 };
    e.extend_from_slice(&ff.to_be_bytes());
    e.extend_from_slice(&[64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    e.extend_from_slice(payload);
    e
}

fn udp(payload: &[u8], port: u16) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&1234u16.to_be_bytes());
    u.extend_from_slice(&port.to_be_bytes());
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

#[test]
fn pcap_udp_on_any_port_with_fragments_reassembled() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.pcap");
    let m1 = ipfix_message(3, 10, &[9; 100]);
    let big = ipfix_message(3, 11, &[8; 3000]);
    let whole = udp(&big, 9995);
    let mut w = PcapWriter::with_header(Vec::new(), PcapHeader::default()).unwrap();
    let mut pkt = |data: Vec<u8>, orig: u32| {
        w.write_packet(&PcapPacket {
            timestamp: Duration::ZERO,
            orig_len: orig,
            data: Cow::Owned(data),
        })
        .unwrap();
    };
    let a = udp_ipv4(&udp(&m1, 4739), None);
    let n = a.len() as u32;
    pkt(a, n);
    // The large one in three fragments, sent out of order.
    for (off, more) in [(1480usize, true), (0, true), (2960, false)] {
        let end = (off + 1480).min(whole.len());
        let f = udp_ipv4(&whole[off..end], Some((77, more, off)));
        let n = f.len() as u32;
        pkt(f, n);
    }
    // Not IPFIX (DNS-looking), not UDP (ARP), and a packet cut by the snap length.
    let dns = udp_ipv4(&udp(b"\x12\x34\x01\x00", 53), None);
    let n = dns.len() as u32;
    pkt(dns, n);
    let mut arp = vec![0u8; 12];
    arp.extend_from_slice(&[0x08, 0x06, 0, 1]);
    pkt(arp, 16);
    let cut = udp_ipv4(&udp(&m1, 4739), None);
    let n = cut.len() as u32 + 10;
    pkt(cut, n);
    std::fs::write(&p, w.into_writer()).unwrap();
    let (units, st) = all_units(FileInput::new(vec![p], InputFormat::Auto));
    assert_eq!(
        units.iter().map(|u| &u.0).collect::<Vec<_>>(),
        vec![&m1, &big]
    );
    assert!(units.iter().all(|u| u.1 == UnitFraming::Ipfix));
    assert_eq!(st.ip_fragments, 3);
    assert_eq!(st.ip_reassembled, 1);
    assert_eq!(st.non_ipfix_datagrams, 1);
    assert_eq!(st.skipped_packets, 1);
    assert_eq!(st.unreadable_records, 1);
}

#[test]
fn pcapng_netlink_capture_gives_the_datagrams() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.pcapng");
    let mut d = Vec::new();
    netlink::frame(
        &mut d,
        netlink::USERSOCK_MSG_TYPE,
        0,
        &ipfix_message(0, 5, &[]),
    );
    let mut w = PcapNgWriter::new(Vec::new()).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: DataLink::NETLINK,
        snaplen: 0,
        options: vec![],
    })
    .unwrap();
    // The nlmon header: packet type, ARPHRD_NETLINK (824), unused, netlink family.
    let mut pkt = vec![0, 4];
    pkt.extend_from_slice(&824u16.to_be_bytes());
    pkt.extend_from_slice(&[0; 10]);
    pkt.extend_from_slice(&2u16.to_be_bytes());
    pkt.extend_from_slice(&d);
    w.write_pcapng_block(EnhancedPacketBlock {
        interface_id: 0,
        timestamp: Duration::ZERO,
        original_len: pkt.len() as u32,
        data: Cow::Owned(pkt),
        options: vec![],
    })
    .unwrap();
    std::fs::write(&p, w.into_inner()).unwrap();
    let (units, st) = all_units(FileInput::new(vec![p], InputFormat::Auto));
    assert_eq!(units, vec![(d, UnitFraming::Netlink)]);
    assert_eq!(st.unreadable_records, 0);
}

#[test]
fn a_missing_file_is_counted_and_the_next_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.ipfix");
    std::fs::write(&p, ipfix_message(1, 1, &[])).unwrap();
    let (units, st) = all_units(FileInput::new(
        vec![dir.path().join("nope"), p],
        InputFormat::Auto,
    ));
    assert_eq!(units.len(), 1);
    assert_eq!(st.files_failed, 1);
    assert_eq!(st.files, 1);
}

/// Damaged captures (bit flips, cuts, garbage) never panic and never stop making progress:
/// every call consumes input, and the file ends. (The `capture_framing` fuzz target does the
/// same with coverage guidance.)
#[test]
fn damaged_captures_never_panic_or_hang() {
    let dir = tempfile::tempdir().unwrap();
    // Seeds: an IPFIX file, a netlink recording, a pcap with fragments, a pcapng nlmon capture.
    let m = ipfix_message(3, 1, &[5; 3000]);
    let mut seeds: Vec<Vec<u8>> = vec![[m.clone(), ipfix_message(4, 2, &[1; 8])].concat()];
    let mut rec = NetlinkRecorder::new(Vec::new()).unwrap();
    let mut d = Vec::new();
    netlink::frame(&mut d, netlink::USERSOCK_MSG_TYPE, 0, &m);
    rec.record(&d).unwrap();
    rec.record(&d).unwrap();
    seeds.push(rec.finish().unwrap());
    let mut w = PcapWriter::with_header(Vec::new(), PcapHeader::default()).unwrap();
    let whole = udp(&m, 4739);
    for (off, more) in [(0usize, true), (1480, true), (2960, false)] {
        let f = udp_ipv4(
            &whole[off..(off + 1480).min(whole.len())],
            Some((9, more, off)),
        );
        let n = f.len() as u32;
        w.write_packet(&PcapPacket {
            timestamp: Duration::ZERO,
            orig_len: n,
            data: Cow::Owned(f),
        })
        .unwrap();
    }
    seeds.push(w.into_writer());
    let mut ng = PcapNgWriter::new(Vec::new()).unwrap();
    ng.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: DataLink::NETLINK,
        snaplen: 0,
        options: vec![],
    })
    .unwrap();
    let mut pkt = vec![0u8; 16];
    pkt.extend_from_slice(&d);
    ng.write_pcapng_block(EnhancedPacketBlock {
        interface_id: 0,
        timestamp: Duration::ZERO,
        original_len: pkt.len() as u32,
        data: Cow::Owned(pkt),
        options: vec![],
    })
    .unwrap();
    seeds.push(ng.into_inner());
    // xorshift: reproducible damage.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let p = dir.path().join("damaged");
    let mut buf = vec![0u8; 1 << 16];
    for round in 0..400 {
        let mut f = seeds[round % seeds.len()].clone();
        for _ in 0..1 + rnd() % 8 {
            let i = (rnd() as usize) % f.len();
            match rnd() % 3 {
                0 => f[i] ^= 1 << (rnd() % 8),
                1 => f[i] = rnd() as u8,
                _ => f.truncate(i.max(1)),
            }
        }
        std::fs::write(&p, &f).unwrap();
        for format in [
            InputFormat::Auto,
            InputFormat::Ipfix,
            InputFormat::Netlink,
            InputFormat::Pcap,
        ] {
            let mut input = FileInput::new(vec![p.clone()], format);
            let mut calls = 0;
            while input.next_unit(&mut buf).is_some() {
                calls += 1;
                assert!(
                    calls <= f.len() + 4,
                    "round {round} {format:?}: no progress"
                );
            }
            assert!(input.finished());
        }
    }
}

#[test]
fn pcap_udp_to_an_int_port_is_an_int_unit_with_its_sender_and_capture_time() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("int.pcap");
    let report = [0x14u8, 0, 0, 0x40, 1, 2, 3, 4];
    let m1 = ipfix_message(3, 10, &[9; 20]);
    let mut w = PcapWriter::with_header(
        Vec::new(),
        PcapHeader {
            ts_resolution: pcap_file::TsResolution::NanoSecond,
            ..PcapHeader::default()
        },
    )
    .unwrap();
    let mut pkt = |data: Vec<u8>, ns: u64| {
        w.write_packet(&PcapPacket {
            timestamp: Duration::from_nanos(ns),
            orig_len: data.len() as u32,
            data: Cow::Owned(data),
        })
        .unwrap();
    };
    // IPv4 to 5900 (from 10.0.0.1:1234), IPFIX to 4739, something else to 9999, and IPv6 to
    // 5901 (from 2001:db8::9:1234).
    pkt(
        udp_ipv4(&udp(&report, 5900), None),
        1_700_000_000_123_456_789,
    );
    pkt(udp_ipv4(&udp(&m1, 4739), None), 1_700_000_001_000_000_000);
    pkt(
        udp_ipv4(&udp(b"junk", 9999), None),
        1_700_000_002_000_000_000,
    );
    let u6 = udp(&report[..4], 5901);
    let mut v6 = vec![0u8; 12];
    v6.extend_from_slice(&0x86ddu16.to_be_bytes());
    v6.extend_from_slice(&[0x60, 0, 0, 0]);
    v6.extend_from_slice(&(u6.len() as u16).to_be_bytes());
    v6.extend_from_slice(&[17, 64]);
    v6.extend_from_slice(
        &"2001:db8::9"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    v6.extend_from_slice(
        &"2001:db8::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    v6.extend_from_slice(&u6);
    pkt(v6, 1_700_000_003_000_000_001);
    std::fs::write(&p, w.into_writer()).unwrap();

    let mut input = FileInput::new(vec![p], InputFormat::Auto).with_int_ports(vec![5900, 5901]);
    let mut buf = vec![0u8; 1 << 16];
    let mut got = Vec::new();
    while let Some(u) = input.next_unit(&mut buf) {
        if let Unit::Data { len, framing } = u {
            got.push((buf[..len].to_vec(), framing, input.last_origin()));
        }
    }
    let o = |src: &str, ns: i64| Origin {
        src: Some(src.parse().unwrap()),
        capture_ns: Some(ns),
    };
    assert_eq!(
        got,
        vec![
            (
                report.to_vec(),
                UnitFraming::Int,
                o("10.0.0.1:1234", 1_700_000_000_123_456_789)
            ),
            (
                m1.clone(),
                UnitFraming::Ipfix,
                Origin {
                    src: None,
                    capture_ns: Some(1_700_000_001_000_000_000)
                }
            ),
            (
                report[..4].to_vec(),
                UnitFraming::Int,
                o("[2001:db8::9]:1234", 1_700_000_003_000_000_001)
            ),
        ]
    );
    let st = input.stats();
    assert_eq!(st.int_datagrams, 2);
    assert_eq!(st.non_ipfix_datagrams, 1);

    // Without INT ports (the IPFIX-only default) the reports are other UDP, skipped.
    let (units, st) = all_units(FileInput::new(
        vec![dir.path().join("int.pcap")],
        InputFormat::Auto,
    ));
    assert_eq!(units, vec![(m1, UnitFraming::Ipfix)]);
    assert_eq!((st.int_datagrams, st.non_ipfix_datagrams), (0, 3));
}
