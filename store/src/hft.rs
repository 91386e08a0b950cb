//! The HFT vocabulary both ends of the stream share: how a session is described (the control
//! plane's object names and IDs), how sequence numbers count, and how an IPFIX enterprise number
//! carries a SAI (object type, stat ID) pair. The daemon's decoder (`stel-ingest`) and the switch
//! emulator's encoder (`stel-emu`) both use it; neither depends on the other for it.

/// Enterprise bit of an information element ID.
pub const ENTERPRISE_BIT: u16 = 0x8000;
/// IE 322 `observationTimeSeconds` (4 bytes).
pub const IE_OBSERVATION_TIME_SECONDS: u16 = 322;
/// IE 325 `observationTimeNanoseconds` (HFT: 8 bytes, ns since the Unix epoch; with IE 322:
/// 4 bytes, ns within the second).
pub const IE_OBSERVATION_TIME_NANOSECONDS: u16 = 325;
/// The extension flag of each half of an HFT enterprise number; a set flag adds this to the
/// decoded object type / stat ID.
pub const EXTENSION_OFFSET: u32 = 0x2000_0000;

/// A session as the control plane (STATE_DB) describes it: names for the labels of its templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSpec {
    pub profile: String,
    pub group: String,
    pub domain: u32,
    /// Object names, positionally paired with `object_ids`.
    pub object_names: Vec<String>,
    pub object_ids: Vec<u16>,
}

/// How sequence numbers count (and so how gaps are measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeqMode {
    /// +1 per message, per observation domain, as the HFT HLD describes (the default). A gap
    /// counts lost messages. Spelled `per_message` (`per-message` is accepted too).
    #[default]
    #[serde(alias = "per-message")]
    PerMessage,
    /// RFC 7011: the number of data records sent before this message, per observation domain. A
    /// gap counts lost records.
    Rfc7011,
}

/// Decodes an HFT enterprise number into (SAI object type, stat ID): object type in the high 16
/// bits, stat in the low 16, each half's top bit an extension flag worth `+0x20000000`.
#[inline]
pub fn split_enterprise_number(en: u32) -> (u32, u32) {
    let hi = en >> 16;
    let lo = en & 0xFFFF;
    let ty = (hi & 0x7FFF)
        + if hi & 0x8000 != 0 {
            EXTENSION_OFFSET
        } else {
            0
        };
    let stat = (lo & 0x7FFF)
        + if lo & 0x8000 != 0 {
            EXTENSION_OFFSET
        } else {
            0
        };
    (ty, stat)
}

/// The inverse of [`split_enterprise_number`]; `None` when a value cannot be represented (more
/// than 15 bits that are not the extension offset).
pub fn enterprise_number(object_type: u32, stat_id: u32) -> Option<u32> {
    fn half(v: u32) -> Option<u32> {
        if v < 0x8000 {
            Some(v)
        } else if v >= EXTENSION_OFFSET && v - EXTENSION_OFFSET < 0x8000 {
            Some(0x8000 | (v - EXTENSION_OFFSET))
        } else {
            None
        }
    }
    Some(half(object_type)? << 16 | half(stat_id)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enterprise_number_halves() {
        // The template example of the HLD: PORT / IF_IN_ERRORS.
        assert_eq!(split_enterprise_number(0x0001_0004), (1, 4));
        assert_eq!(enterprise_number(1, 4), Some(0x0001_0004));
        // Extension flags.
        assert_eq!(split_enterprise_number(0x0001_8008), (1, 0x2000_0008));
        assert_eq!(split_enterprise_number(0x8001_0000), (0x2000_0001, 0));
        assert_eq!(enterprise_number(1, 0x2000_0008), Some(0x0001_8008));
        assert_eq!(enterprise_number(1, 0x1000_0000), None);
    }
}
