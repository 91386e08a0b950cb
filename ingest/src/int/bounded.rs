//! A keyed table with a size bound and two eviction rules, for the decoder's per-sender state
//! (flows, sequence streams): everything in it was created by what senders put in their
//! reports, so nothing about it may grow with what they choose to send.
//!
//! * **Idle time**: an entry not seen for `idle_ns` (by report receive time) is dropped, checked
//!   every `idle_ns / 4` of report time (one comparison per report otherwise).
//! * **Least recently seen**: inserting into a full table first drops the idle entries; if none
//!   were idle, the least recently seen eighth of the table goes in one pass (amortised O(1) per
//!   insertion, no per-report bookkeeping). A flood of new keys therefore costs a bounded amount
//!   of memory and CPU and pushes out the oldest state first.
//!
//! Every drop goes through the caller's `gone` callback (so a sequence stream's pending gaps can
//! be settled) and is counted.

use std::{
    collections::HashMap,
    hash::{BuildHasher, BuildHasherDefault, Hasher},
};

/// State that knows when it was last seen.
pub(crate) trait Aged {
    /// Receive time (ns) of the last report that touched it.
    fn last_ns(&self) -> i64;
}

/// Passes a u64 that is already a hash.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Keys that are hashes already (flow keys).
pub(crate) type PreHashed = BuildHasherDefault<KeyHasher>;

/// A `u64`-keyed map of at most `cap` entries (see the module docs).
#[derive(Debug)]
pub(crate) struct Bounded<V, H = PreHashed> {
    map: HashMap<u64, V, H>,
    cap: usize,
    idle_ns: i64,
    next_sweep_ns: i64,
    /// Scratch for the least-recently-seen pass (kept: no allocation per pass).
    stamps: Vec<i64>,
    /// Entries dropped for idleness.
    pub expired: u64,
    /// Entries dropped to make room (the table was full of recently seen ones).
    pub evicted: u64,
}

impl<V: Aged, H: BuildHasher + Default> Bounded<V, H> {
    /// At most `cap` entries (at least 1); entries idle for `idle_ns` are dropped.
    pub(crate) fn new(cap: usize, idle_ns: i64) -> Self {
        Self {
            map: HashMap::default(),
            cap: cap.max(1),
            idle_ns: idle_ns.max(1),
            next_sweep_ns: i64::MIN,
            stamps: Vec::new(),
            expired: 0,
            evicted: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, k: u64) -> Option<&mut V> {
        self.map.get_mut(&k)
    }

    /// Inserts `v` under `k` (not present), making room first when the table is full.
    pub(crate) fn insert(&mut self, k: u64, v: V, now_ns: i64, gone: impl FnMut(&V)) -> &mut V {
        if self.map.len() >= self.cap {
            self.make_room(now_ns, gone);
        }
        self.map.entry(k).or_insert(v)
    }

    /// The periodic idle check: cheap unless `idle_ns / 4` of report time went by since the
    /// last one.
    #[inline]
    pub(crate) fn tick(&mut self, now_ns: i64, gone: impl FnMut(&V)) {
        if now_ns >= self.next_sweep_ns {
            self.expire(now_ns, gone);
        }
    }

    /// Drops every entry idle for `idle_ns` at `now_ns`.
    pub(crate) fn expire(&mut self, now_ns: i64, mut gone: impl FnMut(&V)) {
        self.next_sweep_ns = now_ns.saturating_add(self.idle_ns / 4);
        let idle = self.idle_ns;
        let before = self.map.len();
        self.map.retain(|_, v| {
            let keep = now_ns.saturating_sub(v.last_ns()) < idle;
            if !keep {
                gone(v);
            }
            keep
        });
        self.expired += (before - self.map.len()) as u64;
    }

    fn make_room(&mut self, now_ns: i64, mut gone: impl FnMut(&V)) {
        self.expire(now_ns, &mut gone);
        if self.map.len() < self.cap {
            return;
        }
        let k = (self.cap / 8).max(1);
        self.stamps.clear();
        self.stamps.extend(self.map.values().map(Aged::last_ns));
        let (_, &mut threshold, _) = self.stamps.select_nth_unstable(k - 1);
        let before = self.map.len();
        self.map.retain(|_, v| {
            let keep = v.last_ns() > threshold;
            if !keep {
                gone(v);
            }
            keep
        });
        self.evicted += (before - self.map.len()) as u64;
    }

    /// Every entry (for end-of-run settling).
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.map.values_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(i64);
    impl Aged for E {
        fn last_ns(&self) -> i64 {
            self.0
        }
    }

    #[test]
    fn full_table_drops_idle_first_then_the_least_recently_seen_eighth() {
        let mut t: Bounded<E> = Bounded::new(16, 1_000);
        let mut gone = 0;
        for k in 0..16 {
            t.insert(k, E(100 + k as i64), 100 + k as i64, |_| gone += 1);
        }
        assert_eq!((t.len(), gone), (16, 0));
        // Nothing idle at 200: the two least recently seen (keys 0, 1) make room.
        t.insert(99, E(200), 200, |_| gone += 1);
        assert_eq!((t.len(), t.evicted, gone), (15, 2, 2));
        assert!(t.get_mut(0).is_none() && t.get_mut(1).is_none() && t.get_mut(2).is_some());
        // At 1,109 keys 2..=9 (last seen ≤ 109) are idle: dropped by the periodic check.
        t.tick(1_109, |_| gone += 1);
        assert_eq!((t.len(), t.expired), (7, 8));
        // A flood of new keys never takes the table past its bound.
        for k in 1000..100_000u64 {
            t.insert(k, E(2_000), 2_000, |_| {});
            assert!(t.len() <= 16);
        }
    }
}
