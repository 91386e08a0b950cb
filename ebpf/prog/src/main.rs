//! The stel socket filter (kernel side). Attached with `SO_ATTACH_BPF` to the daemon's netlink
//! socket, it runs for every datagram in the sender's context, before the datagram is charged to
//! the receive buffer: a dropped datagram costs the receiver nothing.
//!
//! The decision is [`stel_ebpf_common::classify`] (shared with the user-space fallback, see that
//! crate's docs for the rules and the several-templates case); this file only supplies the skb as
//! the byte source, the template hash map as the lookup, and counts the verdict per CPU (atomic
//! adds: a preempted or interrupted run on the same CPU never loses a count). Under
//! the learn policy (`STEL_FILTER_CONFIG`), a kept template set's IDs go into the template map
//! here, in the sender's context ([`stel_ebpf_common::learn_templates`]), before the sender's
//! next datagram reaches this filter.
//!
//! A second program, `stel_int_filter`, is attached to the `[int]` UDP sockets when
//! `[int.filter]` is on: it keeps the reports of accepted Telemetry Report versions (and,
//! optionally, accepted senders) and drops the rest in the kernel, counted per CPU; the rule is
//! [`stel_ebpf_common::int_verdict`], shared with the user-space fallback.
#![no_std]
#![no_main]
// `atomic_xadd` (see `atomic_add`): the build already runs with RUSTC_BOOTSTRAP=1 for build-std.
#![allow(internal_features)]
#![feature(core_intrinsics)]

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::{__sk_buff, bpf_hdr_start_off::BPF_HDR_START_NET},
    cty::c_void,
    helpers::{bpf_loop, bpf_skb_load_bytes_relative},
    macros::{map, socket_filter},
    maps::{Array, HashMap, PerCpuArray},
    programs::SkBuffContext,
    EbpfContext,
};
use stel_ebpf_common::{
    classify, int_source_key_v4, int_verdict, FilterStats, Framing, IntFilterStats, LearnStep,
    LearnWalk, Packet, Verdict, BPF_NOEXIST, CONFIG_MAP_ENTRIES, CONFIG_POLICY,
    FIRST_SET_ID_OFFSET, INT_CONFIG_ENTRIES, INT_CONFIG_FLAGS, INT_CONFIG_VERSIONS,
    INT_FLAG_SOURCES, INT_SOURCES_MAX_ENTRIES, MAX_LEARN_STEPS, POLICY_LEARN, STATS_INDEX,
    STATS_MAP_ENTRIES, TEMPLATE_LEARNED, TEMPLATE_MAP_MAX_ENTRIES, UDP_HEADER_LEN,
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

/// INT filter settings (`stel_ebpf_common::INT_CONFIG_MAP`), written by user space.
#[map(name = "STEL_INT_CONFIG")]
static STEL_INT_CONFIG: Array<u32> = Array::with_max_entries(INT_CONFIG_ENTRIES, 0);

/// Accepted INT senders (`stel_ebpf_common::INT_SOURCES_MAP`), written by user space.
#[map(name = "STEL_INT_SOURCES")]
static STEL_INT_SOURCES: HashMap<[u8; 16], u8> =
    HashMap::with_max_entries(INT_SOURCES_MAX_ENTRIES, 0);

/// Per-CPU INT filter counters (`stel_ebpf_common::INT_STATS_MAP`).
#[map(name = "STEL_INT_STATS")]
static STEL_INT_STATS: PerCpuArray<IntFilterStats> =
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
        let mut d = FilterStats::default();
        d.count(v);
        d.learned = learned;
        d.learn_failed = failed;
        // SAFETY: `s` points at this CPU's slot of the per-CPU array, valid for the program's
        // run. Socket filters run with migration disabled but can be preempted (and interrupted
        // by a softirq running this same program) on their CPU, so a plain `+=` could lose an
        // update between its load and its store: every counter is one atomic add instead.
        unsafe {
            add_stats(s, &d);
            if dropped_set != 0 {
                // A plain store: a racing one leaves either ID, both valid.
                (*s).last_dropped_set_id = u64::from(dropped_set);
            }
        }
    }
    !matches!(v, Verdict::Drop)
}

/// INT socket filter entry point (UDP socket: the skb starts at the UDP header). Keeps the whole
/// datagram (`skb->len`) or drops it (0), as [`stel_template_filter`].
#[socket_filter]
pub fn stel_int_filter(ctx: SkBuffContext) -> i64 {
    let versions = STEL_INT_CONFIG
        .get(INT_CONFIG_VERSIONS)
        .copied()
        .unwrap_or(u32::MAX);
    let flags = STEL_INT_CONFIG.get(INT_CONFIG_FLAGS).copied().unwrap_or(0);
    let first = ctx.load::<u8>(UDP_HEADER_LEN as usize).ok();
    let source = if flags & INT_FLAG_SOURCES != 0 {
        Some(int_source_listed(&ctx))
    } else {
        None
    };
    let v = int_verdict(first, versions, source);
    if let Some(s) = STEL_INT_STATS.get_ptr_mut(STATS_INDEX) {
        let mut d = IntFilterStats::default();
        d.count(v);
        // SAFETY: this CPU's slot of the per-CPU array, valid for the run; atomic adds for the
        // reason given in `try_filter`.
        unsafe {
            atomic_add(&raw mut (*s).seen, d.seen);
            atomic_add(&raw mut (*s).kept, d.kept);
            atomic_add(&raw mut (*s).dropped_version, d.dropped_version);
            atomic_add(&raw mut (*s).dropped_source, d.dropped_source);
            atomic_add(&raw mut (*s).empty, d.empty);
        }
    }
    if v.keep() {
        ctx.len() as i64
    } else {
        0
    }
}

/// Adds `n` to the counter at `p` with one atomic instruction (`lock xadd`: BPF_ATOMIC | BPF_ADD
/// with the result unused, which every kernel with eBPF accepts).
///
/// # Safety
/// `p` points at a live, aligned u64 in map memory.
#[inline(always)]
unsafe fn atomic_add(p: *mut u64, n: u64) {
    if n != 0 {
        // SAFETY: the caller's contract; map values are 8-byte aligned. (`core::sync::atomic`
        // has no read-modify-write on this target; the intrinsic lowers to the same
        // instruction C's `__sync_fetch_and_add` does.)
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, n) };
    }
}

/// Adds every counter of `d` to the filter's counters at `s`, each atomically.
///
/// # Safety
/// `s` points at a live `FilterStats` in map memory.
#[inline(always)]
unsafe fn add_stats(s: *mut FilterStats, d: &FilterStats) {
    // SAFETY: fields of the live struct the caller vouches for.
    unsafe {
        atomic_add(&raw mut (*s).seen, d.seen);
        atomic_add(&raw mut (*s).kept, d.kept);
        atomic_add(&raw mut (*s).dropped, d.dropped);
        atomic_add(&raw mut (*s).too_short, d.too_short);
        atomic_add(&raw mut (*s).learned, d.learned);
        atomic_add(&raw mut (*s).learn_failed, d.learn_failed);
    }
}

/// Reads `N` bytes at `off` from the network (IP) header.
#[inline(always)]
fn load_net<const N: usize>(ctx: &SkBuffContext, off: u32) -> Option<[u8; N]> {
    let mut b = [0u8; N];
    // SAFETY: the helper writes at most `N` bytes into `b`, a live array on this stack frame;
    // the skb pointer is the program's own context.
    let rc = unsafe {
        bpf_skb_load_bytes_relative(
            ctx.as_ptr(),
            off,
            b.as_mut_ptr().cast(),
            N as u32,
            BPF_HDR_START_NET,
        )
    };
    (rc == 0).then_some(b)
}

/// Whether the datagram's IP source is in the accepted-senders map.
#[inline(always)]
fn int_source_listed(ctx: &SkBuffContext) -> bool {
    let Some([first]) = load_net::<1>(ctx, 0) else {
        return false;
    };
    let key = match first >> 4 {
        4 => match load_net::<4>(ctx, 12) {
            Some(a) => int_source_key_v4(a),
            None => return false,
        },
        6 => match load_net::<16>(ctx, 8) {
            Some(a) => a,
            None => return false,
        },
        _ => return false,
    };
    // SAFETY: the value is only tested for presence.
    unsafe { STEL_INT_SOURCES.get(&key) }.is_some()
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
