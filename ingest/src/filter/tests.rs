//! The decision rule, without a kernel: every verdict, the several-templates case, the bounded
//! walk, and garbage that must never panic. The same function runs in the kernel program;
//! `ingest/tests/filter.rs` checks the two agree on real datagrams.

use super::*;
use crate::{
    ipfix::SeqMode,
    netlink::{self, USERSOCK_MSG_TYPE},
};
use stel_emu::{Encoder, HftField, HftTemplate};

fn tpl(tid: u16) -> HftTemplate {
    HftTemplate {
        template_id: tid,
        fields: vec![HftField {
            label: 1,
            object_type: 1,
            stat_id: 4,
        }],
        width: 8,
    }
}

fn data(tid: u16) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new(0, SeqMode::PerMessage).data_message(
        &mut out,
        0,
        &tpl(tid),
        [(1u64, &[7u64][..]), (2, &[8][..])],
    );
    out
}

fn template(tid: u16) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new(0, SeqMode::PerMessage).template_message(&mut out, 0, &[tpl(tid)]);
    out
}

/// One IPFIX message holding the given sets (id, body length).
fn message(sets: &[(u16, usize)]) -> Vec<u8> {
    let mut m = vec![0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    for &(id, body) in sets {
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(&((body + 4) as u16).to_be_bytes());
        m.extend(std::iter::repeat_n(0xAB, body));
    }
    let l = m.len() as u16;
    m[2..4].copy_from_slice(&l.to_be_bytes());
    m
}

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    netlink::frame(&mut d, USERSOCK_MSG_TYPE, 1, payload);
    d
}

fn set(ids: &[u16]) -> TemplateSet {
    let mut s = TemplateSet::new();
    for &i in ids {
        s.insert(i);
    }
    s
}

/// Checks both framings agree (one netlink message per datagram) and returns the verdict.
fn both(payload: &[u8], reg: &TemplateSet) -> Verdict {
    let p = payload_verdict(payload, reg);
    let d = datagram_verdict(&framed(payload), reg);
    assert_eq!(p, d, "payload and datagram framing disagree");
    p
}

#[test]
fn data_of_registered_templates_is_kept_and_unregistered_dropped() {
    assert_eq!(both(&data(256), &set(&[256])), Verdict::Registered);
    assert_eq!(both(&data(256), &set(&[257])), Verdict::Drop);
    assert_eq!(both(&data(300), &TemplateSet::new()), Verdict::Drop);
    assert_eq!(
        both(&data(u16::MAX), &set(&[u16::MAX])),
        Verdict::Registered
    );
}

#[test]
fn template_and_options_template_sets_are_always_kept() {
    assert_eq!(both(&template(256), &TemplateSet::new()), Verdict::Template);
    assert_eq!(
        both(&message(&[(3, 12)]), &TemplateSet::new()),
        Verdict::Template
    );
    // A template set after an unregistered data set in the same message.
    assert_eq!(
        both(&message(&[(400, 8), (2, 12)]), &TemplateSet::new()),
        Verdict::Template
    );
}

#[test]
fn several_templates_in_one_message_kept_if_any_is_registered() {
    let m = message(&[(256, 8), (257, 16), (258, 0)]);
    assert_eq!(both(&m, &set(&[258])), Verdict::Registered);
    assert_eq!(both(&m, &set(&[256])), Verdict::Registered);
    assert_eq!(both(&m, &set(&[999])), Verdict::Drop);
    // Several IPFIX messages in one payload: the same rule across messages.
    let mut two = data(256);
    two.extend_from_slice(&data(257));
    assert_eq!(both(&two, &set(&[257])), Verdict::Registered);
    assert_eq!(both(&two, &set(&[1000])), Verdict::Drop);
}

#[test]
fn non_ipfix_and_too_short_are_kept() {
    let mut v9 = data(256);
    v9[1] = 9;
    assert_eq!(both(&v9, &TemplateSet::new()), Verdict::NotIpfix);
    for n in [0, 1, 15, 19] {
        assert_eq!(
            both(&data(256)[..n], &TemplateSet::new()),
            Verdict::TooShort,
            "{n}"
        );
    }
    // Datagram shorter than an nlmsghdr.
    assert_eq!(
        datagram_verdict(&[0; 15], &TemplateSet::new()),
        Verdict::TooShort
    );
    // A netlink control message (NLMSG_DONE) carrying what looks like unregistered data.
    let mut d = Vec::new();
    netlink::frame(&mut d, 3, 1, &data(256));
    assert_eq!(datagram_verdict(&d, &TemplateSet::new()), Verdict::NotIpfix);
}

#[test]
fn malformed_lengths_are_kept_for_the_decoder_to_count() {
    let empty = TemplateSet::new();
    // Set length past the message.
    let mut m = data(256);
    m[18..20].copy_from_slice(&0xFFF0u16.to_be_bytes());
    assert_eq!(both(&m, &empty), Verdict::Malformed);
    // Set length < 4.
    m[18..20].copy_from_slice(&2u16.to_be_bytes());
    assert_eq!(both(&m, &empty), Verdict::Malformed);
    // Message length past the payload.
    let mut m = data(256);
    let l = m.len() as u16 + 1;
    m[2..4].copy_from_slice(&l.to_be_bytes());
    assert_eq!(both(&m, &empty), Verdict::Malformed);
    // Trailing bytes after the last message.
    let mut m = data(256);
    m.extend_from_slice(&[0; 5]);
    assert_eq!(both(&m, &empty), Verdict::Malformed);
    // Reserved set ID.
    assert_eq!(both(&message(&[(100, 4)]), &empty), Verdict::Malformed);
    // Netlink length past the datagram.
    let mut d = framed(&data(256));
    let l = d.len() as u32 + 8;
    d[..4].copy_from_slice(&l.to_ne_bytes());
    assert_eq!(datagram_verdict(&d, &empty), Verdict::Malformed);
}

#[test]
fn the_walk_is_bounded_and_keeps_what_it_cannot_finish() {
    let empty = TemplateSet::new();
    // nlmsghdr (counted in both framings) + IPFIX header + 14 sets = 16 headers: fully walked.
    let sets: Vec<(u16, usize)> = (0..14).map(|i| (300 + i, 0)).collect();
    assert_eq!(both(&message(&sets), &empty), Verdict::Drop);
    // One more: not walked to the end, kept.
    let sets: Vec<(u16, usize)> = (0..15).map(|i| (300 + i, 0)).collect();
    assert_eq!(both(&message(&sets), &empty), Verdict::Unwalked);
    // ... unless a registered set comes within the bound.
    assert_eq!(both(&message(&sets), &set(&[305])), Verdict::Registered);
}

#[test]
fn several_netlink_messages_in_one_datagram() {
    let mut d = framed(&data(256));
    netlink::frame(&mut d, USERSOCK_MSG_TYPE, 2, &data(257)[..37]); // 37: unaligned, padded
    let mut ok = framed(&data(256));
    netlink::frame(&mut ok, USERSOCK_MSG_TYPE, 2, &data(257));
    let empty = TemplateSet::new();
    assert_eq!(datagram_verdict(&ok, &empty), Verdict::Drop);
    assert_eq!(datagram_verdict(&ok, &set(&[257])), Verdict::Registered);
    // The second message's IPFIX length now runs past its netlink message.
    assert_eq!(datagram_verdict(&d, &empty), Verdict::Malformed);
    // A control message after a data message.
    let mut c = framed(&data(256));
    netlink::frame(&mut c, 3, 2, &[]);
    assert_eq!(datagram_verdict(&c, &empty), Verdict::NotIpfix);
}

#[test]
fn garbage_never_panics_and_every_prefix_is_classified() {
    let reg = set(&[256]);
    let mut msg = framed(&data(256));
    let n = msg.len();
    netlink::frame(&mut msg, USERSOCK_MSG_TYPE, 2, &template(300));
    for cut in 0..=msg.len() {
        let _ = datagram_verdict(&msg[..cut], &reg);
        let _ = payload_verdict(&msg[netlink::HEADERS_LEN.min(cut)..cut], &reg);
    }
    assert_eq!(datagram_verdict(&msg[..n], &reg), Verdict::Registered);
    // xorshift: deterministic pseudo-random bytes and mutations.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let mut m = msg.clone();
        for _ in 0..(next() % 4 + 1) {
            let i = (next() as usize) % m.len();
            m[i] = next() as u8;
        }
        let cut = (next() as usize) % (m.len() + 1);
        let v = datagram_verdict(&m[..cut], &reg);
        let _ = payload_verdict(&m[..cut], &reg);
        // Dropping needs a complete, well-formed walk: a datagram cut inside a set never drops.
        if cut < n && cut > netlink::HEADERS_LEN {
            assert!(v.keep(), "{v:?} for a cut datagram");
        }
    }
}

#[test]
fn template_set_bitmap() {
    let mut s = TemplateSet::new();
    assert!(s.insert(0) && s.insert(63) && s.insert(64) && s.insert(u16::MAX));
    assert!(!s.insert(64));
    assert_eq!(s.len(), 4);
    assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 63, 64, u16::MAX]);
    assert!(s.remove(63) && !s.remove(63) && !s.contains(63) && s.contains(64));
    assert_eq!(s.len(), 3);
}

#[test]
fn user_space_filter_counts_and_follows_registration() {
    let mut f = TemplateFilter::user_space();
    assert!(!f.is_kernel());
    assert!(f.fallback_reason().is_some());
    let (d256, d257, t) = (data(256), data(257), template(256));
    assert!(!f.keep(&d256));
    f.register(256).unwrap();
    assert!(f.keep(&d256) && !f.keep(&d257) && f.keep(&t) && f.keep(&[1, 2, 3]));
    f.unregister(256).unwrap();
    assert!(!f.keep(&d256));
    f.unregister(256).unwrap(); // idempotent
    assert_eq!(
        f.stats().unwrap(),
        FilterStats {
            seen: 6,
            kept: 3,
            dropped: 3,
            too_short: 1,
            learned: 0,
            learn_failed: 0,
            last_dropped_set_id: 256,
        }
    );
    assert!(matches!(
        f.register(3),
        Err(FilterError::InvalidTemplateId(3))
    ));
    for t in 0..TEMPLATE_MAP_MAX_ENTRIES as u16 {
        f.register(256 + t).unwrap();
    }
    f.register(256).unwrap(); // already there: fine
    assert!(matches!(
        f.register(256 + 4096),
        Err(FilterError::TooManyTemplates(4096))
    ));
}

/// Policy `learn`: a kept template set registers its IDs (every record of every template and
/// options template set), so the data right behind it passes; withdrawals learn nothing.
#[test]
fn user_space_learn_policy_registers_templates_from_the_stream() {
    let mut f = TemplateFilter::user_space_quiet(3);
    f.set_policy(FilterPolicy::Learn).unwrap();
    assert!(!f.keep(&data(256)), "no template seen yet");
    assert!(f.keep(&template(256)));
    assert!(f.keep(&data(256)));
    // Two records in one set (different field counts, one with enterprise fields).
    let two = message(&[]);
    let mut m = two[..16].to_vec();
    let mut set = vec![0, 2, 0, 0];
    set.extend_from_slice(&[1, 44, 0, 1, 0x01, 0x45, 0, 8]); // 300: one IE
    set.extend_from_slice(&[1, 45, 0, 2, 0x80, 1, 0, 8, 0, 1, 0, 4, 0x01, 0x45, 0, 8]); // 301
    set.extend_from_slice(&[1, 46, 0, 0]); // 302 withdrawn: not learned
    let sl = set.len() as u16;
    set[2..4].copy_from_slice(&sl.to_be_bytes());
    m.extend_from_slice(&set);
    let ml = m.len() as u16;
    m[2..4].copy_from_slice(&ml.to_be_bytes());
    assert!(f.keep(&m));
    assert_eq!(
        f.templates().iter().collect::<Vec<_>>(),
        vec![256, 300, 301]
    );
    assert!(f.keep(&data(301)) && !f.keep(&data(302)));
    // The map is full (3): the next learned ID is refused and counted.
    assert!(f.keep(&template(999)));
    assert!(!f.keep(&data(999)));
    let st = f.stats().unwrap();
    assert_eq!((st.learned, st.learn_failed), (3, 1));
    assert_eq!(st.last_dropped_set_id, 999);
}
