//! Arbitrary capture files (`stel-ingestd --input`) through the file readers — IPFIX, netlink
//! recordings, pcap / pcapng (pcap-file), link layers, IP reassembly — and on through the
//! netlink / IPFIX framing into the decoder, and UDP to the INT port (5900) into the INT
//! decoder with the capture's source address; the body also goes through the sockaddr reader of
//! the UDP receive loops. The first byte picks the format (else `auto`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use stel_ingest::{
    decode::{CounterBatch, DecodeConfig, Decoder},
    input::{FileInput, InputFormat, Unit},
    int::{IntBatch, IntDecodeConfig, IntDecoder, IntSink},
    netlink::{for_each_payload, FrameErrors, UnitFraming},
    pipeline::for_each_ipfix_message,
};

struct Discard;
impl IntSink for Discard {
    fn on_batch(&mut self, _: IntBatch) {}
}

fuzz_target!(|data: &[u8]| {
    let (format, body) = match data.split_first() {
        Some((0, b)) => (InputFormat::Ipfix, b),
        Some((1, b)) => (InputFormat::Netlink, b),
        Some((2, b)) => (InputFormat::Pcap, b),
        Some((_, b)) => (InputFormat::Auto, b),
        None => return,
    };
    // The kernel's sockaddr bytes as the receive loops read them (any bytes: never a panic).
    let _ = stel_ingest::sys::sockaddr_from_bytes(body);
    let path = std::env::temp_dir().join(format!("stel-fuzz-capture-{}", std::process::id()));
    std::fs::write(&path, body).expect("temp file");
    let mut input = FileInput::new(vec![path.clone()], format).with_int_ports(vec![5900]);
    let mut int = IntDecoder::new(IntDecodeConfig::for_test());
    let mut buf = vec![0u8; 1 << 16];
    let mut d = Decoder::new(DecodeConfig::for_test());
    let mut e = FrameErrors::default();
    let mut calls = 0usize;
    while let Some(u) = input.next_unit(&mut buf) {
        calls += 1;
        // Every call consumes input: a loop that does not is a bug.
        assert!(calls <= body.len() + 4, "no progress after {calls} units");
        if let Unit::Data { len, framing } = u {
            let unit = &buf[..len];
            match framing {
                UnitFraming::Netlink => for_each_payload(unit, &mut e, |p| {
                    d.decode(p, &mut |_: CounterBatch| {});
                }),
                UnitFraming::Ipfix => for_each_ipfix_message(unit, |m| {
                    d.decode(m, &mut |_: CounterBatch| {});
                }),
                UnitFraming::Int => {
                    let o = input.last_origin();
                    let src = o.src.map_or([0u8; 4].into(), |a| a.ip());
                    int.decode(src, o.capture_ns.unwrap_or(0), unit, &mut Discard);
                }
            }
        }
    }
    let _ = std::fs::remove_file(&path);
});
