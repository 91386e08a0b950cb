//! Netlink framing of HFT data: each netlink message is nlmsghdr (16 B, host byte order) +
//! genlmsghdr (4 B) + raw concatenated IPFIX messages; several netlink messages may share one
//! datagram, each padded to 4 bytes. Pure functions: the socket lives in [`crate::sys`].

/// nlmsghdr length.
pub const NLMSG_HDRLEN: usize = 16;
/// genlmsghdr length.
pub const GENL_HDRLEN: usize = 4;
/// Headers before the IPFIX payload.
pub const HEADERS_LEN: usize = NLMSG_HDRLEN + GENL_HDRLEN;
/// Largest netlink message we send: a 65,536-byte message is charged 131,328 bytes of receive
/// buffer by the kernel, so stay below 64 KiB − 320 B (measured; see DESIGN.md).
pub const MAX_NETLINK_MESSAGE: usize = 65536 - 320;
/// Largest IPFIX payload in one netlink message.
pub const MAX_IPFIX_PAYLOAD: usize = MAX_NETLINK_MESSAGE - HEADERS_LEN;
/// nlmsg_type used on NETLINK_USERSOCK (first non-control type).
pub const USERSOCK_MSG_TYPE: u16 = 0x10;
/// Control message types below this carry no payload for us (NOOP, ERROR, DONE, OVERRUN).
pub const NLMSG_MIN_TYPE: u16 = 0x10;

/// Appends one netlink message carrying `payload` (genl command 0, version 1), padded to 4 bytes.
pub fn frame(out: &mut Vec<u8>, msg_type: u16, seq: u32, payload: &[u8]) {
    let len = (HEADERS_LEN + payload.len()) as u32;
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&msg_type.to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes()); // flags
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // pid
    out.extend_from_slice(&[0, 1, 0, 0]); // genl cmd, version, reserved
    out.extend_from_slice(payload);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// What splitting a datagram found besides payloads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameErrors {
    /// A header whose length is < 20 or runs past the datagram (the rest is dropped).
    pub bad_length: u64,
    /// Control messages (type < 0x10) skipped.
    pub control: u64,
}

/// Calls `f` with the IPFIX payload of each netlink message in `datagram`.
pub fn for_each_payload(datagram: &[u8], errors: &mut FrameErrors, mut f: impl FnMut(&[u8])) {
    let mut off = 0;
    while datagram.len() - off >= NLMSG_HDRLEN {
        let h = &datagram[off..];
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let ty = u16::from_ne_bytes([h[4], h[5]]);
        if len < NLMSG_HDRLEN || len > h.len() {
            errors.bad_length += 1;
            return;
        }
        if ty < NLMSG_MIN_TYPE {
            errors.control += 1;
        } else if len < HEADERS_LEN {
            errors.bad_length += 1;
        } else {
            f(&h[HEADERS_LEN..len]);
        }
        off += (len + 3) & !3;
        if off > datagram.len() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_lengths_stop() {
        let mut d = Vec::new();
        frame(&mut d, USERSOCK_MSG_TYPE, 1, b"abc");
        frame(&mut d, USERSOCK_MSG_TYPE, 2, b"defgh");
        let mut got = Vec::new();
        let mut e = FrameErrors::default();
        for_each_payload(&d, &mut e, |p| got.push(p.to_vec()));
        assert_eq!(got, vec![b"abc".to_vec(), b"defgh".to_vec()]);
        assert_eq!(e, FrameErrors::default());
        // Length 0 must not loop.
        let mut bad = vec![0u8; 32];
        bad[4] = 0x10;
        for_each_payload(&bad, &mut e, |_| panic!("no payload"));
        assert_eq!(e.bad_length, 1);
    }
}
