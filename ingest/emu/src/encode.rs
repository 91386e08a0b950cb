//! The IPFIX encoder the emulator, tests and benches use: HFT template messages and data messages
//! of several snapshots each.

use stel_ebpf_common as wire;
use stel_store::hft::{
    enterprise_number, SeqMode, ENTERPRISE_BIT, IE_OBSERVATION_TIME_NANOSECONDS,
};

const VERSION: u16 = wire::IPFIX_VERSION;
const MESSAGE_HEADER_LEN: usize = wire::IPFIX_HEADER_LEN as usize;
const SET_HEADER_LEN: usize = wire::SET_HEADER_LEN as usize;
const TEMPLATE_SET_ID: u16 = wire::TEMPLATE_SET_ID;

/// One HFT counter field: object label and (object type, stat ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HftField {
    pub label: u16,
    pub object_type: u32,
    pub stat_id: u32,
}

/// An HFT template: `observationTimeNanoseconds` (8 bytes) then one enterprise field per counter,
/// each `width` bytes (8 in HFT; fewer in tests of the general decode path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HftTemplate {
    pub template_id: u16,
    pub fields: Vec<HftField>,
    pub width: u8,
}

impl HftTemplate {
    /// Bytes of one data record.
    pub fn record_len(&self) -> usize {
        8 + self.fields.len() * self.width as usize
    }

    /// Bytes of the template record.
    pub fn template_record_len(&self) -> usize {
        4 + 4 + self.fields.len() * 8
    }

    /// How many records fit in one message of at most `max_message` bytes (0 if none does).
    pub fn records_per_message(&self, max_message: usize) -> usize {
        max_message.saturating_sub(MESSAGE_HEADER_LEN + SET_HEADER_LEN) / self.record_len()
    }
}

/// Writes IPFIX messages for one observation domain and keeps its sequence number.
#[derive(Debug, Clone)]
pub struct Encoder {
    pub domain: u32,
    pub seq_mode: SeqMode,
    /// Sequence number the next message will carry.
    pub sequence: u32,
}

impl Encoder {
    pub fn new(domain: u32, seq_mode: SeqMode) -> Self {
        Self {
            domain,
            seq_mode,
            sequence: 0,
        }
    }

    fn header(&self, out: &mut Vec<u8>, export_time: u32) -> usize {
        let start = out.len();
        out.extend_from_slice(&VERSION.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes()); // patched by `finish`
        out.extend_from_slice(&export_time.to_be_bytes());
        out.extend_from_slice(&self.sequence.to_be_bytes());
        out.extend_from_slice(&self.domain.to_be_bytes());
        start
    }

    fn finish(out: &mut [u8], start: usize) {
        let len = out.len() - start;
        assert!(len <= u16::MAX as usize, "IPFIX message of {len} bytes");
        out[start + 2..start + 4].copy_from_slice(&(len as u16).to_be_bytes());
    }

    /// Appends one message holding a template set with `templates`. Template messages advance a
    /// per-message sequence number, never an RFC 7011 record count.
    ///
    /// # Panics
    /// If a field's (object type, stat) cannot be carried in an HFT enterprise number, or the
    /// message would exceed 65535 bytes.
    pub fn template_message(
        &mut self,
        out: &mut Vec<u8>,
        export_time: u32,
        templates: &[HftTemplate],
    ) {
        let start = self.header(out, export_time);
        let set = out.len();
        out.extend_from_slice(&TEMPLATE_SET_ID.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        for t in templates {
            out.extend_from_slice(&t.template_id.to_be_bytes());
            out.extend_from_slice(&(t.fields.len() as u16 + 1).to_be_bytes());
            out.extend_from_slice(&IE_OBSERVATION_TIME_NANOSECONDS.to_be_bytes());
            out.extend_from_slice(&8u16.to_be_bytes());
            for f in &t.fields {
                let en = enterprise_number(f.object_type, f.stat_id)
                    .unwrap_or_else(|| panic!("unencodable stat {}/{}", f.object_type, f.stat_id));
                out.extend_from_slice(&(ENTERPRISE_BIT | f.label).to_be_bytes());
                out.extend_from_slice(&(t.width as u16).to_be_bytes());
                out.extend_from_slice(&en.to_be_bytes());
            }
        }
        let set_len = (out.len() - set) as u16;
        out[set + 2..set + 4].copy_from_slice(&set_len.to_be_bytes());
        Self::finish(out, start);
        if self.seq_mode == SeqMode::PerMessage {
            self.sequence = self.sequence.wrapping_add(1);
        }
    }

    /// Appends one message with one data set of `template` holding one record per
    /// `(timestamp_ns, counters)`. Counters wider than the template's width are truncated to its
    /// low bytes.
    ///
    /// # Panics
    /// If a record's counter count differs from the template's or the message would exceed 65535
    /// bytes.
    pub fn data_message<'a>(
        &mut self,
        out: &mut Vec<u8>,
        export_time: u32,
        template: &HftTemplate,
        records: impl IntoIterator<Item = (u64, &'a [u64])>,
    ) {
        let start = self.header(out, export_time);
        let set = out.len();
        out.extend_from_slice(&template.template_id.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        let w = template.width as usize;
        let mut n = 0u32;
        for (ts, values) in records {
            assert_eq!(values.len(), template.fields.len(), "record width");
            out.extend_from_slice(&ts.to_be_bytes());
            if w == 8 {
                for v in values {
                    out.extend_from_slice(&v.to_be_bytes());
                }
            } else {
                for v in values {
                    out.extend_from_slice(&v.to_be_bytes()[8 - w..]);
                }
            }
            n += 1;
        }
        let set_len = out.len() - set;
        assert!(set_len <= u16::MAX as usize, "data set of {set_len} bytes");
        out[set + 2..set + 4].copy_from_slice(&(set_len as u16).to_be_bytes());
        Self::finish(out, start);
        self.sequence = match self.seq_mode {
            SeqMode::PerMessage => self.sequence.wrapping_add(1),
            SeqMode::Rfc7011 => self.sequence.wrapping_add(n),
        };
    }
}
