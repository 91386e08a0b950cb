//! Shared workloads of `stel-bench` and the criterion benches: the same seed-format messages for
//! every implementation measured in one run.
#![forbid(unsafe_code)]

pub mod e2e;
pub mod fleet;
pub mod int;
pub mod netlink;
pub mod otlp;
pub mod parquet;
pub mod rollup;

use stel_emu::{EmuConfig, Emulator};
use stel_ingest::decode::{BswapFn, CounterBatch, DecodeConfig, Decoder};

/// `messages` design-rate data messages (64 ports × 30 stats, 4 snapshots each), concatenated,
/// plus the template message and the emulator (for its session).
pub fn design_messages(messages: usize) -> (Vec<u8>, Vec<u8>, Emulator) {
    let mut emu = Emulator::new(EmuConfig::design()).expect("design config is valid");
    let mut template = Vec::new();
    emu.template_message(&mut template);
    let mut data = Vec::new();
    for _ in 0..messages {
        emu.data_message(&mut data);
    }
    (template, data, emu)
}

/// A decoder with the design session registered, using `bswap`.
pub fn design_decoder(emu: &Emulator, bswap: Option<BswapFn>) -> Decoder {
    let mut d = Decoder::new(DecodeConfig::default());
    if let Some(f) = bswap {
        d = d.with_bswap(f);
    }
    d.register_session(
        emu.session_spec(),
        &emu.session_config(),
        &mut |_: CounterBatch| {},
    )
    .expect("design session registers");
    d
}

/// Decodes `data` once, recycling every batch; returns counters decoded.
pub fn decode_pass(d: &mut Decoder, data: &[u8], spare: &mut Vec<CounterBatch>) -> u64 {
    let before = d.stats().counters;
    d.decode(data, &mut |b: CounterBatch| spare.push(b));
    for b in spare.drain(..) {
        d.recycle(b);
    }
    d.stats().counters - before
}

/// netflow_parser over the same bytes: counters seen in parsed IPFIX data records.
pub fn netflow_parser_pass(p: &mut netflow_parser::NetflowParser, data: &[u8]) -> u64 {
    let mut counters = 0u64;
    for pkt in p.parse_bytes(data).packets {
        if let netflow_parser::NetflowPacket::IPFix(ipfix) = pkt {
            for fs in &ipfix.flowsets {
                if let netflow_parser::variable_versions::ipfix::FlowSetBody::Data(d) = &fs.body {
                    for rec in &d.fields {
                        counters += rec.len().saturating_sub(1) as u64;
                    }
                }
            }
        }
    }
    counters
}

/// A netflow_parser that knows the design template.
pub fn netflow_parser_with_template(template: &[u8]) -> netflow_parser::NetflowParser {
    let mut p = netflow_parser::NetflowParser::builder()
        .with_max_field_count(65535)
        .build()
        .expect("netflow_parser config");
    let _ = p.parse_bytes(template);
    p
}
