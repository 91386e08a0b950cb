//! Wire parsing: telemetry report headers, the inner packet, INT stacks. Everything reads from a
//! bounds-checked slice into a reusable scratch ([`Scratch`]); nothing allocates, every loop is
//! bounded by a length that was checked first.

use super::{stats::Malformed, IntDecodeConfig, IntStats, V2Header};

/// Most hops a stack may hold in the scratch (`max_hops` is capped to this).
pub(crate) const MAX_HOPS: usize = 64;

type R<T = ()> = Result<T, Malformed>;

// One bounds check and one load per word (a byte-by-byte array checks each byte).
#[inline(always)]
fn be16(b: &[u8], o: usize) -> u16 {
    let mut w = [0u8; 2];
    w.copy_from_slice(&b[o..o + 2]);
    u16::from_be_bytes(w)
}

#[inline(always)]
fn be32(b: &[u8], o: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[o..o + 4]);
    u32::from_be_bytes(w)
}

#[inline(always)]
fn be64(b: &[u8], o: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(w)
}

#[inline]
fn get(b: &[u8], off: usize, n: usize, r: Malformed) -> R<&[u8]> {
    off.checked_add(n).and_then(|end| b.get(off..end)).ok_or(r)
}

/// All-ones means "not available" (INT v0.5/v1.0: "unsupported items are filled with
/// all-ones"). The test is on the whole metadata word, never on a field inside it: a queue id of
/// 255 next to a real occupancy is queue 255.
#[inline]
fn avail32(v: u32) -> Option<u32> {
    (v != u32::MAX).then_some(v)
}
#[inline]
fn avail64(v: u64) -> Option<u64> {
    (v != u64::MAX).then_some(v)
}
/// A word of two 16-bit fields (ingress port, egress port).
#[inline]
fn pair16(w: u32) -> (Option<u32>, Option<u32>) {
    if w == u32::MAX {
        (None, None)
    } else {
        (Some(w >> 16), Some(w & 0xffff))
    }
}
/// A word of an 8-bit id and a 24-bit value (queue or buffer id + occupancy / congestion).
#[inline]
fn id24(w: u32) -> (Option<u8>, Option<u32>) {
    if w == u32::MAX {
        (None, None)
    } else {
        (Some((w >> 24) as u8), Some(w & 0xff_ffff))
    }
}
/// A word of queue id (8), drop reason (8) and padding (16).
#[inline]
fn queue_drop(w: u32) -> (Option<u8>, Option<u8>) {
    if w == u32::MAX {
        (None, None)
    } else {
        (Some((w >> 24) as u8), Some((w >> 16) as u8))
    }
}

/// Metadata of one hop (or of the reporting switch itself). `None` = not carried or all-ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Md {
    pub node_id: Option<u32>,
    pub ingress_port: Option<u32>,
    pub egress_port: Option<u32>,
    pub l2_ingress_port: Option<u32>,
    pub l2_egress_port: Option<u32>,
    pub hop_latency: Option<u32>,
    pub queue_id: Option<u8>,
    pub queue_occupancy: Option<u32>,
    pub queue_congestion: Option<u32>,
    pub ingress_ts: Option<u64>,
    pub egress_ts: Option<u64>,
    /// Width of the timestamps: 32 (v0.5/v1.0) or 64 (v2.x).
    pub ts_bits: u8,
    pub tx_util: Option<u32>,
    pub buffer_id: Option<u8>,
    pub buffer_occupancy: Option<u32>,
    pub drop_reason: Option<u8>,
}

/// One metadata item on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item {
    NodeId,
    L1Ports,
    HopLatency,
    QueueOcc,
    IngressTs32,
    EgressTs32,
    IngressTs64,
    EgressTs64,
    L2Ports,
    TxUtil,
    Buffer,
    QueueCongestion,
    /// Queue id (8) + drop reason (8) + padding (16).
    QueueDrop,
    /// Checksum complement (4 bytes, skipped).
    Checksum,
    /// A reserved v0.5 instruction: one 4-byte word, skipped.
    Skip4,
    /// Unknown size: decoding of this hop's later items stops here.
    Unknown,
}

impl Item {
    fn size(self) -> usize {
        match self {
            Item::IngressTs64 | Item::EgressTs64 | Item::L2Ports => 8,
            Item::Unknown => 0,
            _ => 4,
        }
    }
}

/// Which item each bit (bit 0 = MSB) of a 16-bit bitmap stands for.
type BitTable = [Item; 16];

use Item::*;
/// INT v0.5 instruction bits (every item 4 bytes; reserved bits are still one word each).
pub(crate) const INT_V05: BitTable = [
    NodeId,
    L1Ports,
    HopLatency,
    QueueOcc,
    IngressTs32,
    EgressTs32,
    QueueCongestion,
    TxUtil,
    Skip4,
    Skip4,
    Skip4,
    Skip4,
    Skip4,
    Skip4,
    Skip4,
    Skip4,
];
/// INT v1.0 instruction bits.
pub(crate) const INT_V1: BitTable = [
    NodeId,
    L1Ports,
    HopLatency,
    QueueOcc,
    IngressTs32,
    EgressTs32,
    L2Ports,
    TxUtil,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Checksum,
];
/// INT v2.x instruction bits.
pub(crate) const INT_V2: BitTable = [
    NodeId,
    L1Ports,
    HopLatency,
    QueueOcc,
    IngressTs64,
    EgressTs64,
    L2Ports,
    TxUtil,
    Buffer,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Checksum,
];
/// Telemetry Report v2.0 RepMdBits.
pub(crate) const REP_V2: BitTable = [
    Unknown,
    L1Ports,
    HopLatency,
    QueueOcc,
    IngressTs64,
    EgressTs64,
    L2Ports,
    TxUtil,
    Buffer,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    Unknown,
    QueueDrop,
];
/// Telemetry Report v1.0 RepMdBits (6 bits, placed in the top of a 16-bit map).
pub(crate) const REP_V1: BitTable = [
    L1Ports, HopLatency, QueueOcc, EgressTs32, QueueDrop, TxUtil, Unknown, Unknown, Unknown,
    Unknown, Unknown, Unknown, Unknown, Unknown, Unknown, Unknown,
];

/// A compiled bitmap: items in wire order up to the first of unknown size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub items: [Item; 16],
    pub n: u8,
    /// Bytes of the known items.
    pub bytes: usize,
    /// An item of unknown size (or a reserved v0.5 word) was set.
    pub unknown: bool,
    pub key: (u8, u16),
}

impl Plan {
    pub(crate) fn new(table: &BitTable, id: u8, bitmap: u16) -> Self {
        let mut p = Plan {
            items: [Unknown; 16],
            n: 0,
            bytes: 0,
            unknown: false,
            key: (id, bitmap),
        };
        for (bit, item) in table.iter().enumerate() {
            if bitmap & (0x8000 >> bit) == 0 {
                continue;
            }
            if *item == Unknown {
                p.unknown = true;
                break;
            }
            if *item == Skip4 {
                p.unknown = true;
            }
            p.items[p.n as usize] = *item;
            p.n += 1;
            p.bytes += item.size();
        }
        p
    }

    /// Whether this is the common instruction set (switch id, ports, hop latency, queue,
    /// timestamps: AmLight's 0xFC00 in v1.0 and v2.x), whose hops [`common_md`] reads without
    /// the per-item dispatch.
    #[inline]
    pub(crate) fn is_common(&self) -> bool {
        self.key.1 == 0xFC00 && matches!(self.key.0, 1 | 2)
    }

    /// Reads the items from `b` (at least `self.bytes` long) into `md`.
    #[inline]
    pub(crate) fn read(&self, b: &[u8], md: &mut Md) {
        let mut o = 0;
        for &it in &self.items[..self.n as usize] {
            match it {
                NodeId => md.node_id = avail32(be32(b, o)),
                L1Ports => (md.ingress_port, md.egress_port) = pair16(be32(b, o)),
                HopLatency => md.hop_latency = avail32(be32(b, o)),
                QueueOcc => (md.queue_id, md.queue_occupancy) = id24(be32(b, o)),
                IngressTs32 => {
                    md.ingress_ts = avail32(be32(b, o)).map(u64::from);
                    md.ts_bits = 32;
                }
                EgressTs32 => {
                    md.egress_ts = avail32(be32(b, o)).map(u64::from);
                    md.ts_bits = 32;
                }
                IngressTs64 => {
                    md.ingress_ts = avail64(be64(b, o));
                    md.ts_bits = 64;
                }
                EgressTs64 => {
                    md.egress_ts = avail64(be64(b, o));
                    md.ts_bits = 64;
                }
                L2Ports => {
                    md.l2_ingress_port = avail32(be32(b, o));
                    md.l2_egress_port = avail32(be32(b, o + 4));
                }
                TxUtil => md.tx_util = avail32(be32(b, o)),
                Buffer => (md.buffer_id, md.buffer_occupancy) = id24(be32(b, o)),
                QueueCongestion => (md.queue_id, md.queue_congestion) = id24(be32(b, o)),
                QueueDrop => (md.queue_id, md.drop_reason) = queue_drop(be32(b, o)),
                Checksum | Skip4 | Unknown => {}
            }
            o += it.size();
        }
    }
}

/// One hop of the common instruction set ([`Plan::is_common`]) of INT `version` 1 (32-bit
/// timestamps, 24 bytes) or 2 (64-bit, 32 bytes) from `b` (at least that long): the whole `Md`,
/// each field once.
#[inline(always)]
pub(crate) fn common_md(version: u8, b: &[u8]) -> Md {
    // The hop's 24 (v1.0) or 32 (v2.x) bytes, checked once.
    let b = &b[..if version == 1 { 24 } else { 32 }];
    let (ingress_ts, egress_ts, ts_bits) = if version == 1 {
        (
            avail32(be32(b, 16)).map(u64::from),
            avail32(be32(b, 20)).map(u64::from),
            32,
        )
    } else {
        (avail64(be64(b, 16)), avail64(be64(b, 24)), 64)
    };
    let (ingress_port, egress_port) = pair16(be32(b, 4));
    let (queue_id, queue_occupancy) = id24(be32(b, 12));
    Md {
        node_id: avail32(be32(b, 0)),
        ingress_port,
        egress_port,
        hop_latency: avail32(be32(b, 8)),
        queue_id,
        queue_occupancy,
        ingress_ts,
        egress_ts,
        ts_bits,
        ..Md::default()
    }
}

/// The flow fields of the inner packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Inner {
    pub vlan: Option<u16>,
    pub inner_vlan: Option<u16>,
    pub ip_version: Option<u8>,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub proto: Option<u8>,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
    pub dscp: Option<u8>,
}

/// The INT header fields kept per report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IntHdr {
    pub version: u8,
    pub hop_ml: u8,
    pub instructions: u16,
    pub rhc: Option<u8>,
    pub hops: u8,
    /// A stack of the common instruction set ([`Plan::is_common`]): its offset in the datagram
    /// and its bytes per hop. Its hops are not copied into the scratch's `hops`: the decoder
    /// reads them from the datagram with [`common_md`] as it writes their rows.
    pub common: Option<(usize, usize)>,
}

/// Header fields of one (individual) report.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rep {
    pub version: u8,
    pub hw_id: u8,
    pub seq: u32,
    pub switch_id: u32,
    /// Whether `switch_id` came from the report (else from the source address).
    pub has_switch: bool,
    pub d: bool,
    pub q: bool,
    pub f: bool,
    pub i: Option<bool>,
    pub rep_type: Option<u8>,
    pub in_type: Option<u8>,
    pub ingress_ts: Option<u64>,
    /// The reporting switch's own metadata.
    pub md: Md,
    /// v0.5 drop report header present.
    pub drop_header: bool,
}

/// Reusable per-decoder parse state.
#[derive(Debug)]
pub(crate) struct Scratch {
    pub rep: Rep,
    pub inner: Inner,
    pub int: Option<IntHdr>,
    /// Hops in **path order** (index 0 = first switch); `int.hops` of them are valid, unless
    /// `int.common` is set.
    pub hops: [Md; MAX_HOPS],
    /// Address of the datagram being decoded (set before parsing it): `int.common`'s offset
    /// is taken from it.
    pub base: usize,
    plan: Option<Plan>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self {
            rep: Rep::default(),
            inner: Inner::default(),
            int: None,
            hops: [Md::default(); MAX_HOPS],
            base: 0,
            plan: None,
        }
    }
}

/// What the caller knows about the packet that carried the report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'c> {
    pub cfg: &'c IntDecodeConfig,
}

/// The report fields of a v1.0 report header's 16 bytes (`h` holds at least those).
#[inline(always)]
fn v1_rep(h: &[u8]) -> Rep {
    Rep {
        version: 1,
        hw_id: h[3] & 0x3f,
        switch_id: be32(h, 4),
        has_switch: true,
        seq: be32(h, 8),
        d: h[2] & 0x01 != 0,
        q: h[3] & 0x80 != 0,
        f: h[3] & 0x40 != 0,
        ingress_ts: Some(u64::from(be32(h, 12))),
        md: Md {
            ts_bits: 32,
            ..Md::default()
        },
        ..Rep::default()
    }
}

fn mapped_v4(b: &[u8]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[10] = 0xff;
    a[11] = 0xff;
    a[12..16].copy_from_slice(&b[..4]);
    a
}

impl Scratch {
    fn reset_inner(&mut self) {
        self.inner = Inner::default();
        self.int = None;
    }

    /// Parses the fixed header of a v0.5 report and its NProto header; returns the offset of
    /// the inner Ethernet frame.
    pub(crate) fn v05_header(&mut self, b: &[u8]) -> R<usize> {
        let h = get(b, 0, 12, Malformed::V05HeaderTruncated)?;
        let nproto = h[0] & 0x0f;
        self.rep = Rep {
            version: 0,
            hw_id: h[3] & 0x3f,
            seq: be32(h, 4),
            d: h[1] & 0x80 != 0,
            q: h[1] & 0x40 != 0,
            f: h[1] & 0x20 != 0,
            ingress_ts: Some(u64::from(be32(h, 8))),
            md: Md {
                ts_bits: 32,
                ..Md::default()
            },
            ..Rep::default()
        };
        match nproto {
            0 => Ok(12),
            1 => {
                let s = get(b, 12, 12, Malformed::V05SubHeaderTruncated)?;
                self.rep.switch_id = be32(s, 0);
                self.rep.has_switch = true;
                (self.rep.md.ingress_port, self.rep.md.egress_port) = pair16(be32(s, 4));
                (self.rep.md.queue_id, self.rep.md.drop_reason) = queue_drop(be32(s, 8));
                self.rep.drop_header = true;
                Ok(24)
            }
            2 => {
                let s = get(b, 12, 16, Malformed::V05SubHeaderTruncated)?;
                self.rep.switch_id = be32(s, 0);
                self.rep.has_switch = true;
                (self.rep.md.ingress_port, self.rep.md.egress_port) = pair16(be32(s, 4));
                (self.rep.md.queue_id, self.rep.md.queue_occupancy) = id24(be32(s, 8));
                self.rep.md.egress_ts = avail32(be32(s, 12)).map(u64::from);
                Ok(28)
            }
            _ => Err(Malformed::V05UnknownNextProto),
        }
    }

    /// Parses a v1.0 header; returns (offset of the original packet, NProt).
    pub(crate) fn v1_header(&mut self, b: &[u8]) -> R<(usize, u8)> {
        let h = get(b, 0, 16, Malformed::V1HeaderTruncated)?;
        let len_words = usize::from(h[0] & 0x0f);
        let nprot = h[1] >> 5;
        let rep_md = ((h[1] & 0x1f) << 1) | (h[2] >> 7);
        self.rep = v1_rep(h);
        if len_words < 4 {
            return Err(Malformed::V1LengthTooSmall);
        }
        let len = len_words * 4;
        if len > b.len() {
            return Err(Malformed::V1LengthPastPayload);
        }
        if len_words != 4 + rep_md.count_ones() as usize {
            return Err(Malformed::V1LengthMdMismatch);
        }
        if rep_md != 0 {
            let plan = Plan::new(&REP_V1, 11, u16::from(rep_md) << 10);
            plan.read(&b[16..len], &mut self.rep.md);
        }
        if nprot > 2 {
            return Err(Malformed::V1UnknownNextProto);
        }
        Ok((len, nprot))
    }

    /// The usual AmLight/NoviFlow report in one pass: a v1.0 header without report metadata
    /// (Length 4, NProt 0) over Ethernet with at most one 802.1Q tag, IPv4 without options, not a
    /// fragment, UDP, INT signalled (DSCP or UDP port, not the VXLAN-GPE port), an INT v1.0 shim
    /// and header with the common instruction set (0xFC00, Hop ML 6) and a whole number of hops
    /// within `max_hops`. When every one of those holds, the scratch (report, inner packet, INT
    /// header) and the counters end exactly as [`Self::v1_header`] and [`Self::ethernet`] leave
    /// them, and `true` is returned; otherwise nothing was counted, the scratch is to be
    /// overwritten by the general parse (which finds what differs), and `false` is returned.
    /// `b` is at least 16 bytes of a v1.0 report.
    #[inline]
    pub(crate) fn v1_amlight(
        &mut self,
        b: &[u8],
        cfg: &IntDecodeConfig,
        stats: &mut IntStats,
    ) -> bool {
        // Version 1, Length 4 words, NProt 0 (Ethernet), RepMdBits 0; the inner frame after it.
        const ETH: usize = 16;
        if b.len() < ETH + 14 || b[0] != 0x14 || b[1] != 0 || b[2] & 0x80 != 0 {
            return false;
        }
        let (vlan, ip) = match be16(b, ETH + 12) {
            0x8100 if b.len() >= ETH + 18 && be16(b, ETH + 16) == 0x0800 => {
                (Some(be16(b, ETH + 14) & 0x0fff), ETH + 18)
            }
            0x0800 => (None, ETH + 14),
            _ => return false,
        };
        // IPv4 (20 bytes), UDP (8), shim (4) and the INT header's first byte.
        if b.len() < ip + 33 {
            return false;
        }
        let h = &b[ip..ip + 20];
        if h[0] != 0x45 || h[9] != 17 || be16(h, 6) & 0x1fff != 0 {
            return false;
        }
        let dscp = h[1] >> 2;
        // The UDP datagram as Total Length bounds it (a truncated copy: the payload's end).
        let total = usize::from(be16(h, 2)).clamp(20, b.len() - ip);
        let Some(u) = b.get(ip + 20..ip + total) else {
            return false;
        };
        if u.len() < 13 {
            return false;
        }
        let (sport, dport) = (be16(u, 0), be16(u, 2));
        if cfg.vxlan_gpe_port != 0 && dport == cfg.vxlan_gpe_port {
            return false;
        }
        let by_dscp = cfg
            .int_dscp
            .is_some_and(|v| (dscp & cfg.int_dscp_mask) == (v & cfg.int_dscp_mask));
        if !(by_dscp || cfg.int_udp_ports.contains(&dport)) {
            return false;
        }
        // Shim (type 1 or 2, Length in words including itself) and INT v1.0 header.
        let shim = &u[8..];
        let len = usize::from(shim[2]) * 4;
        if !matches!(shim[0], 1 | 2) || shim[4] >> 4 != 1 || len < 12 || len > shim.len() {
            return false;
        }
        let int = &shim[4..len];
        if be16(int, 4) != 0xFC00 || int[2] & 0x1f != 6 {
            return false;
        }
        let stack = int.len() - 8;
        let hops = stack / 24;
        if stack % 24 != 0 || hops > usize::from(cfg.max_hops).min(MAX_HOPS) {
            return false;
        }
        // Everything holds: the same state as the general parse.
        let rhc = int[3];
        if let Some(init) = cfg.initial_hop_count {
            if usize::from(init.saturating_sub(rhc)) != hops {
                stats.hop_count_rhc_mismatch += 1;
            }
        }
        self.rep = v1_rep(b);
        self.inner = Inner {
            vlan,
            inner_vlan: None,
            ip_version: Some(4),
            src: mapped_v4(&h[12..16]),
            dst: mapped_v4(&h[16..20]),
            proto: Some(17),
            sport: Some(sport),
            dport: Some(dport),
            dscp: Some(dscp),
        };
        self.int = Some(IntHdr {
            version: 1,
            hop_ml: 6,
            instructions: 0xFC00,
            rhc: Some(rhc),
            hops: hops as u8,
            common: Some((ip + 20 + 8 + 4 + 8, 24)),
        });
        true
    }

    /// Parses a v2.0 group header: (hw_id, seq, seq bits, node id).
    pub(crate) fn v2_group(b: &[u8], variant: V2Header) -> R<(u8, u32, u8, u32)> {
        let h = get(b, 0, 8, Malformed::V2GroupTruncated)?;
        let w = be32(h, 0);
        Ok(match variant {
            V2Header::Spec => ((w >> 22 & 0x3f) as u8, w & 0x3f_ffff, 22, be32(h, 4)),
            V2Header::Tofino => ((w >> 24 & 0x0f) as u8, w & 0xff_ffff, 24, be32(h, 4)),
        })
    }

    /// Parses one v2.0 individual report starting at `b[0]`; returns its total length (header
    /// included) or `None` when it runs to the end of the payload (Report Length 0xFF). On
    /// success the scratch holds the report; `Ok(Some(len))` with `rep.rep_type` ≠ 0/1 means
    /// "skipped, counted".
    pub(crate) fn v2_report(
        &mut self,
        b: &[u8],
        ctx: Ctx<'_>,
        stats: &mut IntStats,
    ) -> R<Option<usize>> {
        let h = get(b, 0, 4, Malformed::V2ReportHeaderTruncated)?;
        let rep_type = h[0] >> 4;
        let in_type = h[0] & 0x0f;
        let rep_len = h[1];
        let md_len = usize::from(h[2]) * 4;
        let (body, total) = if rep_len == 0xff {
            (&b[4..], None)
        } else {
            let n = usize::from(rep_len) * 4;
            let body = get(b, 4, n, Malformed::V2ReportPastPayload)?;
            (body, Some(4 + n))
        };
        self.rep.d = h[3] & 0x80 != 0;
        self.rep.q = h[3] & 0x40 != 0;
        self.rep.f = h[3] & 0x20 != 0;
        self.rep.i = Some(h[3] & 0x10 != 0);
        self.rep.rep_type = Some(rep_type);
        self.rep.in_type = Some(in_type);
        self.rep.ingress_ts = None;
        self.rep.md = Md {
            ts_bits: 64,
            ..Md::default()
        };
        self.reset_inner();
        let inner = match rep_type {
            0 => body,
            1 => {
                let main = get(body, 0, 8 + md_len, Malformed::V2MdPastReport)?;
                let rep_md = be16(main, 0);
                let plan = Plan::new(&REP_V2, 12, rep_md);
                if plan.unknown {
                    stats.v2_reserved_md_bits += 1;
                }
                if plan.bytes > md_len {
                    return Err(Malformed::V2MdBitsExceedMdLength);
                }
                plan.read(&main[8..], &mut self.rep.md);
                stats.domain_specific_bytes_skipped += (md_len - plan.bytes) as u64;
                self.rep.ingress_ts = self.rep.md.ingress_ts;
                &body[8 + md_len..]
            }
            2 => {
                stats.v2_reports_skipped += 1;
                return Err(Malformed::V2Ioam);
            }
            _ => {
                stats.v2_reports_skipped += 1;
                return Err(Malformed::V2UnknownRepType);
            }
        };
        match in_type {
            0 => {}
            1 => self.tlvs(inner, ctx, stats)?,
            2 => stats.domain_specific_bytes_skipped += inner.len() as u64,
            3 => self.ethernet(inner, ctx, stats, true)?,
            4 => self.ipv4(inner, ctx, stats, true)?,
            5 => self.ipv6(inner, ctx, stats, true)?,
            _ => return Err(Malformed::V2UnknownInType),
        }
        Ok(total)
    }

    fn tlvs(&mut self, mut b: &[u8], ctx: Ctx<'_>, stats: &mut IntStats) -> R {
        let mut packet_done = false;
        while !b.is_empty() {
            let h = get(b, 0, 4, Malformed::V2TlvTruncated)?;
            let t = h[0] >> 4;
            let n = usize::from(h[1]) * 4;
            let data = get(b, 4, n, Malformed::V2TlvTruncated)?;
            match t {
                1..=3 if !packet_done => {
                    packet_done = true;
                    match t {
                        1 => self.ethernet(data, ctx, stats, true)?,
                        2 => self.ipv4(data, ctx, stats, true)?,
                        _ => self.ipv6(data, ctx, stats, true)?,
                    }
                }
                _ => stats.domain_specific_bytes_skipped += n as u64,
            }
            b = &b[4 + n..];
        }
        Ok(())
    }

    /// Inner Ethernet (with up to 4 VLAN tags). `search_int`: look for INT after L4.
    pub(crate) fn ethernet(
        &mut self,
        b: &[u8],
        ctx: Ctx<'_>,
        stats: &mut IntStats,
        search_int: bool,
    ) -> R {
        get(b, 0, 14, Malformed::EthernetTruncated)?;
        let mut off = 12;
        let mut et = be16(b, off);
        let mut tags = 0;
        while matches!(et, 0x8100 | 0x88a8 | 0x9100) {
            if tags == 4 {
                return Err(Malformed::TooManyVlanTags);
            }
            let t = get(b, off + 2, 4, Malformed::EthernetTruncated)?;
            let vid = be16(t, 0) & 0x0fff;
            if tags == 0 {
                self.inner.vlan = Some(vid);
            } else if tags == 1 {
                self.inner.inner_vlan = Some(vid);
            }
            tags += 1;
            off += 4;
            et = be16(t, 2);
        }
        let rest = &b[off + 2..];
        match et {
            0x0800 => self.ipv4(rest, ctx, stats, search_int),
            0x86dd => self.ipv6(rest, ctx, stats, search_int),
            _ => Ok(()),
        }
    }

    pub(crate) fn ipv4(
        &mut self,
        b: &[u8],
        ctx: Ctx<'_>,
        stats: &mut IntStats,
        search_int: bool,
    ) -> R {
        let h = get(b, 0, 20, Malformed::Ipv4Truncated)?;
        let ihl = usize::from(h[0] & 0x0f) * 4;
        if h[0] >> 4 != 4 || ihl < 20 {
            return Err(Malformed::Ipv4BadIhl);
        }
        get(b, 0, ihl, Malformed::Ipv4Truncated)?;
        self.inner.ip_version = Some(4);
        self.inner.dscp = Some(h[1] >> 2);
        self.inner.src = mapped_v4(&h[12..16]);
        self.inner.dst = mapped_v4(&h[16..20]);
        self.inner.proto = Some(h[9]);
        // Later fragments carry no L4 header.
        if be16(h, 6) & 0x1fff != 0 {
            return Ok(());
        }
        // A truncated copy may end before Total Length says; never read past either.
        let total = usize::from(be16(h, 2)).clamp(ihl, b.len());
        self.l4(h[9], &b[ihl..total], ctx, stats, search_int)
    }

    pub(crate) fn ipv6(
        &mut self,
        b: &[u8],
        ctx: Ctx<'_>,
        stats: &mut IntStats,
        search_int: bool,
    ) -> R {
        let h = get(b, 0, 40, Malformed::Ipv6Truncated)?;
        if h[0] >> 4 != 6 {
            return Err(Malformed::Ipv6Truncated);
        }
        self.inner.ip_version = Some(6);
        self.inner.dscp = Some((((h[0] & 0x0f) << 4) | (h[1] >> 4)) >> 2);
        self.inner.src.copy_from_slice(&h[8..24]);
        self.inner.dst.copy_from_slice(&h[24..40]);
        let mut next = h[6];
        let mut off = 40;
        for _ in 0..8 {
            match next {
                0 | 43 | 60 => {
                    let e = get(b, off, 8, Malformed::Ipv6Truncated)?;
                    next = e[0];
                    off += (usize::from(e[1]) + 1) * 8;
                }
                44 => {
                    let e = get(b, off, 8, Malformed::Ipv6Truncated)?;
                    next = e[0];
                    off += 8;
                    if be16(e, 2) & 0xfff8 != 0 {
                        self.inner.proto = Some(next);
                        return Ok(());
                    }
                }
                _ => break,
            }
        }
        self.inner.proto = Some(next);
        let rest = b.get(off..).ok_or(Malformed::Ipv6Truncated)?;
        self.l4(next, rest, ctx, stats, search_int)
    }

    fn l4(
        &mut self,
        proto: u8,
        b: &[u8],
        ctx: Ctx<'_>,
        stats: &mut IntStats,
        search_int: bool,
    ) -> R {
        let (hdr_len, fixed) = match proto {
            6 => {
                let h = get(b, 0, 20, Malformed::L4Truncated)?;
                let off = usize::from(h[12] >> 4) * 4;
                if off < 20 {
                    return Err(Malformed::L4Truncated);
                }
                (off, 20)
            }
            17 => {
                get(b, 0, 8, Malformed::L4Truncated)?;
                (8, 8)
            }
            _ => return Ok(()),
        };
        let sport = be16(b, 0);
        let dport = be16(b, 2);
        self.inner.sport = Some(sport);
        self.inner.dport = Some(dport);
        if !search_int {
            return Ok(());
        }
        let cfg = ctx.cfg;
        if proto == 17 && cfg.vxlan_gpe_port != 0 && dport == cfg.vxlan_gpe_port {
            return self.gpe(&b[8..], ctx, stats);
        }
        let by_dscp = cfg.int_dscp.is_some_and(|v| {
            (self.inner.dscp.unwrap_or(0) & cfg.int_dscp_mask) == (v & cfg.int_dscp_mask)
        });
        let by_port = proto == 17 && cfg.int_udp_ports.contains(&dport);
        if !(by_dscp || by_port) {
            if self.rep.f {
                stats.int_not_signalled += 1;
            }
            return Ok(());
        }
        // The spec puts INT after the whole TCP header; NoviFlow after the fixed 20 bytes,
        // before the options. Try the spec's place first.
        if hdr_len > fixed {
            if let Some(at) = b.get(hdr_len..) {
                if plausible_shim(at) {
                    return self.shim(at, stats, ctx.cfg);
                }
            }
            stats.tcp_int_before_options += 1;
        }
        let at = b.get(fixed..).unwrap_or(&[]);
        self.shim(at, stats, ctx.cfg)
    }

    /// INT over VXLAN-GPE (next protocol 0x82), then the encapsulated packet.
    fn gpe(&mut self, b: &[u8], ctx: Ctx<'_>, stats: &mut IntStats) -> R {
        let h = get(b, 0, 8, Malformed::GpeTruncated)?;
        if h[3] != 0x82 {
            return Ok(());
        }
        let s = get(b, 8, 4, Malformed::GpeTruncated)?;
        let len = usize::from(s[1]) * 4;
        let next = s[3];
        let int = get(b, 12, len, Malformed::ShimPastPacket)?;
        self.int_block(int, stats, ctx.cfg, None)?;
        let rest = &b[12 + len..];
        // The encapsulated packet names the flow; its own INT is not searched.
        let saved_int = self.int;
        let r = match next {
            0x01 => self.ipv4(rest, ctx, stats, false),
            0x02 => self.ipv6(rest, ctx, stats, false),
            0x03 => {
                self.inner.vlan = None;
                self.ethernet(rest, ctx, stats, false)
            }
            _ => Ok(()),
        };
        self.int = saved_int;
        r
    }

    /// The INT shim over TCP/UDP at `b[0]`.
    fn shim(&mut self, b: &[u8], stats: &mut IntStats, cfg: &IntDecodeConfig) -> R {
        let s = get(b, 0, 4, Malformed::ShimTruncated)?;
        let hv = get(b, 4, 1, Malformed::IntHeaderTruncated)?[0] >> 4;
        match hv {
            0 | 1 => {
                if !matches!(s[0], 1 | 2) {
                    return Err(Malformed::ShimBadType);
                }
                let len = usize::from(s[2]) * 4; // includes the shim
                let min = if hv == 0 { 16 } else { 12 };
                if len < min {
                    return Err(Malformed::ShimLengthTooSmall);
                }
                let blk = get(b, 0, len, Malformed::ShimPastPacket)?;
                self.int_block(&blk[4..], stats, cfg, Some(hv))
            }
            2 => {
                let t = s[0] >> 4;
                if !matches!(t, 1..=3) {
                    return Err(Malformed::ShimBadType);
                }
                let len = usize::from(s[1]) * 4; // excludes the shim
                if len < 12 {
                    return Err(Malformed::ShimLengthTooSmall);
                }
                let blk = get(b, 4, len, Malformed::ShimPastPacket)?;
                if t != 1 {
                    stats.int_mx_or_destination += 1;
                    return Ok(());
                }
                self.int_block(blk, stats, cfg, Some(2))
            }
            _ => Err(Malformed::UnknownIntVersion),
        }
    }

    /// INT metadata header + stack (+ v0.5 tail), `b` exactly that long.
    fn int_block(
        &mut self,
        b: &[u8],
        stats: &mut IntStats,
        cfg: &IntDecodeConfig,
        expect: Option<u8>,
    ) -> R {
        let h = get(b, 0, 8, Malformed::IntHeaderTruncated)?;
        let ver = h[0] >> 4;
        if expect.is_some_and(|e| e != ver) || ver > 2 {
            return Err(Malformed::UnknownIntVersion);
        }
        let max_hops = usize::from(cfg.max_hops).min(MAX_HOPS);
        let bitmap = be16(h, 4);
        let (hdr_len, table, hop_bytes, stack_len, rhc, hops_declared, hop_ml) = match ver {
            0 => {
                let ins_cnt = usize::from(h[1] & 0x1f);
                if ins_cnt != bitmap.count_ones() as usize {
                    return Err(Malformed::InsCntMismatch);
                }
                // Header 8 B, tail 4 B.
                let stack = b
                    .len()
                    .checked_sub(12)
                    .ok_or(Malformed::ShimLengthTooSmall)?;
                (
                    8,
                    &INT_V05,
                    ins_cnt * 4,
                    stack,
                    None,
                    Some(usize::from(h[3])),
                    ins_cnt as u8,
                )
            }
            1 => {
                let ml = h[2] & 0x1f;
                (
                    8,
                    &INT_V1,
                    usize::from(ml) * 4,
                    b.len() - 8,
                    Some(h[3]),
                    None,
                    ml,
                )
            }
            _ => {
                get(b, 0, 12, Malformed::IntHeaderTruncated)?;
                let ml = h[2] & 0x1f;
                (
                    12,
                    &INT_V2,
                    usize::from(ml) * 4,
                    b.len() - 12,
                    Some(h[3]),
                    None,
                    ml,
                )
            }
        };
        let plan = match self.plan {
            Some(p) if p.key == (ver, bitmap) => p,
            _ => {
                let p = Plan::new(table, ver, bitmap);
                self.plan = Some(p);
                p
            }
        };
        if plan.unknown {
            stats.unknown_instruction_bits += 1;
        }
        let (hops, rem) = if stack_len == 0 {
            (0, 0)
        } else if hop_bytes == 0 || hop_bytes < plan.bytes {
            return Err(Malformed::HopMlMismatch);
        } else {
            (stack_len / hop_bytes, stack_len % hop_bytes)
        };
        if rem != 0 {
            // v2.x: source-only domain-specific metadata (DS Instruction ≠ 0) is not in Hop ML.
            if ver == 2 && be16(b, 8) != 0 {
                stats.domain_specific_bytes_skipped += rem as u64;
            } else {
                return Err(Malformed::HopMlMismatch);
            }
        }
        if hops_declared.is_some_and(|d| d != hops) {
            return Err(Malformed::HopMlMismatch);
        }
        if hops > max_hops {
            return Err(Malformed::TooManyHops);
        }
        if let (Some(init), Some(r)) = (cfg.initial_hop_count, rhc) {
            if usize::from(init.saturating_sub(r)) != hops {
                stats.hop_count_rhc_mismatch += 1;
            }
        }
        let stack = &b[hdr_len..hdr_len + hops * hop_bytes];
        let common = plan
            .is_common()
            .then(|| (stack.as_ptr() as usize - self.base, hop_bytes));
        if common.is_none() {
            let ts_bits = if ver == 2 { 64 } else { 32 };
            for i in 0..hops {
                let md = &mut self.hops[hops - 1 - i];
                *md = Md {
                    ts_bits,
                    ..Md::default()
                };
                plan.read(&stack[i * hop_bytes..(i + 1) * hop_bytes], md);
            }
        }
        self.int = Some(IntHdr {
            version: ver,
            hop_ml,
            instructions: bitmap,
            rhc,
            hops: hops as u8,
            common,
        });
        Ok(())
    }
}

/// Whether `b` starts like an INT shim (used to choose between the two TCP positions).
fn plausible_shim(b: &[u8]) -> bool {
    if b.len() < 12 {
        return false;
    }
    match b[4] >> 4 {
        0 | 1 => matches!(b[0], 1 | 2) && b[1] == 0 && usize::from(b[2]) * 4 <= b.len(),
        2 => matches!(b[0] >> 4, 1..=3) && usize::from(b[1]) * 4 + 4 <= b.len(),
        _ => false,
    }
}
