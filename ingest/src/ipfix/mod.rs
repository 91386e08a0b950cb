//! IPFIX (RFC 7011) as SONiC high frequency telemetry uses it: wire constants, template parsing,
//! template → decode-plan compilation. (The encoder of the same format is the emulator's,
//! `stel_emu::encode`.)
//!
//! Nothing here does I/O or keeps state across messages; [`crate::decode`] owns the template cache
//! and the batches. Every length is validated before use and every failure is a typed value
//! ([`TemplateError`]), never a panic.

pub(crate) mod template;

pub use template::{
    BswapFn, ConfigError, DecodePlan, FieldSpec, TemplateError, TemplateMessages, TemplateRecord,
    TimestampPlan,
};

// The HFT vocabulary the emulator's encoder shares (enterprise numbers, sequence modes, the
// observation-time IEs) is `stel_store::hft`'s.
pub use stel_store::hft::{
    enterprise_number, split_enterprise_number, SeqMode, ENTERPRISE_BIT, EXTENSION_OFFSET,
    IE_OBSERVATION_TIME_NANOSECONDS, IE_OBSERVATION_TIME_SECONDS,
};

// The framing constants are `stel_ebpf_common`'s: the kernel filter parses the same headers.
use stel_ebpf_common as wire;

/// IPFIX version number in every message header.
pub const VERSION: u16 = wire::IPFIX_VERSION;
/// Message header: version, length, export time, sequence number, observation domain.
pub const MESSAGE_HEADER_LEN: usize = wire::IPFIX_HEADER_LEN as usize;
/// Set header: set ID, set length.
pub const SET_HEADER_LEN: usize = wire::SET_HEADER_LEN as usize;
/// Set ID of a template set.
pub const TEMPLATE_SET_ID: u16 = wire::TEMPLATE_SET_ID;
/// Set ID of an options template set.
pub const OPTIONS_TEMPLATE_SET_ID: u16 = wire::OPTIONS_TEMPLATE_SET_ID;
/// Smallest template ID (and data set ID).
pub const MIN_DATA_SET_ID: u16 = wire::MIN_DATA_SET_ID;
/// Variable-length marker in a field specifier.
pub const VARIABLE_LENGTH: u16 = 0xFFFF;
/// A parsed message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageHeader {
    pub length: u16,
    pub export_time: u32,
    pub sequence: u32,
    pub domain: u32,
}

#[inline]
pub(crate) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

#[inline]
pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
