//! Arbitrary bytes through the IPFIX decoder, in both sequence modes, with a registered session
//! whose session_config is also fuzzer-controlled. Must never panic or loop.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stel_ingest::{
    decode::{CounterBatch, DecodeConfig, Decoder, SessionSpec},
    ipfix::SeqMode,
};

fuzz_target!(|data: &[u8]| {
    let (cfg, rest) = data.split_at(data.len().min(data.first().copied().unwrap_or(0) as usize));
    for mode in [SeqMode::PerMessage, SeqMode::Rfc7011] {
        // Small limits, so that short inputs reach the eviction and flush paths too.
        let mut d = Decoder::new(DecodeConfig {
            seq_mode: mode,
            batch_bytes: 4096,
            max_batch_rows: 4,
            seq_window: 64,
            max_templates: 4,
            max_templates_per_domain: 2,
            max_batch_memory_bytes: 8192,
        });
        let mut rows = 0usize;
        let mut sink = |b: CounterBatch| {
            rows += b.rows();
            let _ = b.to_wide();
            let _ = b.into_record_batch().expect("consistent batch");
        };
        let spec = SessionSpec {
            profile: "p".into(),
            group: "PORT".into(),
            domain: 0,
            object_names: vec!["Ethernet0".into(), "Ethernet4".into()],
            object_ids: vec![1, 2],
        };
        let _ = d.register_session(spec, cfg, &mut sink);
        d.decode(rest, &mut sink);
        d.decode(data, &mut sink);
        d.flush(&mut sink);
    }
});
