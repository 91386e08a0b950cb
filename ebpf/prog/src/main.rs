//! The stel socket filter (kernel side). Attached with `SO_ATTACH_BPF` to the daemon's netlink
//! socket, it runs for every datagram in the sender's context, before the datagram is charged to
//! the receive buffer: a dropped datagram costs the receiver nothing.
//!
//! The decision is [`stel_ebpf_common::classify`] (shared with the user-space fallback, see that
//! crate's docs for the rules and the several-templates case); this file only supplies the skb as
//! the byte source, the template hash map as the lookup, and counts the verdict per CPU. Under
//! the learn policy (`STEL_FILTER_CONFIG`), a kept template set's IDs go into the template map
//! here, in the sender's context ([`stel_ebpf_common::learn_templates`]), before the sender's
//! next datagram reaches this filter.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::__sk_buff,
    cty::c_void,
    helpers::bpf_loop,
    macros::{map, socket_filter},
    maps::{Array, HashMap, PerCpuArray},
    programs::SkBuffContext,
    EbpfContext,
};
use stel_ebpf_common::{
    classify, FilterStats, Framing, LearnStep, LearnWalk, Packet, Verdict, BPF_NOEXIST,
    CONFIG_MAP_ENTRIES, CONFIG_POLICY, FIRST_SET_ID_OFFSET, MAX_LEARN_STEPS, POLICY_LEARN,
    STATS_INDEX, STATS_MAP_ENTRIES, TEMPLATE_LEARNED, TEMPLATE_MAP_MAX_ENTRIES,
};

/// Registered template IDs (`stel_ebpf_common::TEMPLATE_MAP`), written by user space.
#[map(name = "STEL_TEMPLATES")]
static STEL_TEMPLATES: HashMap<u16, u8> = HashMap::with_max_entries(TEMPLATE_MAP_MAX_ENTRIES, 0);

/// Policy and settings (`stel_ebpf_common::CONFIG_MAP`), written by user space.
#[map(name = "STEL_FILTER_CONFIG")]
static STEL_FILTER_CONFIG: Array<u32> = Array::with_max_entries(CONFIG_MAP_ENTRIES, 0);

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
    let skb = Skb(ctx);
    let v = classify(&skb, Framing::Netlink, |tid| {
        // SAFETY: the value is only tested for presence, never read after the lookup.
        unsafe { STEL_TEMPLATES.get(&tid) }.is_some()
    });
    let learn = STEL_FILTER_CONFIG.get(CONFIG_POLICY).copied() == Some(POLICY_LEARN);
    let (mut learned, mut failed) = (0u64, 0u64);
    let dropped_set = if v == Verdict::Drop {
        skb.load2(FIRST_SET_ID_OFFSET).map_or(0, u16::from_be_bytes)
    } else {
        0
    };
    if learn && v == Verdict::Template {
        let mut l = Learn {
            skb: ctx.as_ptr().cast(),
            walk: LearnWalk::new(ctx.len(), Framing::Netlink),
            learned: 0,
            failed: 0,
        };
        // SAFETY: `learn_step` has the callback signature bpf_loop expects and only touches
        // `l` (on this stack frame, alive until bpf_loop returns) and the packet through the
        // skb pointer it holds, which is the program's own context.
        unsafe {
            bpf_loop(
                MAX_LEARN_STEPS,
                learn_step as *mut c_void,
                (&mut l as *mut Learn).cast(),
                0,
            )
        };
        learned = l.learned;
        failed = l.failed;
    }
    if let Some(s) = STEL_FILTER_STATS.get_ptr_mut(STATS_INDEX) {
        // SAFETY: a per-CPU array slot: only this CPU writes it, and socket filters are not
        // preempted by another program on the same CPU touching this map.
        unsafe {
            (*s).count(v);
            (*s).learned += learned;
            (*s).learn_failed += failed;
            if dropped_set != 0 {
                (*s).last_dropped_set_id = u64::from(dropped_set);
            }
        }
    }
    !matches!(v, Verdict::Drop)
}

/// The learn walk's state across `bpf_loop` callbacks (on the program's stack).
#[repr(C)]
struct Learn {
    skb: *mut __sk_buff,
    walk: LearnWalk,
    learned: u64,
    failed: u64,
}

/// One [`LearnWalk`] step per call: 0 goes on, 1 stops the loop. Kept out of line: bpf_loop
/// needs a callback subprogram, verified once.
#[inline(never)]
extern "C" fn learn_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Learn` on the caller's stack that `try_filter` passed to bpf_loop.
    let l = unsafe { &mut *ctx.cast::<Learn>() };
    let skb = SkBuffContext::new(l.skb);
    match l.walk.step(&Skb(&skb)) {
        LearnStep::Continue => 0,
        LearnStep::Learn(tid) => {
            // -EEXIST: already there (registered, or learned before).
            match STEL_TEMPLATES.insert(&tid, &TEMPLATE_LEARNED, BPF_NOEXIST) {
                Ok(()) => l.learned += 1,
                Err(-17) => {}
                Err(_) => l.failed += 1,
            }
            0
        }
        LearnStep::Done => 1,
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable by construction: the verifier rejects a program where this loop is reachable.
    #[allow(clippy::empty_loop)]
    loop {}
}
