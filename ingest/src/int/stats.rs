//! INT decode counters: plain integers owned by the decoder thread, published to its counter
//! block (`source.rs`) once per publish interval.

macro_rules! reasons {
    ($($(#[doc = $doc:literal])* $v:ident = $name:literal,)*) => {
        /// Every way a telemetry report can be wrong, each counted separately. None stops the
        /// decoder; a report with any of them produces no rows (its sequence number still counts
        /// for loss when its header was readable).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Malformed {
            $($(#[doc = $doc])* $v,)*
        }

        impl Malformed {
            pub const ALL: &'static [Malformed] = &[$(Malformed::$v,)*];

            /// Stable snake_case name (the `reason` label).
            pub fn name(self) -> &'static str {
                match self { $(Malformed::$v => $name,)* }
            }
        }
    };
}

reasons! {
    /// Empty UDP payload.
    Empty = "empty",
    /// First nibble is not 0, 1 or 2.
    UnknownReportVersion = "unknown_report_version",
    /// v0.5: fewer than 12 bytes.
    V05HeaderTruncated = "v05_header_truncated",
    /// v0.5: NProto other than 0, 1, 2.
    V05UnknownNextProto = "v05_unknown_next_proto",
    /// v0.5: drop report header (12 B) or switch-local header (16 B) cut short.
    V05SubHeaderTruncated = "v05_sub_header_truncated",
    /// v1.0: fewer than 16 bytes.
    V1HeaderTruncated = "v1_header_truncated",
    /// v1.0: Length < 4 words.
    V1LengthTooSmall = "v1_length_too_small",
    /// v1.0: Length runs past the payload.
    V1LengthPastPayload = "v1_length_past_payload",
    /// v1.0: Length ≠ 4 + one word per RepMdBits bit.
    V1LengthMdMismatch = "v1_length_md_mismatch",
    /// v1.0: NProt other than 0 (Ethernet), 1 (IPv4), 2 (IPv6).
    V1UnknownNextProto = "v1_unknown_next_proto",
    /// v2.0: fewer than 8 bytes of group header.
    V2GroupTruncated = "v2_group_truncated",
    /// v2.0: individual report header (4 B) cut short.
    V2ReportHeaderTruncated = "v2_report_header_truncated",
    /// v2.0: Report Length runs past the payload.
    V2ReportPastPayload = "v2_report_past_payload",
    /// v2.0: main contents (8 B + MD Length words) longer than the report.
    V2MdPastReport = "v2_md_past_report",
    /// v2.0: the metadata RepMdBits asks for does not fit MD Length.
    V2MdBitsExceedMdLength = "v2_md_bits_exceed_md_length",
    /// v2.0: RepType 2 (IOAM) — recognised, not decoded.
    V2Ioam = "v2_ioam",
    /// v2.0: RepType 3–15 (reserved).
    V2UnknownRepType = "v2_unknown_rep_type",
    /// v2.0: InType 6–15 (reserved).
    V2UnknownInType = "v2_unknown_in_type",
    /// v2.0: TLV header or data cut short.
    V2TlvTruncated = "v2_tlv_truncated",
    /// Inner Ethernet header cut short.
    EthernetTruncated = "ethernet_truncated",
    /// More than 4 VLAN tags.
    TooManyVlanTags = "too_many_vlan_tags",
    /// Inner IPv4 header cut short.
    Ipv4Truncated = "ipv4_truncated",
    /// IPv4 IHL < 5.
    Ipv4BadIhl = "ipv4_bad_ihl",
    /// Inner IPv6 header or extension header cut short.
    Ipv6Truncated = "ipv6_truncated",
    /// TCP/UDP header cut short (or TCP data offset < 5).
    L4Truncated = "l4_truncated",
    /// INT signalled but fewer bytes than a shim.
    ShimTruncated = "shim_truncated",
    /// INT shim Type not hop-by-hop/INT-MD (or destination/MX for v2).
    ShimBadType = "shim_bad_type",
    /// Shim Length smaller than the fixed INT headers.
    ShimLengthTooSmall = "shim_length_too_small",
    /// Shim Length runs past the packet.
    ShimPastPacket = "shim_past_packet",
    /// INT metadata header cut short.
    IntHeaderTruncated = "int_header_truncated",
    /// INT header version not 0, 1 or 2.
    UnknownIntVersion = "unknown_int_version",
    /// Stack length not a whole number of hops, Hop ML 0 with a stack, or Hop ML smaller than
    /// the instructions it must hold.
    HopMlMismatch = "hop_ml_mismatch",
    /// v0.5: Ins Cnt ≠ number of instruction bits set.
    InsCntMismatch = "ins_cnt_mismatch",
    /// More hops than `max_hops`.
    TooManyHops = "too_many_hops",
    /// VXLAN-GPE header or its INT shim cut short.
    GpeTruncated = "gpe_truncated",
}

impl Malformed {
    /// A v2.0 report whose lengths contradict each other or run past the payload: where it
    /// ends, and so where the next report of its group starts, is unknown.
    pub fn breaks_v2_framing(self) -> bool {
        matches!(
            self,
            Malformed::V2ReportHeaderTruncated
                | Malformed::V2ReportPastPayload
                | Malformed::V2MdPastReport
                | Malformed::V2MdBitsExceedMdLength
                | Malformed::V2TlvTruncated
        )
    }
}

/// Calls `$m!(field, …)` with every plain `u64` field of [`IntStats`] (all but `malformed`): one
/// list for summing, publishing and reading back, so a new field cannot be forgotten in one.
macro_rules! with_int_counters {
    ($m:ident) => {
        $m!(
            payloads,
            bytes,
            gro_receives,
            gro_datagrams,
            reports,
            reports_decoded,
            reports_malformed,
            hops,
            drops,
            batches,
            reports_v05,
            reports_v1,
            reports_v2,
            int_stacks,
            int_not_signalled,
            int_mx_or_destination,
            tcp_int_before_options,
            unknown_instruction_bits,
            hop_count_rhc_mismatch,
            v2_reserved_md_bits,
            domain_specific_bytes_skipped,
            v2_reports_skipped,
            v2_group_bytes_skipped,
            negative_hop_latency,
            seq_lost,
            seq_pending,
            seq_reordered,
            seq_duplicates,
            seq_stale,
            seq_resyncs,
            seq_suspect,
            seq_streams,
            seq_streams_expired,
            seq_streams_evicted,
            flows,
            flows_evicted,
            flows_expired,
            path_changes,
            latency_crossings_up,
            latency_crossings_down,
            evc_matched,
            evc_unmatched
        )
    };
}

/// Counters of one INT decoder.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct IntStats {
    /// UDP payloads given to the decoder.
    pub payloads: u64,
    /// Their bytes.
    pub bytes: u64,
    /// UDP GRO receives that held several datagrams (the kernel coalesced them).
    pub gro_receives: u64,
    /// Datagrams in those.
    pub gro_datagrams: u64,
    /// Individual reports whose header was readable (v2.0 counts each coalesced report).
    pub reports: u64,
    /// Reports decoded into rows.
    pub reports_decoded: u64,
    /// Reports dropped for a [`Malformed`] reason (sum of `malformed`).
    pub reports_malformed: u64,
    /// Hop rows written.
    pub hops: u64,
    /// Drop rows written.
    pub drops: u64,
    /// Batches handed to the sink.
    pub batches: u64,
    /// Reports of each Telemetry Report version (0 = v0.5, 1 = v1.0, 2 = v2.0).
    pub reports_v05: u64,
    pub reports_v1: u64,
    pub reports_v2: u64,
    /// Reports that carried an INT stack.
    pub int_stacks: u64,
    /// Reports with the F flag but no INT signal (DSCP, UDP port, VXLAN-GPE) in the packet.
    pub int_not_signalled: u64,
    /// v2.x INT-MX and INT-Destination headers: recognised, no stack.
    pub int_mx_or_destination: u64,
    /// TCP packets whose INT sat after the fixed 20-byte header, before the options (NoviFlow).
    pub tcp_int_before_options: u64,
    /// Instruction bits the decoder does not know (their words are skipped).
    pub unknown_instruction_bits: u64,
    /// v1.0/v2.x stacks whose hop count ≠ `initial_hop_count` − Remaining Hop Count (tolerated).
    pub hop_count_rhc_mismatch: u64,
    /// v2.0 RepMdBits reserved bits (their metadata and what follows it are skipped).
    pub v2_reserved_md_bits: u64,
    /// Bytes of v2.0 domain-specific metadata and DS TLVs skipped.
    pub domain_specific_bytes_skipped: u64,
    /// v2.0 individual reports skipped whole (IOAM, reserved RepType).
    pub v2_reports_skipped: u64,
    /// Bytes of v2.0 groups left unread after a report whose lengths contradict each other
    /// (that report and what follows it: where the next report starts is unknown).
    pub v2_group_bytes_skipped: u64,
    /// Hops where egress timestamp < ingress timestamp (latency left null).
    pub negative_hop_latency: u64,
    /// Reports missing per sequence numbers (final: left the reordering window unfilled).
    pub seq_lost: u64,
    /// Reports missing but still inside the reordering window (may arrive late).
    pub seq_pending: u64,
    /// Late reports that filled a gap inside the window.
    pub seq_reordered: u64,
    /// Reports whose sequence number was already seen.
    pub seq_duplicates: u64,
    /// Reports older than the reordering window (not counted as lost or found).
    pub seq_stale: u64,
    /// Sequence resynchronisations (a switch restarted its numbering).
    pub seq_resyncs: u64,
    /// Reports whose number jumped further ahead than the reordering window and was not
    /// (yet) confirmed by the next number: not counted as loss.
    pub seq_suspect: u64,
    /// Sequence streams tracked now (gauge; at most `max_streams` per decoder).
    pub seq_streams: u64,
    /// Streams forgotten after `stream_idle_timeout_ms` without reports.
    pub seq_streams_expired: u64,
    /// Streams forgotten to make room (table full; least recently seen first).
    pub seq_streams_evicted: u64,
    /// Flows tracked now (gauge; at most `max_flows` per decoder).
    pub flows: u64,
    /// Flows forgotten to make room (table full; least recently seen first).
    pub flows_evicted: u64,
    /// Flows expired after `flow_idle_timeout_ms`.
    pub flows_expired: u64,
    /// Path changes seen (events).
    pub path_changes: u64,
    /// Latency threshold crossings upwards (events).
    pub latency_crossings_up: u64,
    /// Latency threshold crossings downwards (events).
    pub latency_crossings_down: u64,
    /// Reports attributed to an EVC.
    pub evc_matched: u64,
    /// Reports with a VLAN that no EVC claims.
    pub evc_unmatched: u64,
    /// Per [`Malformed`] reason (serialised as `{reason: count}`, zeros left out).
    pub malformed: MalformedCounts,
}

/// One counter per [`Malformed`] reason, indexed by its discriminant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedCounts(pub [u64; Malformed::ALL.len()]);

impl Default for MalformedCounts {
    fn default() -> Self {
        Self([0; Malformed::ALL.len()])
    }
}

impl serde::Serialize for MalformedCounts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for r in Malformed::ALL {
            if self.0[*r as usize] != 0 {
                map.serialize_entry(r.name(), &self.0[*r as usize])?;
            }
        }
        map.end()
    }
}

impl IntStats {
    #[inline]
    pub(crate) fn count(&mut self, r: Malformed) {
        self.malformed.0[r as usize] += 1;
        self.reports_malformed += 1;
    }

    /// The count for one reason.
    pub fn malformed(&self, r: Malformed) -> u64 {
        self.malformed.0[r as usize]
    }

    /// Adds `o` into `self` (the daemon sums its decoders; `flows`, `seq_streams` and
    /// `seq_pending` are levels, summed too).
    pub fn add(&mut self, o: &IntStats) {
        macro_rules! add { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        with_int_counters!(add);
        for (a, b) in self.malformed.0.iter_mut().zip(o.malformed.0.iter()) {
            *a += b;
        }
    }

    /// Number of plain counters ([`Self::plain_counters`]).
    pub(crate) const PLAIN_COUNTERS: usize = {
        macro_rules! count { ($($f:ident),*) => { [$(stringify!($f)),*].len() } }
        with_int_counters!(count)
    };

    /// Every plain counter (not `malformed`), in a fixed order: what a decoder thread publishes
    /// to its counter block ([`Self::set_plain_counters`] reads it back).
    pub(crate) fn plain_counters(&self) -> [u64; Self::PLAIN_COUNTERS] {
        macro_rules! arr { ($($f:ident),*) => { [$(self.$f),*] } }
        with_int_counters!(arr)
    }

    /// Sets every plain counter from [`Self::plain_counters`]' order.
    pub(crate) fn set_plain_counters(&mut self, v: &[u64; Self::PLAIN_COUNTERS]) {
        macro_rules! set { ($($f:ident),*) => {{ let mut it = v.iter(); $( self.$f = *it.next().expect("one value per field"); )* }} }
        with_int_counters!(set);
    }

    /// Every loss the sequence numbers show, final or still pending.
    pub fn seq_missing(&self) -> u64 {
        self.seq_lost + self.seq_pending
    }
}
