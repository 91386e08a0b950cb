//! stel-ebpf-common: the names, sizes and `#[repr(C)]` layouts the stel socket filter (kernel
//! side, `ebpf/prog`, built with the kernel-path issue) and user space share, so both sides
//! agree by construction. No code runs here.
#![no_std]

/// Name of the BPF hash map of registered template IDs (key: u16 template ID, value: u8 1).
pub const TEMPLATE_MAP: &str = "STEL_TEMPLATES";
/// Most template IDs the map holds.
pub const TEMPLATE_MAP_MAX_ENTRIES: u32 = 4096;
/// Name of the per-CPU stats array.
pub const STATS_MAP: &str = "STEL_FILTER_STATS";
/// Offset of the IPFIX version in the skb a netlink socket filter sees (nlmsghdr 16 + genl 4).
pub const IPFIX_VERSION_OFFSET: u32 = 20;
/// Offset of the first set ID (IPFIX header is 16 bytes).
pub const FIRST_SET_ID_OFFSET: u32 = 36;

/// Per-CPU filter counters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterStats {
    pub seen: u64,
    pub kept: u64,
    pub dropped: u64,
    pub too_short: u64,
}

const _: () = assert!(core::mem::size_of::<FilterStats>() == 32);
