//! The stel socket filter (kernel side). Attached with `SO_ATTACH_BPF` to the daemon's netlink
//! socket, it runs for every datagram in the sender's context, before the datagram is charged to
//! the receive buffer: a dropped datagram costs the receiver nothing.
//!
//! The decision is [`stel_ebpf_common::classify`] (shared with the user-space fallback, see that
//! crate's docs for the rules and the several-templates case); this file only supplies the skb as
//! the byte source, the template hash map as the lookup, and counts the verdict per CPU.
#![no_std]
#![no_main]

use aya_ebpf::{
    macros::{map, socket_filter},
    maps::{HashMap, PerCpuArray},
    programs::SkBuffContext,
};
use stel_ebpf_common::{
    classify, FilterStats, Framing, Packet, Verdict, STATS_INDEX, STATS_MAP_ENTRIES,
    TEMPLATE_MAP_MAX_ENTRIES,
};

/// Registered template IDs (`stel_ebpf_common::TEMPLATE_MAP`), written by user space.
#[map(name = "STEL_TEMPLATES")]
static STEL_TEMPLATES: HashMap<u16, u8> = HashMap::with_max_entries(TEMPLATE_MAP_MAX_ENTRIES, 0);

/// Per-CPU counters (`stel_ebpf_common::STATS_MAP`), read and summed by user space.
#[map(name = "STEL_FILTER_STATS")]
static STEL_FILTER_STATS: PerCpuArray<FilterStats> =
    PerCpuArray::with_max_entries(STATS_MAP_ENTRIES, 0);

/// The skb as the walk's byte source: `bpf_skb_load_bytes` (bounds-checked by the helper).
struct Skb<'a>(&'a SkBuffContext);

impl Packet for Skb<'_> {
    #[inline(always)]
    fn packet_len(&self) -> u32 {
        self.0.len()
    }

    #[inline(always)]
    fn load2(&self, off: u32) -> Option<[u8; 2]> {
        self.0.load::<[u8; 2]>(off as usize).ok()
    }

    #[inline(always)]
    fn load4(&self, off: u32) -> Option<[u8; 4]> {
        self.0.load::<[u8; 4]>(off as usize).ok()
    }
}

/// Socket filter entry point.
///
/// Return value (see `bpf_prog_run_save_cb` in `sk_filter_trim_cap`, net/core/filter.c): the
/// number of bytes of the packet to keep — `0` drops it, `skb->len` keeps it whole. Never
/// trims: a datagram is kept or dropped as a whole.
#[socket_filter]
pub fn stel_template_filter(ctx: SkBuffContext) -> i64 {
    let keep_len = ctx.len() as i64;
    if try_filter(&ctx) {
        keep_len
    } else {
        0
    }
}

#[inline(always)]
fn try_filter(ctx: &SkBuffContext) -> bool {
    let v = classify(&Skb(ctx), Framing::Netlink, |tid| {
        // SAFETY: the value is only tested for presence, never read after the lookup.
        unsafe { STEL_TEMPLATES.get(&tid) }.is_some()
    });
    if let Some(s) = STEL_FILTER_STATS.get_ptr_mut(STATS_INDEX) {
        // SAFETY: a per-CPU array slot: only this CPU writes it, and socket filters are not
        // preempted by another program on the same CPU touching this map.
        unsafe { (*s).count(v) };
    }
    !matches!(v, Verdict::Drop)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable by construction: the verifier rejects a program where this loop is reachable.
    #[allow(clippy::empty_loop)]
    loop {}
}
