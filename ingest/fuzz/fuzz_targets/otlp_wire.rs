//! Arbitrary bytes through the OTLP sink's protobuf readers: a collector's
//! `ExportMetricsServiceResponse` (parse_response) and the bench receiver's request walker
//! (count_points). Neither may panic or loop; what they count is bounded by the input.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stel_store::otlp::{count_points, encode_response, parse_response};

fuzz_target!(|data: &[u8]| {
    if let Some((_, msg)) = parse_response(data) {
        assert!(msg.len() <= data.len() * 3);
    }
    if let Some((points, _)) = count_points(data) {
        // Every data point takes at least two bytes (its tag and length).
        assert!(points as usize <= data.len() / 2);
    }
    // What we encode, we read back.
    let n = data.len() as u64;
    let text = String::from_utf8_lossy(data);
    assert_eq!(
        parse_response(&encode_response(n, &text)),
        Some((n, text.into_owned()))
    );
});
