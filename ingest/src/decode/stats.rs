//! Decode counters. Owned by the decoder thread (plain integers, no atomics on the hot path);
//! published with relaxed stores into the decoder's own counter block every few ms (see
//! `pipeline`), read by the status tick.

/// Every way input can be wrong, each counted separately. None stops the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum Malformed {
    /// Fewer than 16 bytes left where a message header should start.
    MessageHeaderTruncated,
    /// Version field is not 10.
    BadVersion,
    /// Message length < 16 (including 0).
    MessageLengthTooSmall,
    /// Message length runs past the buffer.
    MessagePastBuffer,
    /// Fewer than 4 bytes left where a set header should start.
    SetHeaderTruncated,
    /// Set length < 4.
    SetLengthTooSmall,
    /// Set length runs past the message.
    SetPastMessage,
    /// Set ID 0, 1 or 4..=255.
    ReservedSetId,
    /// Template record runs past its set.
    TemplateTruncated,
    /// Template ID < 256.
    TemplateBadId,
    /// A field of length 0, > 8 or variable.
    TemplateFieldLength,
    /// No observation time field.
    TemplateNoTimestamp,
    /// Only a timestamp, no counters.
    TemplateNoCounters,
    /// Record longer than 65535 bytes.
    TemplateRecordTooLong,
    /// Data set for a template we do not know (yet).
    UnknownTemplate,
    /// Data set shorter than one record of its template.
    RecordWiderThanSet,
    /// Netlink framing (counted by the dispatcher, before decode): `nlmsg_len` below 20
    /// (nlmsghdr + genlmsghdr); ends the datagram.
    NetlinkLengthTooSmall,
    /// Netlink framing: `nlmsg_len` runs past the datagram; ends it.
    NetlinkLengthPastDatagram,
    /// Netlink framing: 1–15 bytes after the last message, too few for a header.
    NetlinkTrailingBytes,
    /// Input framing (files and captures): a record or packet that could not be read
    /// (truncated capture record, bad length prefix, a packet that is not UDP/IPFIX or netlink).
    InputRecordUnreadable,
}

impl Malformed {
    pub const ALL: [Malformed; 20] = [
        Malformed::MessageHeaderTruncated,
        Malformed::BadVersion,
        Malformed::MessageLengthTooSmall,
        Malformed::MessagePastBuffer,
        Malformed::SetHeaderTruncated,
        Malformed::SetLengthTooSmall,
        Malformed::SetPastMessage,
        Malformed::ReservedSetId,
        Malformed::TemplateTruncated,
        Malformed::TemplateBadId,
        Malformed::TemplateFieldLength,
        Malformed::TemplateNoTimestamp,
        Malformed::TemplateNoCounters,
        Malformed::TemplateRecordTooLong,
        Malformed::UnknownTemplate,
        Malformed::RecordWiderThanSet,
        Malformed::NetlinkLengthTooSmall,
        Malformed::NetlinkLengthPastDatagram,
        Malformed::NetlinkTrailingBytes,
        Malformed::InputRecordUnreadable,
    ];

    /// Stable snake_case name, used as the `reason` label.
    pub fn name(self) -> &'static str {
        match self {
            Malformed::MessageHeaderTruncated => "message_header_truncated",
            Malformed::BadVersion => "bad_version",
            Malformed::MessageLengthTooSmall => "message_length_too_small",
            Malformed::MessagePastBuffer => "message_past_buffer",
            Malformed::SetHeaderTruncated => "set_header_truncated",
            Malformed::SetLengthTooSmall => "set_length_too_small",
            Malformed::SetPastMessage => "set_past_message",
            Malformed::ReservedSetId => "reserved_set_id",
            Malformed::TemplateTruncated => "template_truncated",
            Malformed::TemplateBadId => "template_bad_id",
            Malformed::TemplateFieldLength => "template_field_length",
            Malformed::TemplateNoTimestamp => "template_no_timestamp",
            Malformed::TemplateNoCounters => "template_no_counters",
            Malformed::TemplateRecordTooLong => "template_record_too_long",
            Malformed::UnknownTemplate => "unknown_template",
            Malformed::RecordWiderThanSet => "record_wider_than_set",
            Malformed::NetlinkLengthTooSmall => "netlink_length_too_small",
            Malformed::NetlinkLengthPastDatagram => "netlink_length_past_datagram",
            Malformed::NetlinkTrailingBytes => "netlink_trailing_bytes",
            Malformed::InputRecordUnreadable => "input_record_unreadable",
        }
    }

    pub(crate) fn from_template_error(e: &crate::ipfix::TemplateError) -> Self {
        use crate::ipfix::TemplateError as E;
        match e {
            E::Truncated => Malformed::TemplateTruncated,
            E::BadTemplateId(_) => Malformed::TemplateBadId,
            E::UnsupportedFieldLength { .. } => Malformed::TemplateFieldLength,
            E::NoTimestamp(_) => Malformed::TemplateNoTimestamp,
            E::NoCounters(_) => Malformed::TemplateNoCounters,
            E::RecordTooLong(..) => Malformed::TemplateRecordTooLong,
        }
    }
}

/// Sequence figures of one observation domain (one exporter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DomainSeqStats {
    /// The observation domain ID.
    pub domain: u32,
    /// IPFIX messages decoded.
    pub messages: u64,
    /// Messages dropped by the user-space template filter (not lost).
    pub filtered_messages: u64,
    /// Messages missing per the sequence numbers (per-message numbering).
    pub lost_messages: u64,
    /// Records missing per the sequence numbers (RFC 7011 numbering).
    pub lost_records: u64,
    /// Jumps ahead: one per outage, so lost ÷ events is the mean outage length.
    pub gap_events: u64,
    /// Largest single jump (messages or records).
    pub largest_gap: u64,
    /// Messages whose number was a little behind the expected one (late or duplicated).
    pub out_of_order: u64,
    /// Jumps beyond the sequence window (either way): a new sequence stream began (an
    /// exporter restart, or another exporter in the domain), not counted as loss.
    pub resets: u64,
    /// Most sequence streams seen interleaved (2 or more: several exporters share the domain).
    pub max_streams: u64,
}

impl DomainSeqStats {
    fn add(&mut self, o: &DomainSeqStats) {
        self.messages += o.messages;
        self.filtered_messages += o.filtered_messages;
        self.lost_messages += o.lost_messages;
        self.lost_records += o.lost_records;
        self.gap_events += o.gap_events;
        self.largest_gap = self.largest_gap.max(o.largest_gap);
        self.out_of_order += o.out_of_order;
        self.resets += o.resets;
        self.max_streams = self.max_streams.max(o.max_streams);
    }
}

/// Counters of one decoder.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DecodeStats {
    /// IPFIX messages whose header was valid.
    pub messages: u64,
    pub bytes: u64,
    /// Data records (snapshots or snapshot parts) decoded.
    pub records: u64,
    /// Counter values decoded.
    pub counters: u64,
    pub batches: u64,
    pub template_sets: u64,
    pub options_template_sets: u64,
    pub templates_registered: u64,
    pub templates_refreshed: u64,
    pub templates_replaced: u64,
    pub templates_withdrawn: u64,
    pub options_templates: u64,
    /// Records of options templates, recognised and skipped.
    pub options_records: u64,
    pub sessions_registered: u64,
    /// Bytes of data sets whose template was unknown.
    pub unknown_template_bytes: u64,
    /// Bytes skipped because they could not be trusted (see `malformed`).
    pub discarded_bytes: u64,
    /// Trailing bytes of data sets shorter than a record (RFC 7011 padding).
    pub padding_bytes: u64,
    /// Values that are null because part of a split snapshot never arrived.
    pub missing_samples: u64,
    /// Messages missing per the sequence numbers ([`crate::ipfix::SeqMode::PerMessage`]).
    pub seq_lost_messages: u64,
    /// Records missing per the sequence numbers ([`crate::ipfix::SeqMode::Rfc7011`]).
    pub seq_lost_records: u64,
    /// Messages whose sequence number was a little behind the expected one (late, duplicated).
    pub seq_out_of_order: u64,
    /// Sequence jumps beyond the window (`seq_window`), either way: a new sequence stream (an
    /// exporter restart, or another exporter in the domain), never counted as loss.
    pub seq_resets: u64,
    /// Domains found carrying two or more interleaved sequence streams (two exporters in one
    /// observation domain); each stream is accounted on its own.
    pub seq_concurrent_domains: u64,
    /// Times a sequence number jumped ahead (one outage, however long, is one event).
    pub seq_gap_events: u64,
    /// Messages the user-space template filter dropped before decode (files, `--no-ebpf`):
    /// they advance the sequence like decoded ones, so they never count as lost.
    pub filtered_messages: u64,
    /// Inline templates that replaced a registered session's template with a different one:
    /// the session's object names are kept only where the label still means the same object
    /// type; other columns are named by label (`unknown_<label>`). Logged at warn.
    pub templates_overriding_session: u64,
    /// Sequence figures per observation domain (what each exporter sent, lost, reordered),
    /// at most [`super::MAX_TRACKED_DOMAINS`] per decoder.
    pub domains: Vec<DomainSeqStats>,
    /// Domains whose sequence state was dropped to make room for a new one (the one idle
    /// longest goes when a decoder tracks [`super::MAX_TRACKED_DOMAINS`]).
    pub seq_evicted_domains: u64,
    /// In-band templates dropped to stay within `max_templates` / `max_templates_per_domain`
    /// (the one whose data came longest ago goes; logged). Its data is unknown until the
    /// exporter sends the template again.
    pub templates_evicted: u64,
    /// Batch buffers freed to stay within `max_batch_memory_bytes` (the session whose data came
    /// longest ago gives its buffer back; its next data allocates a new one).
    pub batch_buffers_evicted: u64,
    /// Per [`Malformed`] reason, indexed by its discriminant.
    #[serde(serialize_with = "ser_malformed")]
    pub malformed: [u64; Malformed::ALL.len()],
}

fn ser_malformed<S: serde::Serializer>(
    m: &[u64; Malformed::ALL.len()],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(None)?;
    for r in Malformed::ALL {
        if m[r as usize] != 0 {
            map.serialize_entry(r.name(), &m[r as usize])?;
        }
    }
    map.end()
}

impl Clone for DecodeStats {
    fn clone(&self) -> Self {
        let mut c = Self::default();
        c.clone_from(self);
        c
    }

    /// Reuses `domains`' allocation (decoders publish a copy every few ms).
    fn clone_from(&mut self, o: &Self) {
        let domains = std::mem::take(&mut self.domains);
        *self = Self {
            domains,
            malformed: o.malformed,
            ..Self::plain(o)
        };
        self.domains.clone_from(&o.domains);
    }
}

/// Calls `$m!` with every plain counter field of [`DecodeStats`] (all but `domains` and
/// `malformed`): the one list that copying, summing and publishing walk.
macro_rules! with_plain_counters {
    ($m:ident) => {
        $m!(
            messages,
            bytes,
            records,
            counters,
            batches,
            template_sets,
            options_template_sets,
            templates_registered,
            templates_refreshed,
            templates_replaced,
            templates_withdrawn,
            options_templates,
            options_records,
            sessions_registered,
            unknown_template_bytes,
            discarded_bytes,
            padding_bytes,
            missing_samples,
            seq_lost_messages,
            seq_lost_records,
            seq_out_of_order,
            seq_resets,
            seq_concurrent_domains,
            seq_gap_events,
            filtered_messages,
            templates_overriding_session,
            seq_evicted_domains,
            templates_evicted,
            batch_buffers_evicted
        )
    };
}

impl DecodeStats {
    /// Number of plain counters ([`Self::plain_counters`]).
    pub(crate) const PLAIN_COUNTERS: usize = {
        macro_rules! count { ($($f:ident),*) => { [$(stringify!($f)),*].len() } }
        with_plain_counters!(count)
    };

    /// Every plain counter (no `domains`, no `malformed`), in a fixed order: what a decoder
    /// publishes to its counter block ([`Self::set_plain_counters`] reads it back).
    pub(crate) fn plain_counters(&self) -> [u64; Self::PLAIN_COUNTERS] {
        macro_rules! arr { ($($f:ident),*) => { [$(self.$f),*] } }
        with_plain_counters!(arr)
    }

    /// Sets every plain counter from [`Self::plain_counters`]' order.
    pub(crate) fn set_plain_counters(&mut self, v: &[u64; Self::PLAIN_COUNTERS]) {
        macro_rules! set { ($($f:ident),*) => {{ let mut it = v.iter(); $( self.$f = *it.next().expect("one value per field"); )* }} }
        with_plain_counters!(set);
    }

    /// Every plain counter of `o` (no `domains`).
    fn plain(o: &Self) -> Self {
        macro_rules! copy { ($($f:ident),*) => { Self { $( $f: o.$f, )* domains: Vec::new(), malformed: o.malformed } } }
        with_plain_counters!(copy)
    }

    #[inline]
    pub(crate) fn count(&mut self, r: Malformed) {
        self.malformed[r as usize] += 1;
    }

    /// The count for one reason.
    pub fn malformed(&self, r: Malformed) -> u64 {
        self.malformed[r as usize]
    }

    /// All malformed-input events.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.iter().sum()
    }

    /// Adds another decoder's counters (for a daemon-wide total).
    pub fn add(&mut self, o: &DecodeStats) {
        macro_rules! add { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        with_plain_counters!(add);
        for d in &o.domains {
            match self.domains.iter_mut().find(|x| x.domain == d.domain) {
                Some(x) => x.add(d),
                None => self.domains.push(*d),
            }
        }
        for (a, b) in self.malformed.iter_mut().zip(o.malformed.iter()) {
            *a += b;
        }
    }
}
