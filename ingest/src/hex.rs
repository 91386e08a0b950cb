//! Hex text of bytes (session files, STATE_DB's tolerated hex `session_config`): one encoder
//! and one decoder for the crate and its binaries.

/// Lowercase hex of `b`.
pub(crate) fn encode(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        s.push(DIGITS[(x >> 4) as usize] as char);
        s.push(DIGITS[(x & 15) as usize] as char);
    }
    s
}

/// The bytes of an even-length run of ASCII hex digits (either case); `None` for anything
/// else (odd length, a non-hex or non-ASCII character).
pub(crate) fn decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    b.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_rejects() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(super::decode(&super::encode(&all)), Some(all));
        assert_eq!(super::decode("0aFF"), Some(vec![10, 255]));
        assert_eq!(super::decode(""), Some(vec![]));
        for bad in ["0", "0g", "aé1", "éé", "0x00"] {
            assert_eq!(super::decode(bad), None, "{bad}");
        }
    }
}
