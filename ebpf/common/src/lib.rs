//! stel-ebpf-common: the names, sizes, `#[repr(C)]` layouts **and the filter decision** the stel
//! socket filter (kernel side, `ebpf/prog`) and user space (`stel_ingest::filter`) share, so both
//! sides agree by construction.
//!
//! # The decision
//! [`classify`] walks a netlink datagram ([`Framing::Netlink`], what the kernel filter sees: the
//! skb starts at the first nlmsghdr) or one IPFIX payload ([`Framing::Ipfix`], what the user-space
//! reader hands over after splitting a datagram) and returns a [`Verdict`]. The kernel program and
//! the user-space fallback call this same generic function, each with its own byte source
//! ([`Packet`]) and template lookup (BPF hash map / bitmap).
//!
//! A message is **dropped only when the walk understood every byte and found nothing but data sets
//! of unregistered templates**. Anything else is kept:
//! - too short to hold an IPFIX header and one set header ([`Verdict::TooShort`]);
//! - not IPFIX: a netlink control message (type < 0x10) or an IPFIX version other than 10
//!   ([`Verdict::NotIpfix`]);
//! - a template (2) or options template (3) set anywhere in the walk ([`Verdict::Template`]): the
//!   decoder must see every template;
//! - a data set whose template ID is registered ([`Verdict::Registered`]);
//! - malformed lengths, reserved set IDs (4..=255), a message without data sets
//!   ([`Verdict::Malformed`]): the user-space decoder counts these, the filter must not hide them;
//! - more headers than the bounded walk reads ([`Verdict::Unwalked`]).
//!
//! **Several templates in one message** (one IPFIX message with data sets of several template
//! IDs, or several IPFIX / netlink messages in one datagram): the message is kept when *any* of
//! its data sets is registered. A socket filter can only keep or drop a whole datagram, and cutting
//! the registered sets out would need a copy; the user-space decoder counts the unregistered sets
//! as unknown-template data, exactly as if no filter had run.
//!
//! # Policies
//! A small config map ([`CONFIG_MAP`], set by user space) selects the policy:
//! - [`POLICY_REGISTERED`] (SONiC with STATE_DB): only the registered template IDs pass (the
//!   seed's "discard" rule).
//! - [`POLICY_LEARN`] (every other source): the same rule, but a template set the filter keeps
//!   also registers its template IDs ([`learn_templates`]) — in the kernel, in the sender's
//!   context, before the next datagram is filtered — so data sent right after its template is
//!   never dropped for want of a registration. Learned IDs are stored as [`TEMPLATE_LEARNED`]
//!   (a registration by user space overwrites them with [`TEMPLATE_REGISTERED`]).
//!
//! Because the kernel filter decides per datagram while the user-space fallback decides per
//! netlink payload, the two agree exactly on datagrams carrying one netlink message (what SONiC's
//! genetlink path and `stel-emu` send); with several messages per datagram the kernel keeps the
//! whole datagram if any one is kept, and the decoder counts the rest as unknown-template.
#![no_std]

/// Name of the BPF hash map of registered template IDs (key: u16 template ID, value: u8 1).
pub const TEMPLATE_MAP: &str = "STEL_TEMPLATES";
/// Most template IDs the map holds (the user-space fallback enforces the same limit).
pub const TEMPLATE_MAP_MAX_ENTRIES: u32 = 4096;
/// Value stored for a registered template ID.
pub const TEMPLATE_REGISTERED: u8 = 1;
/// Value stored for a template ID the filter learned from a template set ([`POLICY_LEARN`]).
pub const TEMPLATE_LEARNED: u8 = 2;
/// Name of the config array (key: u32 index, value: u32); index [`CONFIG_POLICY`] holds the
/// policy.
pub const CONFIG_MAP: &str = "STEL_FILTER_CONFIG";
/// Entries of [`CONFIG_MAP`].
pub const CONFIG_MAP_ENTRIES: u32 = 1;
/// Index of the policy in [`CONFIG_MAP`].
pub const CONFIG_POLICY: u32 = 0;
/// Policy: only registered templates pass (SONiC; STATE_DB registers them).
pub const POLICY_REGISTERED: u32 = 0;
/// Policy: templates seen on the socket are registered by the filter itself.
pub const POLICY_LEARN: u32 = 1;
/// Most units (netlink / IPFIX / set / template record headers, field specifiers) one
/// [`learn_templates`] walk reads: the template records of template sets with up to ~16,000
/// fields between them (one HFT template of 64 ports × 30 stats has 1,921); what lies beyond is
/// not learned by the filter (the decoder still sees the template: template sets are always
/// kept). The kernel runs the steps under `bpf_loop` (kernel ≥ 5.17), so the bound costs the
/// verifier nothing.
pub const MAX_LEARN_STEPS: u32 = 16384;
/// `BPF_NOEXIST`: insert only if the key is absent (a learned ID never overwrites a registered one).
pub const BPF_NOEXIST: u64 = 1;
/// Name of the per-CPU stats array.
pub const STATS_MAP: &str = "STEL_FILTER_STATS";
/// Entries of the per-CPU stats array (one [`FilterStats`] per CPU at index [`STATS_INDEX`]).
pub const STATS_MAP_ENTRIES: u32 = 1;
/// Index of the [`FilterStats`] entry in [`STATS_MAP`].
pub const STATS_INDEX: u32 = 0;
/// Name of the socket filter program in the object file.
pub const PROGRAM_NAME: &str = "stel_template_filter";
/// Offset of the IPFIX version in the skb a netlink socket filter sees (nlmsghdr 16 + genl 4).
pub const IPFIX_VERSION_OFFSET: u32 = 20;
/// Offset of the first set ID (IPFIX header is 16 bytes).
pub const FIRST_SET_ID_OFFSET: u32 = 36;

/// nlmsghdr length (host byte order fields).
pub const NLMSG_HDRLEN: u32 = 16;
/// genlmsghdr length.
pub const GENL_HDRLEN: u32 = 4;
/// Largest netlink message a sender should send: a 65,536-byte message is charged 131,328 bytes of
/// receive buffer by the kernel, so stay below 64 KiB − 320 B (measured; see DESIGN.md).
pub const MAX_NETLINK_MESSAGE: u32 = 65536 - 320;
/// Largest IPFIX payload in one netlink message of at most [`MAX_NETLINK_MESSAGE`] bytes.
pub const MAX_IPFIX_PAYLOAD: u32 = MAX_NETLINK_MESSAGE - NLMSG_HDRLEN - GENL_HDRLEN;
/// Control netlink message types (NOOP, ERROR, DONE, OVERRUN) are below this.
pub const NLMSG_MIN_TYPE: u16 = 0x10;
/// IPFIX version.
pub const IPFIX_VERSION: u16 = 10;
/// IPFIX message header length.
pub const IPFIX_HEADER_LEN: u32 = 16;
/// IPFIX set header length.
pub const SET_HEADER_LEN: u32 = 4;
/// Set ID of a template set.
pub const TEMPLATE_SET_ID: u16 = 2;
/// Set ID of an options template set.
pub const OPTIONS_TEMPLATE_SET_ID: u16 = 3;
/// Smallest data set ID (template ID).
pub const MIN_DATA_SET_ID: u16 = 256;
/// Most headers (nlmsghdr, IPFIX message header or set header) one walk reads; a payload walk
/// ([`Framing::Ipfix`]) counts its netlink header too. One netlink message with one IPFIX message
/// of one data set (what SONiC and `stel-emu` send) takes three; 16 leaves room for 14 sets in one
/// message, or several messages, while keeping the verifier's work small.
pub const MAX_HEADERS: u32 = 16;

/// Per-CPU filter counters (kernel) / filter counters (user-space fallback).
///
/// `seen = kept + dropped`; `too_short` counts the kept messages that were too short to classify
/// (a subset of `kept`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterStats {
    pub seen: u64,
    pub kept: u64,
    pub dropped: u64,
    pub too_short: u64,
    /// Template IDs registered by the filter itself ([`POLICY_LEARN`]).
    pub learned: u64,
    /// Learned IDs the map refused (full: more than its max entries).
    pub learn_failed: u64,
    /// Set ID of the first data set of the last dropped message (0: none yet): what the
    /// "nothing decoded" warning names.
    pub last_dropped_set_id: u64,
}

const _: () = assert!(core::mem::size_of::<FilterStats>() == 56);

// SAFETY: FilterStats is `#[repr(C)]`, seven u64 and no padding (size asserted above), so every bit
// pattern is a valid value and it can be copied to and from BPF map memory.
#[cfg(feature = "user")]
unsafe impl aya::Pod for FilterStats {}

impl FilterStats {
    /// Counts one verdict.
    #[inline(always)]
    pub fn count(&mut self, v: Verdict) {
        self.seen += 1;
        if v.keep() {
            self.kept += 1;
        } else {
            self.dropped += 1;
        }
        if matches!(v, Verdict::TooShort) {
            self.too_short += 1;
        }
    }

    /// Field-wise sum (per-CPU values → total).
    #[inline]
    pub fn add(&mut self, o: &FilterStats) {
        self.seen += o.seen;
        self.kept += o.kept;
        self.dropped += o.dropped;
        self.too_short += o.too_short;
        self.learned += o.learned;
        self.learn_failed += o.learn_failed;
        if o.last_dropped_set_id != 0 {
            self.last_dropped_set_id = o.last_dropped_set_id;
        }
    }
}

/// What the filter decided, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Too short for an IPFIX header and one set header: kept (the decoder counts it).
    TooShort,
    /// A netlink control message or an IPFIX version other than 10: kept.
    NotIpfix,
    /// Holds a template or options template set: kept.
    Template,
    /// Holds a data set of a registered template: kept.
    Registered,
    /// Lengths that do not add up, a reserved set ID, or no data set: kept (the decoder counts it).
    Malformed,
    /// More headers than [`MAX_HEADERS`] without a reason to keep or a complete walk: kept.
    Unwalked,
    /// Every set is a data set of an unregistered template: dropped.
    Drop,
}

impl Verdict {
    /// Whether the message is kept.
    #[inline(always)]
    pub fn keep(self) -> bool {
        !matches!(self, Verdict::Drop)
    }
}

/// Where [`classify`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// At an nlmsghdr: a whole datagram, possibly several netlink messages (the kernel filter).
    Netlink,
    /// At an IPFIX message header: one netlink message's payload (user space).
    Ipfix,
}

/// Bytes the walk reads: the skb in the kernel (`bpf_skb_load_bytes`), a slice in user space.
pub trait Packet {
    /// Total length.
    fn packet_len(&self) -> u32;
    /// Two bytes at `off`, or `None` if they are not there.
    fn load2(&self, off: u32) -> Option<[u8; 2]>;
    /// Four bytes at `off`, or `None` if they are not there.
    fn load4(&self, off: u32) -> Option<[u8; 4]>;
}

impl Packet for [u8] {
    #[inline]
    fn packet_len(&self) -> u32 {
        // Netlink datagrams are far below 4 GiB; saturate rather than wrap.
        u32::try_from(<[u8]>::len(self)).unwrap_or(u32::MAX)
    }

    #[inline]
    fn load2(&self, off: u32) -> Option<[u8; 2]> {
        let o = off as usize;
        match self.get(o..o.checked_add(2)?) {
            Some(&[a, b]) => Some([a, b]),
            _ => None,
        }
    }

    #[inline]
    fn load4(&self, off: u32) -> Option<[u8; 4]> {
        let o = off as usize;
        match self.get(o..o.checked_add(4)?) {
            Some(&[a, b, c, d]) => Some([a, b, c, d]),
            _ => None,
        }
    }
}

/// Classifies a datagram or payload (see the crate docs). `registered(tid)` says whether data
/// sets with ID `tid` (≥ 256) are wanted. Reads at most [`MAX_HEADERS`] headers; never panics;
/// every loop is bounded by a constant (the BPF verifier needs that).
#[inline(always)]
pub fn classify<P, R>(p: &P, framing: Framing, registered: R) -> Verdict
where
    P: Packet + ?Sized,
    R: Fn(u16) -> bool,
{
    let len = p.packet_len();
    let min = match framing {
        Framing::Netlink => NLMSG_HDRLEN,
        Framing::Ipfix => IPFIX_HEADER_LEN + SET_HEADER_LEN,
    };
    if len < min {
        return Verdict::TooShort;
    }
    // Walk state. `nl_end`: end of the current netlink message's bytes (unaligned); `next_nl`:
    // where the next nlmsghdr starts; `msg_end`: end of the current IPFIX message. `pos` is the
    // next header to read: a set header while `pos < msg_end`, an IPFIX header while
    // `pos < nl_end`, else an nlmsghdr (or the end).
    let (mut pos, mut nl_end, mut next_nl) = match framing {
        Framing::Netlink => (0u32, 0u32, 0u32),
        Framing::Ipfix => (0, len, len),
    };
    let mut msg_end = 0u32;
    let mut data_sets = 0u32;
    // The bound counts the nlmsghdr in both framings, so a payload and the one-message datagram
    // carrying it get the same verdict.
    let mut i = match framing {
        Framing::Netlink => 0,
        Framing::Ipfix => 1,
    };
    while i < MAX_HEADERS {
        i += 1;
        if pos < msg_end {
            // A set header inside the current IPFIX message.
            let (Some(id), Some(sl)) = (p.load2(pos), p.load2(pos + 2)) else {
                return Verdict::Malformed;
            };
            let id = u16::from_be_bytes(id);
            let sl = u16::from_be_bytes(sl) as u32;
            if sl < SET_HEADER_LEN || sl > msg_end - pos {
                return Verdict::Malformed;
            }
            if id == TEMPLATE_SET_ID || id == OPTIONS_TEMPLATE_SET_ID {
                return Verdict::Template;
            }
            if id < MIN_DATA_SET_ID {
                return Verdict::Malformed;
            }
            if registered(id) {
                return Verdict::Registered;
            }
            data_sets += 1;
            pos += sl;
        } else if pos < nl_end {
            // An IPFIX message header inside the current netlink payload (`pos == msg_end`: set
            // lengths never run past their message).
            if nl_end - pos < IPFIX_HEADER_LEN + SET_HEADER_LEN {
                // Trailing bytes too short for a message with a set (a payload that is too short
                // as a whole was caught before the walk).
                return Verdict::Malformed;
            }
            let (Some(v), Some(ml)) = (p.load2(pos), p.load2(pos + 2)) else {
                return Verdict::Malformed;
            };
            if u16::from_be_bytes(v) != IPFIX_VERSION {
                return Verdict::NotIpfix;
            }
            let ml = u16::from_be_bytes(ml) as u32;
            if ml < IPFIX_HEADER_LEN + SET_HEADER_LEN || ml > nl_end - pos {
                return Verdict::Malformed;
            }
            msg_end = pos + ml;
            pos += IPFIX_HEADER_LEN;
        } else {
            // End of the current netlink message (or of the IPFIX payload).
            if pos != nl_end {
                return Verdict::Malformed;
            }
            if next_nl >= len {
                return if data_sets > 0 {
                    Verdict::Drop
                } else {
                    Verdict::Malformed
                };
            }
            // Another nlmsghdr (Framing::Netlink only: in Ipfix framing next_nl == len).
            pos = next_nl;
            if len - pos < NLMSG_HDRLEN {
                return if pos == 0 {
                    Verdict::TooShort
                } else {
                    Verdict::Malformed
                };
            }
            let (Some(l), Some(ty)) = (p.load4(pos), p.load2(pos + 4)) else {
                return Verdict::Malformed;
            };
            let l = u32::from_ne_bytes(l);
            if l < NLMSG_HDRLEN || l > len - pos {
                return Verdict::Malformed;
            }
            if u16::from_ne_bytes(ty) < NLMSG_MIN_TYPE {
                return Verdict::NotIpfix;
            }
            if l < NLMSG_HDRLEN + GENL_HDRLEN + IPFIX_HEADER_LEN + SET_HEADER_LEN {
                return Verdict::TooShort;
            }
            nl_end = pos + l;
            // 4-byte alignment (NLMSG_ALIGN); saturates near u32::MAX, which ends the walk.
            next_nl = nl_end.saturating_add(3) & !3;
            pos += NLMSG_HDRLEN + GENL_HDRLEN;
            msg_end = pos;
        }
    }
    // The bound is reached: done if the last header read ended the datagram / payload.
    if pos == nl_end && next_nl >= len && data_sets > 0 {
        Verdict::Drop
    } else {
        Verdict::Unwalked
    }
}

/// One step of the learn walk ([`LearnWalk::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LearnStep {
    /// Go on.
    Continue,
    /// Learn this template ID, then go on.
    Learn(u16),
    /// Nothing more to learn (the end, or a length that does not add up).
    Done,
}

/// The learn walk's state: a flat state machine that reads one unit (a netlink / IPFIX / set /
/// template record header, or one field specifier) per [`step`](Self::step), so the kernel can
/// run it under `bpf_loop` (its callback is verified once, whatever the number of steps) and
/// user space in a plain loop — the same code either way. `#[repr(C)]` because the kernel keeps
/// it on the BPF stack across callback invocations.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LearnWalk {
    /// Next unit.
    pos: u32,
    /// End of the current template set / IPFIX message / netlink message
    /// (`set_end <= msg_end <= nl_end`).
    set_end: u32,
    msg_end: u32,
    nl_end: u32,
    /// Where the next nlmsghdr starts.
    next_nl: u32,
    /// Field specifiers left in the current template record.
    fields_left: u32,
    /// Packet length.
    len: u32,
    /// 1 inside an options template set (6-byte record headers).
    options: u32,
}

const _: () = assert!(core::mem::size_of::<LearnWalk>() == 32);

impl LearnWalk {
    /// A walk over a packet of `len` bytes in `framing`.
    #[inline(always)]
    pub fn new(len: u32, framing: Framing) -> Self {
        let (nl_end, next_nl) = match framing {
            Framing::Netlink => (0, 0),
            Framing::Ipfix => (len, len),
        };
        Self {
            nl_end,
            next_nl,
            len,
            ..Self::default()
        }
    }

    /// Reads one unit.
    #[inline(always)]
    pub fn step<P: Packet + ?Sized>(&mut self, p: &P) -> LearnStep {
        let len = self.len;
        if self.fields_left > 0 {
            // A field specifier: 4 bytes, 8 with an enterprise number.
            let Some(id) = p.load2(self.pos) else {
                return LearnStep::Done;
            };
            self.pos += 4 + (((u16::from_be_bytes(id) >> 15) as u32) << 2);
            self.fields_left -= 1;
            if self.pos > self.set_end {
                return LearnStep::Done;
            }
            LearnStep::Continue
        } else if self.pos < self.set_end {
            // A template record header (4 bytes; options: 6 with the scope field count).
            let hdr = 4 + 2 * self.options;
            if self.set_end - self.pos < hdr {
                self.pos = self.set_end; // padding
                return LearnStep::Continue;
            }
            let (Some(tid), Some(n)) = (p.load2(self.pos), p.load2(self.pos + 2)) else {
                return LearnStep::Done;
            };
            let (tid, n) = (u16::from_be_bytes(tid), u16::from_be_bytes(n) as u32);
            if n == 0 {
                // A withdrawal (4 bytes): nothing to learn.
                self.pos += 4;
                return LearnStep::Continue;
            }
            self.pos += hdr;
            self.fields_left = n;
            if tid >= MIN_DATA_SET_ID {
                LearnStep::Learn(tid)
            } else {
                LearnStep::Continue
            }
        } else if self.pos < self.msg_end {
            // A set header: template sets are walked, every other set skipped whole.
            let (Some(id), Some(sl)) = (p.load2(self.pos), p.load2(self.pos + 2)) else {
                return LearnStep::Done;
            };
            let (id, sl) = (u16::from_be_bytes(id), u16::from_be_bytes(sl) as u32);
            if sl < SET_HEADER_LEN || sl > self.msg_end - self.pos {
                return LearnStep::Done;
            }
            if id == TEMPLATE_SET_ID || id == OPTIONS_TEMPLATE_SET_ID {
                self.options = (id == OPTIONS_TEMPLATE_SET_ID) as u32;
                self.set_end = self.pos + sl;
                self.pos += SET_HEADER_LEN;
            } else {
                self.pos += sl;
                self.set_end = self.pos;
            }
            LearnStep::Continue
        } else if self.pos < self.nl_end {
            // An IPFIX message header.
            if self.nl_end - self.pos < IPFIX_HEADER_LEN {
                return LearnStep::Done;
            }
            let (Some(v), Some(ml)) = (p.load2(self.pos), p.load2(self.pos + 2)) else {
                return LearnStep::Done;
            };
            let ml = u16::from_be_bytes(ml) as u32;
            if u16::from_be_bytes(v) != IPFIX_VERSION
                || ml < IPFIX_HEADER_LEN
                || ml > self.nl_end - self.pos
            {
                return LearnStep::Done;
            }
            self.msg_end = self.pos + ml;
            self.pos += IPFIX_HEADER_LEN;
            self.set_end = self.pos;
            LearnStep::Continue
        } else {
            // The next netlink message (Framing::Netlink only).
            if self.next_nl >= len || len - self.next_nl < NLMSG_HDRLEN {
                return LearnStep::Done;
            }
            let pos = self.next_nl;
            let (Some(l), Some(ty)) = (p.load4(pos), p.load2(pos + 4)) else {
                return LearnStep::Done;
            };
            let l = u32::from_ne_bytes(l);
            if l < NLMSG_HDRLEN + GENL_HDRLEN || l > len - pos {
                return LearnStep::Done;
            }
            self.next_nl = (pos + l).saturating_add(3) & !3;
            if u16::from_ne_bytes(ty) < NLMSG_MIN_TYPE {
                // A control message: skip it (the next step reads the header at next_nl).
                self.pos = pos;
                self.nl_end = pos;
                self.msg_end = pos;
                self.set_end = pos;
                return LearnStep::Continue;
            }
            self.nl_end = pos + l;
            self.pos = pos + NLMSG_HDRLEN + GENL_HDRLEN;
            self.msg_end = self.pos;
            self.set_end = self.pos;
            LearnStep::Continue
        }
    }
}

/// Calls `learn(tid)` for each template record (template ID ≥ 256 with at least one field) of
/// every template and options template set in a datagram ([`Framing::Netlink`]) or payload
/// ([`Framing::Ipfix`]) — the IDs [`POLICY_LEARN`] registers — within [`MAX_LEARN_STEPS`]
/// [`LearnWalk`] steps. It stops quietly at the bound or at the first length that does not add
/// up (the decoder counts malformed input; learning only needs what is well formed).
/// Withdrawals (no fields) are not learned, and nothing is ever unlearned here. The kernel runs
/// the same steps under `bpf_loop`.
#[inline(always)]
pub fn learn_templates<P, L>(p: &P, framing: Framing, mut learn: L)
where
    P: Packet + ?Sized,
    L: FnMut(u16),
{
    let mut w = LearnWalk::new(p.packet_len(), framing);
    let mut i = 0;
    while i < MAX_LEARN_STEPS {
        i += 1;
        match w.step(p) {
            LearnStep::Continue => {}
            LearnStep::Learn(t) => learn(t),
            LearnStep::Done => return,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The INT report filter (UDP sockets of `[int]`).
// ---------------------------------------------------------------------------------------------

/// Name of the INT socket filter program in the object file.
pub const INT_PROGRAM_NAME: &str = "stel_int_filter";
/// Name of the INT filter's config array (key: u32 index, value: u32).
pub const INT_CONFIG_MAP: &str = "STEL_INT_CONFIG";
/// Entries of [`INT_CONFIG_MAP`].
pub const INT_CONFIG_ENTRIES: u32 = 2;
/// Index of the accepted report versions in [`INT_CONFIG_MAP`]: bit `v` set = Telemetry Report
/// `Ver` nibble `v` is accepted (0 = v0.5, 1 = v1.0, 2 = v2.0). A missing entry accepts all.
pub const INT_CONFIG_VERSIONS: u32 = 0;
/// Index of the flags in [`INT_CONFIG_MAP`].
pub const INT_CONFIG_FLAGS: u32 = 1;
/// Flag: accept only senders listed in [`INT_SOURCES_MAP`].
pub const INT_FLAG_SOURCES: u32 = 1;
/// Name of the hash map of accepted senders (key: IPv6 address or IPv4 mapped into IPv6, as
/// [`int_source_key_v4`]; value: u8 1).
pub const INT_SOURCES_MAP: &str = "STEL_INT_SOURCES";
/// Most senders [`INT_SOURCES_MAP`] holds.
pub const INT_SOURCES_MAX_ENTRIES: u32 = 4096;
/// Name of the INT filter's per-CPU stats array (one [`IntFilterStats`] at [`STATS_INDEX`]).
pub const INT_STATS_MAP: &str = "STEL_INT_STATS";
/// A UDP socket filter sees the skb at the UDP header: the report starts after it.
pub const UDP_HEADER_LEN: u32 = 8;

/// Per-CPU INT filter counters (kernel) / the user-space fallback's counters.
///
/// `seen = kept + dropped_version + dropped_source`; `empty ⊆ kept`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntFilterStats {
    pub seen: u64,
    pub kept: u64,
    /// Reports whose version is not accepted.
    pub dropped_version: u64,
    /// Reports from a sender not in the accepted list.
    pub dropped_source: u64,
    /// Empty datagrams (kept: the decoder counts them).
    pub empty: u64,
}

const _: () = assert!(core::mem::size_of::<IntFilterStats>() == 40);

// SAFETY: IntFilterStats is `#[repr(C)]`, five u64 and no padding (size asserted above), so every
// bit pattern is a valid value and it can be copied to and from BPF map memory.
#[cfg(feature = "user")]
unsafe impl aya::Pod for IntFilterStats {}

impl IntFilterStats {
    /// Counts one verdict.
    #[inline(always)]
    pub fn count(&mut self, v: IntVerdict) {
        self.seen += 1;
        match v {
            IntVerdict::Keep => self.kept += 1,
            IntVerdict::Empty => {
                self.kept += 1;
                self.empty += 1;
            }
            IntVerdict::DropVersion => self.dropped_version += 1,
            IntVerdict::DropSource => self.dropped_source += 1,
        }
    }

    /// Field-wise sum (per-CPU values → total).
    #[inline]
    pub fn add(&mut self, o: &IntFilterStats) {
        self.seen += o.seen;
        self.kept += o.kept;
        self.dropped_version += o.dropped_version;
        self.dropped_source += o.dropped_source;
        self.empty += o.empty;
    }

    /// Datagrams dropped, for any reason.
    #[inline]
    pub fn dropped(&self) -> u64 {
        self.dropped_version + self.dropped_source
    }
}

/// What the INT filter decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntVerdict {
    /// Accepted version (and sender, when checked): kept.
    Keep,
    /// No report byte at all: kept, so the decoder counts it as malformed (`empty`).
    Empty,
    /// The report's version nibble is not accepted: dropped.
    DropVersion,
    /// The sender is not an accepted switch: dropped.
    DropSource,
}

impl IntVerdict {
    /// Whether the datagram is kept.
    #[inline(always)]
    pub fn keep(self) -> bool {
        matches!(self, IntVerdict::Keep | IntVerdict::Empty)
    }
}

/// The INT filter's rule, run by the kernel program and the user-space fallback alike:
/// `first` is the report's first byte (`None`: empty datagram), `versions` the accepted-version
/// bits ([`INT_CONFIG_VERSIONS`]), `source_accepted` whether the sender is listed (`None`: not
/// checked). The version is checked first.
#[inline(always)]
pub fn int_verdict(first: Option<u8>, versions: u32, source_accepted: Option<bool>) -> IntVerdict {
    let Some(b) = first else {
        return IntVerdict::Empty;
    };
    if versions & (1u32 << (b >> 4)) == 0 {
        return IntVerdict::DropVersion;
    }
    if source_accepted == Some(false) {
        return IntVerdict::DropSource;
    }
    IntVerdict::Keep
}

/// Key of an IPv4 sender in [`INT_SOURCES_MAP`]: the address mapped into IPv6 (`::ffff:a.b.c.d`).
#[inline(always)]
pub fn int_source_key_v4(a: [u8; 4]) -> [u8; 16] {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
    ]
}

#[cfg(test)]
mod int_tests {
    use super::*;

    #[test]
    fn version_then_source_decide_and_empty_is_kept() {
        let v1 = 1 << 1;
        assert_eq!(int_verdict(Some(0x14), v1, None), IntVerdict::Keep);
        assert_eq!(int_verdict(Some(0x02), v1, None), IntVerdict::DropVersion);
        assert_eq!(
            int_verdict(Some(0xf0), u32::MAX >> 1, None),
            IntVerdict::Keep
        );
        assert_eq!(
            int_verdict(Some(0x02), v1, Some(false)),
            IntVerdict::DropVersion
        );
        assert_eq!(
            int_verdict(Some(0x14), v1, Some(false)),
            IntVerdict::DropSource
        );
        assert_eq!(int_verdict(Some(0x14), v1, Some(true)), IntVerdict::Keep);
        assert_eq!(int_verdict(None, 0, Some(false)), IntVerdict::Empty);
        let mut s = IntFilterStats::default();
        for v in [
            IntVerdict::Keep,
            IntVerdict::Empty,
            IntVerdict::DropVersion,
            IntVerdict::DropSource,
        ] {
            s.count(v);
        }
        assert_eq!((s.seen, s.kept, s.empty, s.dropped()), (4, 2, 1, 2));
        assert_eq!(
            int_source_key_v4([127, 0, 0, 2])[10..],
            [0xff, 0xff, 127, 0, 0, 2]
        );
    }
}
