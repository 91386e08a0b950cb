//! INT telemetry reports: UDP payload bytes in, Arrow column batches out. No I/O, no locks, no
//! allocation per report — the daemon's workers (phase 2), `stel-bench int`, the tests and the
//! fuzzer all call [`IntDecoder::decode`] with plain byte slices.
//!
//! Design notes (data path, state ownership, what is counted) are in `ingest/src/int/README.md`.
//!
//! * `wire`: Telemetry Report v0.5 / v1.0 / v2.0 headers, inner Ethernet/VLAN/IPv4/IPv6/TCP/UDP,
//!   INT v0.5 / v1.0 / v2.x stacks over TCP/UDP and VXLAN-GPE; every length checked first.
//! * `seq`: loss per (reporting switch, hw_id) at the sequence field's real width, with a
//!   reordering window.
//! * [`evc`]: EVC attribution from a mapping file and a Kytos mef_eline listing.
//! * [`gen`]: the report generator behind `stel-emu int` (every version, AmLight's layout, a
//!   topology with path changes, drops, congestion and loss, ground truth, pcap).

mod bounded;
pub mod evc;
pub(crate) mod seq;
pub mod source;
mod stats;
pub(crate) mod wire;

#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
    net::IpAddr,
    sync::Arc,
};

use self::bounded::{Aged, Bounded};

use serde::{Deserialize, Serialize};
pub use stats::{IntStats, Malformed, MalformedCounts};
pub use stel_store::int::IntBatch;
use stel_store::int::{HopBit, HopRows};

use self::{
    evc::EvcMap,
    seq::{SeqLimits, SeqTracker},
    wire::{common_md, Ctx, Md, Scratch, MAX_HOPS},
};

/// How a Telemetry Report v2.0 group header is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum V2Header {
    /// The spec: 6-bit hw_id, 22-bit sequence number.
    #[default]
    Spec,
    /// Tofino switch.p4: 4-bit hw_id, 24-bit sequence number.
    Tofino,
}

/// INT decoder settings (the `[int]` section's decode part).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntDecodeConfig {
    /// DSCP value that signals INT inside the inner IPv4/IPv6 header (AmLight/NoviFlow and the
    /// spec's examples use 0x17); unset = DSCP does not signal INT.
    pub int_dscp: Option<u8>,
    /// DSCP bits compared with `int_dscp` (0x3f: the whole value; a single bit for a DSCP-bit
    /// scheme).
    pub int_dscp_mask: u8,
    /// UDP destination ports after whose header INT follows (the spec's unassigned "INT_TBD").
    pub int_udp_ports: Vec<u16>,
    /// VXLAN-GPE UDP port: INT is GPE next protocol 0x82 there; 0 = off.
    pub vxlan_gpe_port: u16,
    /// Most hops a stack may hold (AmLight/NoviFlow: 10; at most 64); more is malformed.
    pub max_hops: u8,
    /// Remaining Hop Count the INT source starts with (AmLight: 10): a stack whose hop count is
    /// not `initial_hop_count − RHC` is counted (`hop_count_rhc_mismatch`) but kept. Unset: no
    /// check.
    pub initial_hop_count: Option<u8>,
    /// Telemetry Report v2.0 group-header variant.
    pub v2_header: V2Header,
    /// How far back (in sequence numbers) a late report still counts as reordered, not lost
    /// (1..=1024).
    pub reorder_window: u32,
    /// Per-flow latency threshold in ns: crossings are events and set `latency_over`.
    pub latency_threshold_ns: Option<u64>,
    /// Switch clocks are synchronised: compute last egress − first ingress per report.
    pub clocks_synchronized: bool,
    /// Most flows tracked per decoder (path, threshold and cached EVC state, ~80 bytes each
    /// with the table's overhead). A new flow in a full table first makes idle flows go, then
    /// the least recently seen eighth of the table (counted, `flows_evicted`).
    pub max_flows: usize,
    /// A flow not seen for this long is forgotten.
    pub flow_idle_timeout_ms: u64,
    /// Most sequence streams (reporting switch, hw_id) tracked per decoder (~340 bytes each with
    /// the table's overhead); full: idle ones go, then the least recently seen eighth (counted,
    /// `seq_streams_evicted`; their pending gaps become lost). Only a well-formed report starts
    /// a stream.
    pub max_streams: usize,
    /// A sequence stream without reports for this long is forgotten.
    pub stream_idle_timeout_ms: u64,
    /// Largest jump ahead a sequence number may make and be counted as loss (once the next
    /// number confirms it); a larger one is taken as the switch restarting its numbering
    /// (`seq_resyncs`) after 4 consecutive numbers, and counted `seq_suspect` until then. At
    /// least `reorder_window`.
    pub max_seq_gap: u32,
    /// Reports per batch handed to the sink. 1024 (~1 MiB of column buffers with 6 hops per
    /// report) keeps the buffers the decoder writes within its core's L2 cache: 5-hop decode
    /// ~10 % and 1-hop ~20 % faster than at 8192.
    pub batch_reports: usize,
}

impl Default for IntDecodeConfig {
    fn default() -> Self {
        Self {
            int_dscp: Some(0x17),
            int_dscp_mask: 0x3f,
            int_udp_ports: Vec::new(),
            vxlan_gpe_port: 4790,
            max_hops: 10,
            initial_hop_count: None,
            v2_header: V2Header::Spec,
            reorder_window: 256,
            latency_threshold_ns: None,
            clocks_synchronized: false,
            max_flows: 1 << 16,
            flow_idle_timeout_ms: 300_000,
            max_streams: 4096,
            stream_idle_timeout_ms: 3_600_000,
            max_seq_gap: 1 << 20,
            batch_reports: 1024,
        }
    }
}

impl IntDecodeConfig {
    /// AmLight/NoviFlow: DSCP 0x17, ≤ 10 hops, RHC starts at 10.
    pub fn amlight() -> Self {
        Self {
            initial_hop_count: Some(10),
            ..Self::default()
        }
    }

    /// Small batches, for tests.
    pub fn for_test() -> Self {
        Self {
            batch_reports: 64,
            ..Self::default()
        }
    }
}

/// Something worth telling besides the rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntEvent {
    /// A flow's path changed.
    PathChanged {
        ts_ns: i64,
        flow_key: u64,
        switch_id: u32,
        vlan: Option<u16>,
        old_path: u64,
        new_path: u64,
    },
    /// A flow's latency crossed `latency_threshold_ns` (`up`: now above).
    LatencyCrossed {
        ts_ns: i64,
        flow_key: u64,
        switch_id: u32,
        up: bool,
        latency_ns: u64,
    },
}

/// Receives the decoder's output on the decoder's thread.
pub trait IntSink {
    fn on_batch(&mut self, batch: IntBatch);
    fn on_event(&mut self, _event: &IntEvent) {}
}

impl<F: FnMut(IntBatch)> IntSink for F {
    fn on_batch(&mut self, batch: IntBatch) {
        self(batch)
    }
}

/// A small, fast hasher for the decoder's own maps (keys are switch ids, VLANs; not
/// attacker-chosen beyond what the sharding already exposes).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);
impl Hasher for FastHasher {
    /// One folded multiply (the 128-bit product's halves xored): every output bit depends on
    /// every input bit, in one multiply's latency (the sequence-stream lookup, once per report,
    /// waits for it).
    #[inline]
    fn finish(&self) -> u64 {
        let m = u128::from(self.0) * u128::from(0x9e37_79b9_7f4a_7c15u64);
        (m as u64) ^ (m >> 64) as u64
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u16(&mut self, v: u16) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A map with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[derive(Debug, Clone, Copy)]
struct Flow {
    path: u64,
    last_ns: i64,
    /// EVC index + 1 (0 = none), valid while `evc_epoch` matches the decoder's.
    evc: u32,
    evc_epoch: u32,
    over: bool,
}

impl Aged for Flow {
    fn last_ns(&self) -> i64 {
        self.last_ns
    }
}

/// ms → ns for an idle timeout.
fn idle_ns(ms: u64) -> i64 {
    i64::try_from(ms)
        .unwrap_or(i64::MAX / 1_000_000)
        .saturating_mul(1_000_000)
}

/// One cheap mixing step (rotate, xor, multiply) for chaining words into a key.
#[inline]
fn fold(h: u64, v: u64) -> u64 {
    (h.rotate_left(26) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[inline]
fn mix(h: u64, v: u64) -> u64 {
    let mut x = h.rotate_left(23) ^ v;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Prefetch hints (`prefetcht0`) for the cache lines of `p`'s first 256 bytes (a report's
/// headers and a 5-hop stack).
#[inline(always)]
fn prefetch_lines(p: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        let n = p.len().min(256);
        let start = p.as_ptr();
        let mut at = 0;
        while at < n {
            // SAFETY: `prefetcht0` (SSE, in the x86_64 baseline every build of this crate runs
            // on) is a hint: it reads nothing into the program and never faults, whatever the
            // address; the addresses are inside `p` anyway.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    start.wrapping_add(at).cast(),
                );
            }
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The INT decoder of one core. Owns the loss streams and the flow table of every switch
/// sharded to it, and its column builders.
#[derive(Debug)]
pub struct IntDecoder {
    cfg: IntDecodeConfig,
    stats: IntStats,
    scratch: Box<Scratch>,
    seq: SeqTracker,
    flows: Bounded<Flow>,
    evc: Arc<EvcMap>,
    /// Bumped by every [`IntDecoder::set_evc_map`]: flows' cached EVCs are stale after it.
    evc_epoch: u32,
    batch: IntBatch,
    /// Sender of the datagram being decoded (IPv4 mapped into IPv6); `None` when unknown.
    reporter: Option<[u8; 16]>,
    /// Place of the report being decoded in its datagram (`report_index`; v2.0 groups).
    report_index: u16,
    /// Whether v1.0 reports of AmLight's layout take the one-pass parse
    /// ([`Scratch::v1_amlight`]); off only in tests that compare it with the general parse.
    fast: bool,
}

impl IntDecoder {
    pub fn new(cfg: IntDecodeConfig) -> Self {
        let batch = Self::new_batch(&cfg);
        Self {
            seq: SeqTracker::new(SeqLimits {
                window: cfg.reorder_window,
                max_gap: cfg.max_seq_gap,
                max_streams: cfg.max_streams,
                idle_ns: idle_ns(cfg.stream_idle_timeout_ms),
            }),
            flows: Bounded::new(cfg.max_flows, idle_ns(cfg.flow_idle_timeout_ms)),
            cfg,
            stats: IntStats::default(),
            scratch: Box::default(),
            evc: Arc::new(EvcMap::default()),
            evc_epoch: 1,
            batch,
            reporter: None,
            report_index: 0,
            fast: true,
        }
    }

    /// Column buffers for `batch_reports` reports of up to 6 hops (a batch is handed over
    /// before the hop buffers could overflow).
    fn new_batch(cfg: &IntDecodeConfig) -> IntBatch {
        IntBatch::with_capacity(cfg.batch_reports, cfg.batch_reports * 6)
    }

    /// Replaces the EVC map (the reload hook: the daemon builds a new map with
    /// [`evc::EvcSources::load`] and hands each decoder the `Arc`).
    pub fn set_evc_map(&mut self, map: Arc<EvcMap>) {
        self.evc = map;
        self.evc_epoch = self.evc_epoch.wrapping_add(1).max(1);
    }

    pub fn config(&self) -> &IntDecodeConfig {
        &self.cfg
    }

    /// The counters now (sequence counters included).
    pub fn stats(&self) -> IntStats {
        let mut s = self.stats.clone();
        s.seq_lost = self.seq.lost;
        s.seq_pending = self.seq.pending;
        s.seq_reordered = self.seq.reordered;
        s.seq_duplicates = self.seq.duplicates;
        s.seq_stale = self.seq.stale;
        s.seq_resyncs = self.seq.resyncs;
        s.seq_suspect = self.seq.suspect;
        s.seq_streams = self.seq.streams() as u64;
        (s.seq_streams_expired, s.seq_streams_evicted) = self.seq.streams_dropped();
        s.flows = self.flows.len() as u64;
        s.flows_expired = self.flows.expired;
        s.flows_evicted = self.flows.evicted;
        s
    }

    /// The bounds of the per-sender tables: (most flows, most sequence streams).
    pub fn table_bounds(&self) -> (usize, usize) {
        (self.flows.cap(), self.seq.max_streams())
    }

    /// Decodes one UDP payload received at `recv_ns` from `src` (the reporting switch's
    /// address, `int_reports.reporter_addr`; unspecified = unknown, stored as null; the switch
    /// id of a v0.5 report without a drop/local header is its IPv4 address as a u32, or the low
    /// 32 bits of an IPv6 one).
    pub fn decode<S: IntSink>(&mut self, src: IpAddr, recv_ns: i64, payload: &[u8], sink: &mut S) {
        self.stats.payloads += 1;
        self.stats.bytes += payload.len() as u64;
        // Idle state goes by report time (one comparison each unless a sweep is due).
        self.seq.tick(recv_ns);
        self.flows.tick(recv_ns, |_| {});
        self.reporter = match src {
            IpAddr::V4(a) if a.is_unspecified() => None,
            IpAddr::V6(a) if a.is_unspecified() => None,
            IpAddr::V4(a) => Some(a.to_ipv6_mapped().octets()),
            IpAddr::V6(a) => Some(a.octets()),
        };
        self.scratch.base = payload.as_ptr() as usize;
        let Some(&first) = payload.first() else {
            self.stats.reports += 1;
            self.stats.count(Malformed::Empty);
            return;
        };
        match first >> 4 {
            0 => self.v05(src, recv_ns, payload, sink),
            1 => self.v1(recv_ns, payload, sink),
            2 => self.v2(recv_ns, payload, sink),
            _ => {
                self.stats.reports += 1;
                self.stats.count(Malformed::UnknownReportVersion);
            }
        }
        if self.batch.reports.rows() >= self.cfg.batch_reports
            || self.batch.hops.rows() + MAX_HOPS > self.batch.hops.capacity()
        {
            self.emit(sink);
        }
    }

    /// Decodes `datagrams` (sender, receive time, UDP payload) in order, exactly as
    /// [`Self::decode`] of each would (the same rows, counters and loss), with the next
    /// datagram's bytes loading (CPU prefetch hints) while one is decoded: for a receive batch
    /// (a GRO buffer's segments, a poll's datagrams).
    pub fn decode_batch<'p, S: IntSink>(
        &mut self,
        datagrams: impl IntoIterator<Item = (IpAddr, i64, &'p [u8])>,
        sink: &mut S,
    ) {
        let mut it = datagrams.into_iter();
        let mut next = it.next();
        while let Some((src, ts, p)) = next {
            next = it.next();
            if let Some((_, _, n)) = next {
                prefetch_lines(n);
            }
            self.decode(src, ts, p, sink);
        }
    }

    /// Hands the rows decoded so far to the sink and forgets idle flows. Call it when the feed
    /// goes quiet and before shutdown.
    pub fn flush<S: IntSink>(&mut self, now_ns: i64, sink: &mut S) {
        if self.batch.reports.rows() < self.batch.reports.capacity() / 4 {
            // A small batch: hand over a copy the size of its rows and keep the big buffers
            // (warm, already faulted in) for the next one.
            if !self.batch.is_empty() {
                self.stats.batches += 1;
                sink.on_batch(self.batch.take_compact());
            }
        } else {
            self.emit(sink);
        }
        self.flows.expire(now_ns, |_| {});
        self.seq.tick(now_ns);
    }

    /// Counts a UDP GRO receive that held `datagrams` datagrams (the receive loop cuts it and
    /// calls [`Self::decode`] for each).
    pub fn count_gro(&mut self, datagrams: u64) {
        self.stats.gro_receives += 1;
        self.stats.gro_datagrams += datagrams;
    }

    /// Ends loss accounting: gaps still pending in a reordering window become final.
    pub fn finish_sequences(&mut self) {
        self.seq.finish();
    }

    fn emit<S: IntSink>(&mut self, sink: &mut S) {
        if self.batch.is_empty() {
            return;
        }
        let b = std::mem::replace(&mut self.batch, Self::new_batch(&self.cfg));
        self.stats.batches += 1;
        sink.on_batch(b);
    }

    fn src_id(src: IpAddr) -> u32 {
        match src {
            IpAddr::V4(a) => u32::from(a),
            IpAddr::V6(a) => {
                let o = a.octets();
                u32::from_be_bytes([o[12], o[13], o[14], o[15]])
            }
        }
    }

    fn v05<S: IntSink>(&mut self, src: IpAddr, ts: i64, b: &[u8], sink: &mut S) {
        self.stats.reports += 1;
        self.stats.reports_v05 += 1;
        let off = match self.scratch.v05_header(b) {
            Ok(o) => o,
            Err(m) => return self.stats.count(m),
        };
        let sc = &mut *self.scratch;
        if !sc.rep.has_switch {
            sc.rep.switch_id = Self::src_id(src);
        }
        sc.inner = Default::default();
        sc.int = None;
        let ctx = Ctx { cfg: &self.cfg };
        let res = sc.ethernet(&b[off..], ctx, &mut self.stats, true);
        let (sw, hw, seq) = (sc.rep.switch_id, sc.rep.hw_id, sc.rep.seq);
        let gap = self.seq.observe(sw, hw, 32, seq, ts, res.is_ok()).gap;
        match res {
            Ok(()) => self.push::<false, S>(ts, gap, b, sink),
            Err(m) => self.stats.count(m),
        }
    }

    fn v1<S: IntSink>(&mut self, ts: i64, b: &[u8], sink: &mut S) {
        self.stats.reports += 1;
        self.stats.reports_v1 += 1;
        let sc = &mut *self.scratch;
        if self.fast && b.len() >= 16 && sc.v1_amlight(b, &self.cfg, &mut self.stats) {
            let (sw, hw, seq) = (sc.rep.switch_id, sc.rep.hw_id, sc.rep.seq);
            let gap = self.seq.observe(sw, hw, 32, seq, ts, true).gap;
            return self.push::<true, S>(ts, gap, b, sink);
        }
        let r = sc.v1_header(b);
        if b.len() < 16 {
            if let Err(m) = r {
                self.stats.count(m);
            }
            return;
        }
        // The fixed header was readable: its sequence number counts even if the rest is bad
        // (in a stream a well-formed report started).
        let (sw, hw, seq) = (sc.rep.switch_id, sc.rep.hw_id, sc.rep.seq);
        let res = r.and_then(|(off, nprot)| {
            sc.inner = Default::default();
            sc.int = None;
            let ctx = Ctx { cfg: &self.cfg };
            let rest = &b[off..];
            match nprot {
                0 => sc.ethernet(rest, ctx, &mut self.stats, true),
                1 => sc.ipv4(rest, ctx, &mut self.stats, true),
                _ => sc.ipv6(rest, ctx, &mut self.stats, true),
            }
        });
        let gap = self.seq.observe(sw, hw, 32, seq, ts, res.is_ok()).gap;
        match res {
            Ok(()) => self.push::<false, S>(ts, gap, b, sink),
            Err(m) => self.stats.count(m),
        }
    }

    fn v2<S: IntSink>(&mut self, ts: i64, b: &[u8], sink: &mut S) {
        self.stats.reports_v2 += 1;
        let (hw_id, seq, bits, node) = match Scratch::v2_group(b, self.cfg.v2_header) {
            Ok(v) => v,
            Err(m) => {
                self.stats.reports += 1;
                return self.stats.count(m);
            }
        };
        // The group's number counts once, when its first report decodes (a group of malformed
        // reports only counts in a stream that exists).
        let mut observed = false;
        let mut off = 8;
        // Each individual report is at least its 4-byte header: the loop ends.
        let mut index = 0u16;
        while off < b.len() {
            self.report_index = index;
            index = index.wrapping_add(1);
            self.stats.reports += 1;
            let sc = &mut *self.scratch;
            sc.rep = wire::Rep {
                version: 2,
                hw_id,
                seq,
                switch_id: node,
                has_switch: true,
                ..Default::default()
            };
            let ctx = Ctx { cfg: &self.cfg };
            match sc.v2_report(&b[off..], ctx, &mut self.stats) {
                Ok(len) => {
                    let gap = if observed {
                        0
                    } else {
                        observed = true;
                        self.seq.observe(node, hw_id, bits, seq, ts, true).gap
                    };
                    self.push::<false, S>(ts, gap, b, sink);
                    match len {
                        Some(n) => off += n,
                        None => break,
                    }
                }
                Err(m) => {
                    self.stats.count(m);
                    // A report whose own lengths agree but whose contents are bad ends where
                    // its Report Length says: the next one starts there. One whose lengths
                    // contradict each other (or run past the payload) has no end we can trust:
                    // the rest of the group is skipped (counted), never read as reports.
                    match b.get(off + 1) {
                        Some(&l)
                            if !m.breaks_v2_framing()
                                && l != 0xff
                                && off + 4 + usize::from(l) * 4 <= b.len() =>
                        {
                            off += 4 + usize::from(l) * 4;
                        }
                        // The last report (Report Length 0xFF: it runs to the end).
                        Some(0xff) if !m.breaks_v2_framing() => break,
                        _ => {
                            self.stats.v2_group_bytes_skipped += (b.len() - off) as u64;
                            break;
                        }
                    }
                }
            }
        }
        self.report_index = 0;
        if !observed {
            self.seq.observe(node, hw_id, bits, seq, ts, false);
        }
    }

    /// Per-hop latency in ns: hop latency if reported, else egress − ingress (wrap-aware for
    /// 32-bit timestamps); `None` (and counted) when negative.
    #[inline]
    fn hop_latency(md: &Md, negative: &mut u64) -> Option<u64> {
        if let Some(l) = md.hop_latency {
            return Some(u64::from(l));
        }
        let (i, e) = (md.ingress_ts?, md.egress_ts?);
        ts_diff(e, i, md.ts_bits).or_else(|| {
            *negative += 1;
            None
        })
    }

    /// Appends the scratch's report (and its hops and drop row) to the batch; `payload` is the
    /// datagram it came from (a common-layout stack is read from there).
    ///
    /// `AMLIGHT`: the scratch holds a report [`Scratch::v1_amlight`] parsed (the columns that
    /// layout never carries are not looked at).
    #[inline(never)]
    fn push<const AMLIGHT: bool, S: IntSink>(
        &mut self,
        ts: i64,
        gap: u32,
        payload: &[u8],
        sink: &mut S,
    ) {
        // Rows refer to EVCs by index into the map's list: a batch holds one map's list.
        if !Arc::ptr_eq(&self.batch.evcs, self.evc.names()) {
            if !self.batch.is_empty() {
                let b = std::mem::replace(&mut self.batch, Self::new_batch(&self.cfg));
                self.stats.batches += 1;
                sink.on_batch(b);
            }
            self.batch.evcs = Arc::clone(self.evc.names());
        }
        let sc = &*self.scratch;
        let (mut rep, mut inner, mut ih) = (sc.rep, sc.inner, sc.int);
        if AMLIGHT {
            // What `v1_amlight` leaves unset or fixed, as constants: the writes of those
            // columns fold away.
            rep.md = Md {
                ts_bits: 32,
                ..Md::default()
            };
            (rep.i, rep.rep_type, rep.in_type, rep.drop_header) = (None, None, None, false);
            inner.inner_vlan = None;
            (inner.ip_version, inner.proto) = (Some(4), Some(17));
            let h = ih.unwrap_or_default();
            ih = Some(wire::IntHdr {
                version: 1,
                hop_ml: 6,
                instructions: 0xFC00,
                common: Some((h.common.map_or(0, |c| c.0), 24)),
                ..h
            });
            debug_assert!(rep.md == sc.rep.md && inner == sc.inner && ih == sc.int);
            debug_assert!(
                (rep.i, rep.rep_type, rep.in_type) == (sc.rep.i, sc.rep.rep_type, sc.rep.in_type)
            );
            debug_assert!(!sc.rep.drop_header);
        }
        let (rep, inner) = (&rep, &inner);
        let nh = ih.map_or(0, |h| usize::from(h.hops)).min(MAX_HOPS);
        // Hop `i` in path order: from the datagram (the common layout; the stack's top, the
        // last switch, comes first) or from the scratch.
        let stack = ih
            .and_then(|h| h.common)
            .map(|(at, hb)| (&payload[at..at + nh * hb], hb));
        let int_version = ih.map_or(0, |h| h.version);
        let hop = |i: usize| -> Md {
            match stack {
                Some((s, hb)) => common_md(int_version, &s[(nh - 1 - i) * hb..]),
                None => sc.hops[i],
            }
        };
        let st = &mut self.stats;
        st.reports_decoded += 1;

        let has_flow = inner.ip_version.is_some() || inner.vlan.is_some();
        let flow_key = has_flow.then(|| {
            // One multiply per word on a single chain, one finishing mix: the key must only
            // spread flows (the flow table and `flow_key` column), it is not a defence.
            let w = |b: &[u8; 16], i: usize| {
                let mut x = [0u8; 8];
                x.copy_from_slice(&b[i..i + 8]);
                u64::from_be_bytes(x)
            };
            let vlans = u64::from(inner.vlan.unwrap_or(0xffff)) << 32
                | u64::from(inner.inner_vlan.unwrap_or(0xffff)) << 16
                | u64::from(inner.ip_version.unwrap_or(0));
            let ports = u64::from(inner.proto.unwrap_or(0)) << 32
                | u64::from(inner.sport.unwrap_or(0)) << 16
                | u64::from(inner.dport.unwrap_or(0));
            let mut h = fold(0x243f_6a88_85a3_08d3, vlans);
            h = fold(h, w(&inner.src, 0));
            h = fold(h, w(&inner.src, 8));
            h = fold(h, w(&inner.dst, 0));
            h = fold(h, w(&inner.dst, 8));
            mix(h, ports)
        });

        // The flow's entry, looked up before the hops are written: its load (a cache miss when
        // the flow was last seen long ago) overlaps that work.
        let flow = flow_key.map(|fk| (fk, self.flows.get_mut(fk)));

        // The hop rows (committed with the report's row), the path (switch ids in order) and
        // the sum of per-hop latencies, in one pass over the hops.
        let b = &mut self.batch;
        b.hops.reserve(nh);
        let h0 = b.hops.rows();
        let mut acc = HopAcc {
            key: (ts, rep.switch_id, rep.hw_id, rep.seq, self.report_index),
            negative: &mut st.negative_hop_latency,
            sum: (nh > 0).then_some(0),
            path: (nh > 0).then_some(0x5157_4e41_4d50_4154),
        };
        // Two loops, so that a common-layout hop is decoded in registers and written at once.
        let mut c = b.hops.rows_mut(h0, nh);
        match stack {
            Some((s, hb)) => {
                for i in 0..nh {
                    let h = common_md(int_version, &s[(nh - 1 - i) * hb..]);
                    acc.hop(&mut c, i, &h);
                }
            }
            None => {
                for (i, h) in sc.hops[..nh].iter().enumerate() {
                    acc.hop(&mut c, i, h);
                }
            }
        }
        let (sum, path) = (acc.sum, acc.path);
        let path = path.map(|p| mix(p, nh as u64));
        let e2e = if self.cfg.clocks_synchronized && nh > 0 {
            let (first, last) = (hop(0), hop(nh - 1));
            match (first.ingress_ts, last.egress_ts) {
                (Some(i), Some(e)) => ts_diff(e, i, first.ts_bits),
                _ => None,
            }
        } else {
            None
        };

        // Flow state: path changes, threshold crossings, and the flow's cached EVC (one
        // lookup per report).
        let (mut path_changed, mut over) = (None, None);
        let epoch = self.evc_epoch;
        let mut cached: Option<u32> = None;
        if let Some((fk, found)) = flow {
            let latency = sum;
            let threshold = self.cfg.latency_threshold_ns;
            let now_over = threshold.zip(latency).map(|(t, l)| l > t);
            match found {
                Some(f) => {
                    f.last_ns = f.last_ns.max(ts);
                    let mut changed = false;
                    if let Some(p) = path {
                        changed = f.path != p;
                        path_changed = Some(changed);
                        if changed {
                            st.path_changes += 1;
                            sink.on_event(&IntEvent::PathChanged {
                                ts_ns: ts,
                                flow_key: fk,
                                switch_id: rep.switch_id,
                                vlan: inner.vlan,
                                old_path: f.path,
                                new_path: p,
                            });
                            f.path = p;
                        }
                    }
                    if let Some(o) = now_over {
                        if o != f.over {
                            if o {
                                st.latency_crossings_up += 1;
                            } else {
                                st.latency_crossings_down += 1;
                            }
                            sink.on_event(&IntEvent::LatencyCrossed {
                                ts_ns: ts,
                                flow_key: fk,
                                switch_id: rep.switch_id,
                                up: o,
                                latency_ns: latency.unwrap_or(0),
                            });
                            f.over = o;
                        }
                        over = Some(o);
                    }
                    if f.evc_epoch == epoch && !changed {
                        cached = Some(f.evc);
                    }
                }
                None => {
                    path_changed = path.map(|_| false);
                    over = now_over;
                    if now_over == Some(true) {
                        st.latency_crossings_up += 1;
                        sink.on_event(&IntEvent::LatencyCrossed {
                            ts_ns: ts,
                            flow_key: fk,
                            switch_id: rep.switch_id,
                            up: true,
                            latency_ns: latency.unwrap_or(0),
                        });
                    }
                    self.flows.insert(
                        fk,
                        Flow {
                            path: path.unwrap_or(0),
                            over: now_over.unwrap_or(false),
                            last_ns: ts,
                            evc: 0,
                            evc_epoch: 0,
                        },
                        ts,
                        |_| {},
                    );
                }
            }
        }

        // EVC: the sink switch with its egress (UNI) port, then the path's first switch with
        // its ingress port. Cached per flow until the map or the flow's path changes.
        let evc_index = match cached {
            Some(c) => c.checked_sub(1),
            None => {
                let idx = inner.vlan.and_then(|vlan| {
                    let sink_port = (nh > 0)
                        .then(|| hop(nh - 1).egress_port)
                        .flatten()
                        .or(rep.md.egress_port);
                    let first = (nh > 0)
                        .then(|| hop(0))
                        .and_then(|h| h.node_id.map(|n| (n, h.ingress_port)));
                    let mut keys = [(rep.switch_id, sink_port), (0, None)];
                    let n = match first {
                        Some(f) => {
                            keys[1] = f;
                            2
                        }
                        None => 1,
                    };
                    self.evc.lookup_index(vlan, &keys[..n])
                });
                if let Some(f) = flow_key.and_then(|fk| self.flows.get_mut(fk)) {
                    f.evc = idx.map_or(0, |i| i + 1);
                    f.evc_epoch = epoch;
                }
                idx
            }
        };
        if inner.vlan.is_some() {
            if evc_index.is_some() {
                st.evc_matched += 1;
            } else {
                st.evc_unmatched += 1;
            }
        }

        let b = &mut self.batch;
        let md = &rep.md;
        let ip = inner.ip_version.is_some();
        b.reports
            .row(ts, rep.switch_id)
            .report_version(Some(rep.version))
            .hw_id(Some(rep.hw_id))
            .seq(Some(rep.seq))
            .report_index(Some(self.report_index))
            .seq_gap(Some(gap))
            .dropped(Some(rep.d))
            .congested(Some(rep.q))
            .tracked(Some(rep.f))
            .intermediate(rep.i)
            .rep_type(rep.rep_type)
            .in_type(rep.in_type)
            .report_ingress_ts(rep.ingress_ts)
            .rep_ingress_port(md.ingress_port)
            .rep_egress_port(md.egress_port)
            .rep_hop_latency(md.hop_latency)
            .rep_queue_id(md.queue_id)
            .rep_queue_occupancy(md.queue_occupancy)
            .rep_egress_ts(md.egress_ts)
            .rep_drop_reason(md.drop_reason)
            .rep_tx_util(md.tx_util)
            .rep_buffer_id(md.buffer_id)
            .rep_buffer_occupancy(md.buffer_occupancy)
            .reporter_addr(self.reporter)
            .vlan(inner.vlan)
            .inner_vlan(inner.inner_vlan)
            .ip_version(inner.ip_version)
            .src_addr(ip.then_some(inner.src))
            .dst_addr(ip.then_some(inner.dst))
            .ip_proto(inner.proto)
            .src_port(inner.sport)
            .dst_port(inner.dport)
            .dscp(inner.dscp)
            .flow_key(flow_key)
            .int_version(ih.map(|h| h.version))
            .hop_count(ih.map(|h| h.hops))
            .hop_ml(ih.map(|h| h.hop_ml))
            .instructions(ih.map(|h| h.instructions))
            .remaining_hop_count(ih.and_then(|h| h.rhc))
            .path_id(path)
            .path_changed(path_changed)
            .latency_sum_ns(sum)
            .latency_e2e_ns(e2e)
            .latency_over(over)
            .evc_id(evc_index)
            .evc_name(evc_index)
            .done();
        b.hops.commit(nh);
        st.hops += nh as u64;
        if nh > 0 {
            st.int_stacks += 1;
        }
        // A drop row when the report says a packet was dropped: D set, or a v0.5 Drop Report
        // header. A drop-reason word with D = 0 stays in `int_reports` only (the README's
        // "Drops").
        if rep.drop_header || rep.d {
            b.drops
                .row(ts, rep.switch_id)
                .report_version(Some(rep.version))
                .hw_id(Some(rep.hw_id))
                .seq(Some(rep.seq))
                .ingress_port(md.ingress_port)
                .egress_port(md.egress_port)
                .queue_id(md.queue_id)
                .drop_reason(md.drop_reason)
                .vlan(inner.vlan)
                .src_addr(ip.then_some(inner.src))
                .dst_addr(ip.then_some(inner.dst))
                .ip_proto(inner.proto)
                .src_port(inner.sport)
                .dst_port(inner.dport)
                .flow_key(flow_key)
                .evc_id(evc_index)
                .done();
            st.drops += 1;
        }
    }
}

/// What [`IntDecoder::push`] carries over a report's hops: the report's key (ts, switch, hw_id,
/// seq, report_index), the latency sum and the path hash so far.
struct HopAcc<'a> {
    key: (i64, u32, u8, u32, u16),
    negative: &'a mut u64,
    sum: Option<u64>,
    path: Option<u64>,
}

/// Stores `v` in `slot` and its bit in `valid`, without a branch (a null's slot gets the
/// default: it is never read). For the columns most layouts carry.
#[inline(always)]
fn put<T: Default>(slot: &mut T, valid: &mut u64, bit: u32, v: Option<T>) {
    *valid |= u64::from(v.is_some()) << bit;
    *slot = v.unwrap_or_default();
}

/// Stores `v` in `slot` and its bit in `valid` when present: for the columns most layouts leave
/// null (their buffers stay untouched).
#[inline(always)]
fn put_some<T>(slot: &mut T, valid: &mut u64, bit: u32, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
        *valid |= 1 << bit;
    }
}

impl HopAcc<'_> {
    /// Writes hop `i` (path order) as row `i` of `c` and adds it to the sum and the path.
    #[inline(always)]
    fn hop(&mut self, c: &mut HopRows<'_>, i: usize, h: &Md) {
        let l = IntDecoder::hop_latency(h, self.negative);
        self.sum = match (self.sum, l) {
            (Some(s), Some(l)) => Some(s.saturating_add(l)),
            _ => None,
        };
        self.path = match (self.path, h.node_id) {
            (Some(p), Some(n)) => Some(fold(p, u64::from(n))),
            _ => None,
        };
        let (ts, switch, hw_id, seq, report_index) = self.key;
        c.ts[i] = ts;
        c.switch_id[i] = switch;
        c.hw_id[i] = hw_id;
        c.seq[i] = seq;
        c.report_index[i] = report_index;
        c.hop_index[i] = i as u8;
        let mut v = 1 << HopBit::hw_id
            | 1 << HopBit::seq
            | 1 << HopBit::report_index
            | 1 << HopBit::hop_index;
        put(&mut c.node_id[i], &mut v, HopBit::node_id, h.node_id);
        put(
            &mut c.ingress_port[i],
            &mut v,
            HopBit::ingress_port,
            h.ingress_port,
        );
        put(
            &mut c.egress_port[i],
            &mut v,
            HopBit::egress_port,
            h.egress_port,
        );
        put(
            &mut c.hop_latency[i],
            &mut v,
            HopBit::hop_latency,
            h.hop_latency,
        );
        put(&mut c.queue_id[i], &mut v, HopBit::queue_id, h.queue_id);
        put(
            &mut c.queue_occupancy[i],
            &mut v,
            HopBit::queue_occupancy,
            h.queue_occupancy,
        );
        put(
            &mut c.ingress_ts[i],
            &mut v,
            HopBit::ingress_ts,
            h.ingress_ts,
        );
        put(&mut c.egress_ts[i], &mut v, HopBit::egress_ts, h.egress_ts);
        put(&mut c.latency_ns[i], &mut v, HopBit::latency_ns, l);
        put_some(
            &mut c.l2_ingress_port[i],
            &mut v,
            HopBit::l2_ingress_port,
            h.l2_ingress_port,
        );
        put_some(
            &mut c.l2_egress_port[i],
            &mut v,
            HopBit::l2_egress_port,
            h.l2_egress_port,
        );
        put_some(
            &mut c.queue_congestion[i],
            &mut v,
            HopBit::queue_congestion,
            h.queue_congestion,
        );
        put_some(&mut c.tx_util[i], &mut v, HopBit::tx_util, h.tx_util);
        put_some(&mut c.buffer_id[i], &mut v, HopBit::buffer_id, h.buffer_id);
        put_some(
            &mut c.buffer_occupancy[i],
            &mut v,
            HopBit::buffer_occupancy,
            h.buffer_occupancy,
        );
        c.valid[i] = v;
    }
}

/// `later − earlier` for device timestamps of `bits` width: 32-bit ones wrap (a difference of
/// 2^31 or more is taken as negative); `None` when negative.
#[inline]
pub fn ts_diff(later: u64, earlier: u64, bits: u8) -> Option<u64> {
    if bits == 32 {
        let d = (later as u32).wrapping_sub(earlier as u32);
        (d < 1 << 31).then_some(u64::from(d))
    } else {
        later.checked_sub(earlier)
    }
}
