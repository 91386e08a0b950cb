//! Receive slots: one page-aligned region cut into fixed-size slots that the kernel (io_uring's
//! provided-buffer ring) or `recv` fill, decoders read, and the reader hands back.
//!
//! # Ownership protocol
//! Every slot is, at any moment, in exactly one place:
//! 1. **free** — in the pool's free list (recv reader) or in the kernel's buffer ring (io_uring);
//!    only the kernel / `recv` writes it;
//! 2. **leased** — a datagram landed in it; one or more [`Lease`]s (sub-ranges handed to
//!    decoder threads) exist; nobody writes it. [`SlotView::bytes`] gives read access through
//!    a lease.
//!
//! [`SlotPool`] counts leases per slot; a slot goes back to *free* only when its last lease is
//! [`SlotPool::retire`]d. `Lease` is neither `Clone` nor `Copy`, and only the pool makes them,
//! so "no writer while a reader holds a lease" is enforced by construction. A lease that is
//! dropped instead of retired (a decoder thread died) leaks its slot: safe, and counted by the
//! reader as `slots_in_flight` that never come back.
//!
//! This is the zero-copy hand-off between the reader and decoders (`pipeline`): a decoder
//! decodes straight out of the buffer the kernel wrote.
use std::{
    alloc::{self, Layout},
    net::SocketAddr,
    ptr::NonNull,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
};

static NEXT_POOL_ID: AtomicU32 = AtomicU32::new(1);

/// The memory behind the slots. Shared (read-only after leasing) by the reader and decoders.
#[derive(Debug)]
struct Region {
    base: NonNull<u8>,
    layout: Layout,
    slot_len: usize,
    slots: u16,
    id: u32,
}

// SAFETY: `Region` is a raw allocation with no thread affinity; concurrent access follows the
// slot ownership protocol in the module docs (writes only to free slots, by one owner).
unsafe impl Send for Region {}
// SAFETY: as above; shared references only read leased slots.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base` came from `alloc_zeroed(self.layout)` and is freed once, here. The
        // io_uring reader unregisters its buffer ring before dropping its `Arc<Region>`.
        unsafe { alloc::dealloc(self.base.as_ptr(), self.layout) }
    }
}

/// A received sub-range of one slot, owned by whoever holds it (a decoder thread).
#[derive(Debug)]
#[must_use = "a lease must be retired to the pool, or its slot is never reused"]
pub struct Lease {
    pool: u32,
    slot: u16,
    start: u32,
    end: u32,
}

impl Lease {
    /// The slot this lease reads.
    pub fn slot(&self) -> u16 {
        self.slot
    }
    /// Bytes covered.
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }
    /// True when the lease covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Read access to leased slots, for decoder threads. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SlotView {
    region: Arc<Region>,
}

impl SlotView {
    /// The bytes a lease covers.
    ///
    /// # Panics
    /// If the lease belongs to another pool (a programming error; checked because reading
    /// another pool's slot could race with its writer).
    pub fn bytes<'a>(&'a self, lease: &'a Lease) -> &'a [u8] {
        assert_eq!(lease.pool, self.region.id, "lease from another slot pool");
        let off = lease.slot as usize * self.region.slot_len;
        // SAFETY: the pool only creates leases with `start <= end <= slot_len` on slots
        // `< slots`, so the range is inside the allocation; while `lease` lives the slot is
        // leased and nothing writes it (module docs), so a shared borrow tied to `lease` is sound.
        unsafe {
            std::slice::from_raw_parts(
                self.region.base.as_ptr().add(off + lease.start as usize),
                lease.len(),
            )
        }
    }
}

/// Owns the slots and their lease counts. Lives on the reader thread.
#[derive(Debug)]
pub struct SlotPool {
    region: Arc<Region>,
    leases: Vec<u16>,
    free: Vec<u16>,
    /// Source address of the datagram in each slot (UDP readers that ask for it; `None` for
    /// netlink, or when the kernel gave none).
    sources: Vec<Option<SocketAddr>>,
    /// UDP GRO: the segment size of the coalesced datagrams in each slot (0 = one datagram).
    segments: Vec<u16>,
}

impl SlotPool {
    /// `slots` slots of `slot_len` bytes each, page-aligned, zeroed, all free.
    ///
    /// # Panics
    /// If `slots` is 0 or the size overflows (configuration is validated before this).
    pub fn new(slots: u16, slot_len: usize) -> Self {
        assert!(slots > 0 && slot_len > 0);
        let slot_len = slot_len.next_multiple_of(64);
        let size = slot_len
            .checked_mul(slots as usize)
            .expect("slot region size");
        let layout = Layout::from_size_align(size, 4096).expect("slot region layout");
        // SAFETY: `layout` has non-zero size (checked above).
        let base = unsafe { alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(base) else {
            alloc::handle_alloc_error(layout)
        };
        Self {
            region: Arc::new(Region {
                base,
                layout,
                slot_len,
                slots,
                id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            }),
            leases: vec![0; slots as usize],
            free: (0..slots).rev().collect(),
            sources: vec![None; slots as usize],
            segments: vec![0; slots as usize],
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> u16 {
        self.region.slots
    }

    /// Bytes per slot.
    pub fn slot_len(&self) -> usize {
        self.region.slot_len
    }

    /// A read view for decoder threads.
    pub fn view(&self) -> SlotView {
        SlotView {
            region: Arc::clone(&self.region),
        }
    }

    /// Slots currently leased (held by decoders or the dispatcher).
    pub fn leased(&self) -> usize {
        self.leases.iter().filter(|&&n| n > 0).count()
    }

    /// Address of a slot, for the io_uring buffer ring.
    pub(super) fn slot_addr(&self, slot: u16) -> u64 {
        debug_assert!(slot < self.region.slots);
        self.region.base.as_ptr() as u64 + slot as u64 * self.region.slot_len as u64
    }

    /// Takes a free slot out of the free list (recv reader).
    pub(crate) fn take_free(&mut self) -> Option<u16> {
        self.free.pop()
    }

    /// Puts a slot the recv reader took but did not fill back.
    pub(crate) fn put_free(&mut self, slot: u16) {
        self.free.push(slot);
    }

    /// The writable bytes of a slot that is free and taken by the caller.
    pub(crate) fn slot_mut(&mut self, slot: u16) -> &mut [u8] {
        assert!(slot < self.region.slots && self.leases[slot as usize] == 0);
        // SAFETY: the slot is in range and not leased, and the caller took it out of the free
        // list, so no one else reads or writes it; `&mut self` stops a second borrow.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.region
                    .base
                    .as_ptr()
                    .add(slot as usize * self.region.slot_len),
                self.region.slot_len,
            )
        }
    }

    /// The bytes of a slot the kernel just filled, before leasing (the reader parses headers).
    pub(super) fn filled(&self, slot: u16, len: usize) -> &[u8] {
        assert!(slot < self.region.slots && len <= self.region.slot_len);
        // SAFETY: the slot was just completed by the kernel/recv and is owned by the reader
        // thread (not free, not leased yet); shared borrow tied to `&self`.
        unsafe {
            std::slice::from_raw_parts(
                self.region
                    .base
                    .as_ptr()
                    .add(slot as usize * self.region.slot_len),
                len,
            )
        }
    }

    /// Records the source address of the datagram just received into `slot` (before leasing).
    pub(crate) fn set_source(&mut self, slot: u16, src: Option<SocketAddr>) {
        self.sources[slot as usize] = src;
    }

    /// Records the UDP GRO segment size of what was just received into `slot` (0: one
    /// datagram), before leasing.
    pub(crate) fn set_segment(&mut self, slot: u16, size: u16) {
        self.segments[slot as usize] = size;
    }

    /// UDP GRO: the size of each of the datagrams the kernel coalesced into a lease's slot (all
    /// but the last are this long), or `None` when the slot holds one datagram.
    pub fn segment(&self, lease: &Lease) -> Option<usize> {
        assert_eq!(lease.pool, self.region.id, "lease from another slot pool");
        let s = self.segments[lease.slot as usize];
        (s > 0).then_some(usize::from(s))
    }

    /// The source address of the datagram a lease reads, when its reader asked for it.
    pub fn source(&self, lease: &Lease) -> Option<SocketAddr> {
        assert_eq!(lease.pool, self.region.id, "lease from another slot pool");
        self.sources[lease.slot as usize]
    }

    /// Makes the first lease on a just-filled slot, covering `start..end`.
    pub(crate) fn lease_filled(&mut self, slot: u16, start: usize, end: usize) -> Lease {
        assert!(start <= end && end <= self.region.slot_len);
        debug_assert_eq!(self.leases[slot as usize], 0);
        self.leases[slot as usize] = 1;
        Lease {
            pool: self.region.id,
            slot,
            start: start as u32,
            end: end as u32,
        }
    }

    /// A further lease on a sub-range of `of` (relative to `of`'s start). Used by the
    /// dispatcher to send parts of one datagram to different decoders.
    ///
    /// # Panics
    /// If the range is outside `of`.
    pub fn sublease(&mut self, of: &Lease, start: usize, end: usize) -> Lease {
        assert!(start <= end && end <= of.len() && of.pool == self.region.id);
        self.leases[of.slot as usize] += 1;
        Lease {
            pool: of.pool,
            slot: of.slot,
            start: of.start + start as u32,
            end: of.start + end as u32,
        }
    }

    /// Ends a lease. Returns the slot when this was its last lease: the caller (the reader)
    /// must hand it back to the kernel or the free list.
    pub fn retire(&mut self, lease: Lease) -> Option<u16> {
        assert_eq!(lease.pool, self.region.id, "lease from another slot pool");
        let n = &mut self.leases[lease.slot as usize];
        debug_assert!(*n > 0);
        *n -= 1;
        (*n == 0).then_some(lease.slot)
    }

    /// Ends a lease of a pool whose slots live in the free list (the recv reader): the slot
    /// goes back to the free list when this was its last lease.
    pub fn retire_to_free(&mut self, lease: Lease) {
        if let Some(slot) = self.retire(lease) {
            self.free.push(slot);
        }
    }

    /// The bytes of a lease, on the reader thread (dispatching reads headers).
    pub fn bytes<'a>(&'a self, lease: &'a Lease) -> &'a [u8] {
        assert_eq!(lease.pool, self.region.id, "lease from another slot pool");
        // SAFETY: as `SlotView::bytes`.
        unsafe {
            std::slice::from_raw_parts(
                self.region
                    .base
                    .as_ptr()
                    .add(lease.slot as usize * self.region.slot_len + lease.start as usize),
                lease.len(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_free_again_only_after_its_last_lease() {
        let mut p = SlotPool::new(2, 100);
        let s = p.take_free().unwrap();
        p.slot_mut(s)[..4].copy_from_slice(b"abcd");
        let whole = p.lease_filled(s, 0, 4);
        let a = p.sublease(&whole, 0, 2);
        let b = p.sublease(&whole, 2, 4);
        assert_eq!(p.retire(whole), None);
        let v = p.view();
        assert_eq!(v.bytes(&a), b"ab");
        assert_eq!(v.bytes(&b), b"cd");
        assert_eq!(p.retire(a), None);
        assert_eq!(p.leased(), 1);
        assert_eq!(p.retire(b), Some(s));
        assert_eq!(p.leased(), 0);
    }

    #[test]
    #[should_panic(expected = "another slot pool")]
    fn leases_cannot_cross_pools() {
        let mut p = SlotPool::new(1, 64);
        let q = SlotPool::new(1, 64);
        let s = p.take_free().unwrap();
        let l = p.lease_filled(s, 0, 1);
        let _ = q.view().bytes(&l);
    }
}
