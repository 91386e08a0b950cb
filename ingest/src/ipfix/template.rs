//! Template records and their compilation into decode plans.

use stel_store::sai::StatKey;

use super::{
    be16, be32, split_enterprise_number, ENTERPRISE_BIT, IE_OBSERVATION_TIME_NANOSECONDS,
    IE_OBSERVATION_TIME_SECONDS, MESSAGE_HEADER_LEN, SET_HEADER_LEN, TEMPLATE_SET_ID,
    VARIABLE_LENGTH, VERSION,
};

/// Decodes `src.len() / 8` big-endian u64s into `dst` (which must be at least that long).
/// The decoder picks one at runtime (`decode::select_bswap`); a plan only calls it.
pub type BswapFn = fn(&mut [u64], &[u8]);

/// One field specifier of a template record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    /// Information element ID without the enterprise bit.
    pub element_id: u16,
    pub length: u16,
    /// Enterprise number, when the enterprise bit was set.
    pub enterprise: Option<u32>,
}

/// Why a template record could not be parsed or compiled. Every variant is counted by the
/// decoder; none is fatal to the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("template record truncated")]
    Truncated,
    #[error("template id {0} is below 256")]
    BadTemplateId(u16),
    #[error("template {template_id} field {index} has unsupported length {length} (1-8 bytes)")]
    UnsupportedFieldLength {
        template_id: u16,
        index: u16,
        length: u16,
    },
    #[error("template {0} has no observation time field (IE 325, or IE 322 + IE 325)")]
    NoTimestamp(u16),
    #[error("template {0} has no counter fields")]
    NoCounters(u16),
    #[error("template {0} record length {1} exceeds 65535")]
    RecordTooLong(u16, usize),
}

/// A parsed template record (from a template or options template set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    pub template_id: u16,
    /// Scope field count (options templates only; 0 for templates).
    pub scope_fields: u16,
    pub fields: Vec<FieldSpec>,
}

impl TemplateRecord {
    /// Parses one record at the start of `b` (a template set body from the current offset).
    /// Returns the record and its encoded length. A field count of 0 is a withdrawal and is
    /// returned as a record with no fields.
    ///
    /// # Errors
    /// [`TemplateError::Truncated`] when the record runs past `b`.
    pub fn parse(b: &[u8], options: bool) -> Result<(Self, usize), TemplateError> {
        if b.len() < 4 {
            return Err(TemplateError::Truncated);
        }
        let template_id = be16(b, 0);
        let count = be16(b, 2);
        if count == 0 {
            // A withdrawal (RFC 7011 §8.1): 4 bytes, also for options templates.
            return Ok((
                Self {
                    template_id,
                    scope_fields: 0,
                    fields: Vec::new(),
                },
                4,
            ));
        }
        let (scope_fields, mut off) = if options {
            if b.len() < 6 {
                return Err(TemplateError::Truncated);
            }
            (be16(b, 4), 6)
        } else {
            (0, 4)
        };
        let mut fields = Vec::with_capacity(count as usize);
        for _ in 0..count {
            if b.len() < off + 4 {
                return Err(TemplateError::Truncated);
            }
            let raw = be16(b, off);
            let length = be16(b, off + 2);
            off += 4;
            let enterprise = if raw & ENTERPRISE_BIT != 0 {
                if b.len() < off + 4 {
                    return Err(TemplateError::Truncated);
                }
                let en = be32(b, off);
                off += 4;
                Some(en)
            } else {
                None
            };
            fields.push(FieldSpec {
                element_id: raw & !ENTERPRISE_BIT,
                length,
                enterprise,
            });
        }
        Ok((
            Self {
                template_id,
                scope_fields,
                fields,
            },
            off,
        ))
    }

    /// Encoded length of one data record, `None` when a field is variable-length.
    pub fn record_len(&self) -> Option<usize> {
        self.fields
            .iter()
            .map(|f| (f.length != VARIABLE_LENGTH).then_some(f.length as usize))
            .sum()
    }

    /// Compiles an HFT template into a decode plan.
    ///
    /// # Errors
    /// See [`TemplateError`].
    pub fn compile(&self) -> Result<DecodePlan, TemplateError> {
        let tid = self.template_id;
        if tid < super::MIN_DATA_SET_ID {
            return Err(TemplateError::BadTemplateId(tid));
        }
        let mut off = 0usize;
        let mut ns8 = None;
        let mut secs = None;
        let mut frac = None;
        let mut counters: Vec<CounterOp> = Vec::new();
        let mut keys = Vec::new();
        let mut skipped = 0u16;
        for (index, f) in self.fields.iter().enumerate() {
            let len = f.length;
            if len == VARIABLE_LENGTH || len == 0 {
                return Err(TemplateError::UnsupportedFieldLength {
                    template_id: tid,
                    index: index as u16,
                    length: len,
                });
            }
            match (f.enterprise, f.element_id, len) {
                (Some(en), label, 1..=8) => {
                    let (object_type, stat_id) = split_enterprise_number(en);
                    counters.push(CounterOp {
                        offset: off as u32,
                        width: len as u8,
                    });
                    keys.push((
                        label,
                        StatKey {
                            object_type,
                            stat_id,
                        },
                    ));
                }
                (Some(_), _, _) => {
                    return Err(TemplateError::UnsupportedFieldLength {
                        template_id: tid,
                        index: index as u16,
                        length: len,
                    })
                }
                (None, IE_OBSERVATION_TIME_NANOSECONDS, 8) if ns8.is_none() => ns8 = Some(off),
                (None, IE_OBSERVATION_TIME_NANOSECONDS, 4) if frac.is_none() => frac = Some(off),
                (None, IE_OBSERVATION_TIME_SECONDS, 4) if secs.is_none() => secs = Some(off),
                _ => skipped += 1,
            }
            off += len as usize;
        }
        if off > u16::MAX as usize {
            return Err(TemplateError::RecordTooLong(tid, off));
        }
        let ts = match (ns8, secs, frac) {
            (Some(o), _, _) => TimestampPlan::Nanos { offset: o as u32 },
            (None, Some(s), f) => TimestampPlan::SecondsFraction {
                seconds: s as u32,
                nanos: f.map(|f| f as u32),
            },
            _ => return Err(TemplateError::NoTimestamp(tid)),
        };
        if counters.is_empty() {
            return Err(TemplateError::NoCounters(tid));
        }
        let first = counters[0].offset;
        let contiguous = counters
            .iter()
            .enumerate()
            .all(|(i, c)| c.width == 8 && c.offset == first + 8 * i as u32);
        let kind = if contiguous {
            PlanKind::Contiguous {
                offset: first as usize,
            }
        } else {
            PlanKind::General(counters.into_boxed_slice())
        };
        Ok(DecodePlan {
            template_id: tid,
            record_len: off,
            ts,
            width: keys.len(),
            kind,
            keys,
            skipped_fields: skipped,
        })
    }
}

/// Where a record's observation time is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampPlan {
    /// IE 325, 8 bytes: ns since the Unix epoch (as HFT sends it).
    Nanos { offset: u32 },
    /// IE 322 seconds (+ optional 4-byte IE 325 with the ns within the second).
    SecondsFraction { seconds: u32, nanos: Option<u32> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CounterOp {
    offset: u32,
    width: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PlanKind {
    /// All counters are 8 bytes wide and adjacent: one contiguous big-endian → native copy.
    Contiguous { offset: usize },
    /// Any other shape: one op per counter.
    General(Box<[CounterOp]>),
}

/// A compiled template: how to turn one data record into a timestamp and `width` u64 values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodePlan {
    pub template_id: u16,
    /// Bytes per data record (validated ≤ 65535).
    pub record_len: usize,
    pub ts: TimestampPlan,
    /// Number of counters per record.
    pub width: usize,
    kind: PlanKind,
    /// (object label, stat) per counter, in template order.
    pub keys: Vec<(u16, StatKey)>,
    /// Non-counter, non-timestamp fields the plan skips.
    pub skipped_fields: u16,
}

impl DecodePlan {
    /// Whether the record decodes with the contiguous fast path.
    pub fn is_contiguous(&self) -> bool {
        matches!(self.kind, PlanKind::Contiguous { .. })
    }

    /// The observation time of `rec` (exactly `record_len` bytes), ns since the Unix epoch.
    #[inline]
    pub fn timestamp(&self, rec: &[u8]) -> i64 {
        match self.ts {
            TimestampPlan::Nanos { offset } => {
                let o = offset as usize;
                u64::from_be_bytes(rec[o..o + 8].try_into().unwrap_or([0; 8])) as i64
            }
            TimestampPlan::SecondsFraction { seconds, nanos } => {
                let s = be32(rec, seconds as usize) as i64;
                let n = nanos.map_or(0, |o| be32(rec, o as usize) as i64);
                s * 1_000_000_000 + n
            }
        }
    }

    /// Decodes the counters of `rec` (exactly `record_len` bytes) into `dst` (`width` values),
    /// big-endian, zero-extended to u64.
    #[inline]
    pub fn decode_counters(&self, rec: &[u8], dst: &mut [u64], bswap: BswapFn) {
        match &self.kind {
            PlanKind::Contiguous { offset } => {
                bswap(dst, &rec[*offset..*offset + 8 * self.width]);
            }
            PlanKind::General(ops) => {
                for (d, op) in dst.iter_mut().zip(ops.iter()) {
                    let o = op.offset as usize;
                    let w = op.width as usize;
                    let mut v = 0u64;
                    for b in &rec[o..o + w] {
                        v = v << 8 | *b as u64;
                    }
                    *d = v;
                }
            }
        }
    }
}

/// Why a `session_config` (IPFIX messages carrying template sets) is not usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("not an IPFIX message (version 10 header expected)")]
    NotIpfix,
    #[error("IPFIX message length runs past the bytes")]
    MessageLength,
    #[error("messages of different observation domains ({0} and {1})")]
    MixedDomains(u32, u32),
    #[error("set length runs past the message")]
    SetLength,
    #[error("trailing bytes after the last set")]
    Trailing,
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// The template records of a `session_config`: one or more whole IPFIX messages of one
/// observation domain. The one walk used by both the session registry (STATE_DB) and the
/// decoder's session registration, so they accept exactly the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateMessages {
    /// The observation domain of the messages (0 when there are none).
    pub domain: u32,
    /// Template records with fields, in order (withdrawals — no fields — are skipped).
    pub records: Vec<TemplateRecord>,
}

impl TemplateMessages {
    /// Walks `b`: every message, set and record length checked, data and options sets skipped.
    ///
    /// # Errors
    /// See [`ConfigError`].
    pub fn parse(mut b: &[u8]) -> Result<Self, ConfigError> {
        let mut domain = None;
        let mut records = Vec::new();
        while !b.is_empty() {
            if b.len() < MESSAGE_HEADER_LEN || be16(b, 0) != VERSION {
                return Err(ConfigError::NotIpfix);
            }
            let len = be16(b, 2) as usize;
            if len < MESSAGE_HEADER_LEN || len > b.len() {
                return Err(ConfigError::MessageLength);
            }
            let d = be32(b, 12);
            let first = *domain.get_or_insert(d);
            if first != d {
                return Err(ConfigError::MixedDomains(first, d));
            }
            let mut sets = &b[MESSAGE_HEADER_LEN..len];
            while sets.len() >= SET_HEADER_LEN {
                let id = be16(sets, 0);
                let sl = be16(sets, 2) as usize;
                if sl < SET_HEADER_LEN || sl > sets.len() {
                    return Err(ConfigError::SetLength);
                }
                if id == TEMPLATE_SET_ID {
                    let mut body = &sets[SET_HEADER_LEN..sl];
                    while body.len() >= 4 {
                        let (rec, used) = TemplateRecord::parse(body, false)?;
                        body = &body[used..];
                        if !rec.fields.is_empty() {
                            records.push(rec);
                        }
                    }
                }
                sets = &sets[sl..];
            }
            if !sets.is_empty() {
                return Err(ConfigError::Trailing);
            }
            b = &b[len..];
        }
        Ok(Self {
            domain: domain.unwrap_or(0),
            records,
        })
    }
}
