//! Arbitrary datagrams through the nlctrl parser (GETFAMILY replies and notifications), and
//! arbitrary text through the constants.yml reader: neither may panic or loop.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stel_ingest::genl::{self, GenlConfig, Message};

fuzz_target!(|data: &[u8]| {
    let mut n = 0usize;
    for m in genl::parse_datagram(data) {
        n += 1;
        if let Ok(Message::Ctrl { event, .. }) = m {
            // Names come out bounded by the input.
            assert!(event.family_name().len() <= data.len());
        }
    }
    // Every yielded message consumed ≥ 16 bytes, except a final error.
    assert!(n <= data.len() / 16 + 1);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(cfg) = GenlConfig::from_constants_str(text, Path::new("fuzz.yml")) {
            assert!(!cfg.family.is_empty() && cfg.family.len() < genl::GENL_NAMSIZ);
            assert!(!cfg.group.is_empty() && cfg.group.len() < genl::GENL_NAMSIZ);
        }
    }
});
