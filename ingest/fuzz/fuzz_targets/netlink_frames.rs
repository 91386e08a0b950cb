//! Arbitrary datagrams through the netlink framing split and on into the decoder.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stel_ingest::{
    decode::{CounterBatch, DecodeConfig, Decoder},
    netlink::{for_each_payload, FrameErrors},
};

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(DecodeConfig::for_test());
    let mut e = FrameErrors::default();
    for_each_payload(data, &mut e, |p| {
        d.decode(p, &mut |_: CounterBatch| {});
    });
});
