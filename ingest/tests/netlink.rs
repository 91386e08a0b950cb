//! Through the real kernel: stel-emu's encoder → NETLINK_USERSOCK multicast → recv → decoder.
//! Needs root (NETLINK_USERSOCK multicast); fails loudly, never skips, without it.
use std::time::{Duration, Instant};
use stel_emu::{EmuConfig, Emulator};

use stel_ingest::{
    decode::{CounterBatch, DecodeConfig, Decoder},
    netlink::{self, FrameErrors},
    sys::netlink::NetlinkSocket,
};

fn sockets(group: u32) -> (NetlinkSocket, NetlinkSocket) {
    let rx = NetlinkSocket::usersock().expect("NETLINK_USERSOCK socket (run the tests as root)");
    rx.join_group(group)
        .expect("join multicast group (run the tests as root)");
    rx.set_rcvbuf(64 << 20).expect("rcvbuf");
    rx.set_recv_timeout(Duration::from_millis(200))
        .expect("timeout");
    let tx = NetlinkSocket::usersock().expect("sender socket");
    (rx, tx)
}

#[test]
fn emulator_to_decoder_through_the_kernel_is_exact() {
    let group = 7;
    let (rx, tx) = sockets(group);
    let mut cfg = EmuConfig::design();
    cfg.ports = 16;
    let mut emu = Emulator::new(cfg).unwrap();
    let mut frame = Vec::new();
    let mut ipfix = Vec::new();
    emu.template_message(&mut ipfix);
    netlink::frame(&mut frame, netlink::USERSOCK_MSG_TYPE, 0, &ipfix);
    tx.send_multicast(group, &frame).expect("send template");
    for i in 0..200u32 {
        ipfix.clear();
        frame.clear();
        emu.data_message(&mut ipfix);
        netlink::frame(&mut frame, netlink::USERSOCK_MSG_TYPE, i + 1, &ipfix);
        assert!(frame.len() <= netlink::MAX_NETLINK_MESSAGE);
        tx.send_multicast(group, &frame).expect("send data");
    }
    let mut d = Decoder::new(DecodeConfig::default());
    let mut rows = 0;
    let mut buf = vec![0u8; 1 << 17];
    let mut ferr = FrameErrors::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.stats().messages < 201 && Instant::now() < deadline {
        match rx.recv(&mut buf) {
            Ok((n, real)) => {
                assert_eq!(n, real, "no truncation with a 128 KiB buffer");
                netlink::for_each_payload(&buf[..n], &mut ferr, |p| {
                    d.decode(p, &mut |b: CounterBatch| rows += b.rows());
                });
            }
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{e}"),
        }
    }
    d.flush(&mut |b: CounterBatch| rows += b.rows());
    assert_eq!(rx.drops().unwrap(), 0);
    assert_eq!(ferr, FrameErrors::default());
    assert_eq!(rows as u64, emu.truth.records);
    assert_eq!(d.stats().counters, emu.truth.samples);
    assert_eq!(d.stats().seq_lost_messages, 0);
    assert_eq!(d.stats().malformed_total(), 0);
}

#[test]
fn truncated_datagram_is_reported_not_spliced() {
    let group = 8;
    let (rx, tx) = sockets(group);
    let mut frame = Vec::new();
    netlink::frame(&mut frame, netlink::USERSOCK_MSG_TYPE, 0, &[0u8; 1000]);
    tx.send_multicast(group, &frame).unwrap();
    let mut small = [0u8; 100];
    let (n, real) = rx.recv(&mut small).unwrap();
    assert_eq!(n, 100);
    assert_eq!(real, frame.len());
}
