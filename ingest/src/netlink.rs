//! Netlink framing of HFT data: each netlink message is nlmsghdr (16 B, host byte order) +
//! genlmsghdr (4 B) + raw concatenated IPFIX messages; several netlink messages may share one
//! datagram, each padded to 4 bytes. Pure functions: the socket lives in [`crate::sys`].
//! Header lengths are `stel_ebpf_common`'s (the kernel filter parses the same bytes).

use stel_ebpf_common as wire;

/// nlmsghdr length.
pub const NLMSG_HDRLEN: usize = wire::NLMSG_HDRLEN as usize;
/// genlmsghdr length.
pub const GENL_HDRLEN: usize = wire::GENL_HDRLEN as usize;
/// Headers before the IPFIX payload.
pub const HEADERS_LEN: usize = NLMSG_HDRLEN + GENL_HDRLEN;
// The kernel filter's offsets agree with this framing (checked at compile time).
const _: () = assert!(wire::IPFIX_VERSION_OFFSET as usize == HEADERS_LEN);
const _: () =
    assert!(wire::FIRST_SET_ID_OFFSET as usize == HEADERS_LEN + crate::ipfix::MESSAGE_HEADER_LEN);
/// Largest netlink message a sender should send (`stel_ebpf_common::MAX_NETLINK_MESSAGE`).
pub const MAX_NETLINK_MESSAGE: usize = wire::MAX_NETLINK_MESSAGE as usize;
/// Largest IPFIX payload in one netlink message.
pub const MAX_IPFIX_PAYLOAD: usize = wire::MAX_IPFIX_PAYLOAD as usize;
const _: () = assert!(MAX_IPFIX_PAYLOAD == MAX_NETLINK_MESSAGE - HEADERS_LEN);
/// nlmsg_type used on NETLINK_USERSOCK (first non-control type).
pub const USERSOCK_MSG_TYPE: u16 = 0x10;
/// Control message types below this carry no payload for us (NOOP, ERROR, DONE, OVERRUN).
pub const NLMSG_MIN_TYPE: u16 = wire::NLMSG_MIN_TYPE;

/// How the units the reader hands over are framed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnitFraming {
    /// Netlink datagrams: nlmsghdr + genlmsghdr + IPFIX, several messages per datagram (the
    /// sockets, raw netlink recordings, nlmon captures).
    #[default]
    Netlink,
    /// Raw IPFIX messages, concatenated (IPFIX files, UDP payloads of captures).
    Ipfix,
    /// INT telemetry reports (UDP payloads of captures to an INT port): the daemon hands them to
    /// the INT decoder, never to `pipeline::Pipeline::dispatch`.
    Int,
}

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

/// What splitting a datagram found besides payloads. Each bad header is counted once, under
/// one reason, and ends the datagram: its length is the only way to find the next header, so
/// nothing after a bad one can be trusted (the bytes left are counted in `discarded_bytes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FrameErrors {
    /// Headers whose `nlmsg_len` is below 20 (nlmsghdr + genlmsghdr), 0 included.
    pub length_too_small: u64,
    /// Headers whose `nlmsg_len` runs past the end of the datagram.
    pub length_past_datagram: u64,
    /// Datagrams ending in 1–15 bytes: too few for another nlmsghdr (NLMSG_ALIGN padding never
    /// leaves bytes after the last message, so these are damage, not padding).
    pub trailing_bytes: u64,
    /// Bytes left unread because of the three above.
    pub discarded_bytes: u64,
    /// Control messages (type < 0x10: NOOP, ERROR, DONE, OVERRUN) skipped. Not malformed.
    pub control: u64,
}

impl FrameErrors {
    /// Malformed framing events (control messages are not malformed).
    pub fn malformed(&self) -> u64 {
        self.length_too_small + self.length_past_datagram + self.trailing_bytes
    }

    /// Field-wise sum.
    pub fn add(&mut self, o: &FrameErrors) {
        self.length_too_small += o.length_too_small;
        self.length_past_datagram += o.length_past_datagram;
        self.trailing_bytes += o.trailing_bytes;
        self.discarded_bytes += o.discarded_bytes;
        self.control += o.control;
    }
}

/// Calls `f` with the IPFIX payload of each netlink message in `datagram`, in order. A bad
/// header ends the walk (see [`FrameErrors`]).
pub fn for_each_payload(datagram: &[u8], errors: &mut FrameErrors, mut f: impl FnMut(&[u8])) {
    let mut off = 0;
    while off < datagram.len() {
        let h = &datagram[off..];
        if h.len() < NLMSG_HDRLEN {
            errors.trailing_bytes += 1;
            errors.discarded_bytes += h.len() as u64;
            return;
        }
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let ty = u16::from_ne_bytes([h[4], h[5]]);
        if len > h.len() {
            errors.length_past_datagram += 1;
            errors.discarded_bytes += h.len() as u64;
            return;
        }
        if ty < NLMSG_MIN_TYPE && len >= NLMSG_HDRLEN {
            // Control messages carry no genl header; only their length must hold.
            errors.control += 1;
        } else if len < HEADERS_LEN {
            errors.length_too_small += 1;
            errors.discarded_bytes += h.len() as u64;
            return;
        } else {
            f(&h[HEADERS_LEN..len]);
        }
        // NLMSG_ALIGN; the padding of the last message may be missing (the kernel trims it).
        off = off.saturating_add((len + 3) & !3);
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
        // Length 0 must not loop, and counts once.
        let mut bad = vec![0u8; 32];
        bad[4] = 0x10;
        for_each_payload(&bad, &mut e, |_| panic!("no payload"));
        assert_eq!(e.length_too_small, 1);
        assert_eq!(e.malformed(), 1);
        assert_eq!(e.discarded_bytes, 32);
    }

    /// nlmsg_len 16..=19 (a header without room for the genl header) ends the datagram: the
    /// message after it is never handed out, and the bad header counts once.
    #[test]
    fn a_short_nlmsg_len_ends_the_datagram() {
        for bad_len in 16u32..20 {
            let mut d = Vec::new();
            frame(&mut d, USERSOCK_MSG_TYPE, 1, b"good");
            let at = d.len();
            d.extend_from_slice(&bad_len.to_ne_bytes());
            d.extend_from_slice(&USERSOCK_MSG_TYPE.to_ne_bytes());
            d.extend_from_slice(&[0; 10]);
            d.extend_from_slice(&[0; 4]);
            frame(&mut d, USERSOCK_MSG_TYPE, 3, b"after the bad header");
            let mut got = Vec::new();
            let mut e = FrameErrors::default();
            for_each_payload(&d, &mut e, |p| got.push(p.to_vec()));
            assert_eq!(got, vec![b"good".to_vec()], "nlmsg_len {bad_len}");
            assert_eq!(e.length_too_small, 1, "nlmsg_len {bad_len}");
            assert_eq!(e.malformed(), 1);
            assert_eq!(e.discarded_bytes, (d.len() - at) as u64);
        }
    }

    #[test]
    fn trailing_bytes_are_counted() {
        for extra in 1..16 {
            let mut d = Vec::new();
            frame(&mut d, USERSOCK_MSG_TYPE, 1, b"abcd");
            d.extend(std::iter::repeat_n(0xee, extra));
            let mut n = 0;
            let mut e = FrameErrors::default();
            for_each_payload(&d, &mut e, |_| n += 1);
            assert_eq!(n, 1);
            assert_eq!(e.trailing_bytes, 1);
            assert_eq!(e.discarded_bytes, extra as u64);
        }
        // The last message's padding may be missing: not an error.
        let mut d = Vec::new();
        frame(&mut d, USERSOCK_MSG_TYPE, 1, b"abc");
        d.pop();
        let mut e = FrameErrors::default();
        for_each_payload(&d, &mut e, |p| assert_eq!(p, b"abc"));
        assert_eq!(e, FrameErrors::default());
    }
}
