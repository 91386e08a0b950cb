//! Report loss from sequence numbers, per (reporting switch, hw_id), at the field's real width.
//!
//! Each stream keeps `next` (the number expected next) and a bitmap of the last `window`
//! numbers below it: which arrived. A report ahead of `next` by `d` leaves `d` numbers missing
//! (*pending*); a late report inside the window fills its slot (*reordered*, pending − 1); a
//! number sliding out of the window still missing becomes *lost* for good. So
//! `lost + pending` is exact at every moment, and `lost` alone once the window has moved on
//! (or after [`SeqTracker::finish`]). Arithmetic is modulo 2^width (32 for v0.5/v1.0, 22 for
//! v2.0, 24 for the Tofino variant), so wraparound is neither loss nor reordering.
//! A report behind the window is *stale* (counted, ignored); several stale reports in a row that
//! follow each other mean the switch restarted its numbering: the stream resynchronises.

use super::FastMap;

/// Largest reordering window (bits of the ring).
pub(crate) const MAX_WINDOW: u32 = 1024;
const WORDS: usize = (MAX_WINDOW / 64) as usize;
/// Consecutive stale, consecutive reports that mean a restart.
const RESYNC_AFTER: u32 = 4;

/// What one report did to its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SeqOutcome {
    /// Numbers skipped right before this one (the report's `seq_gap`).
    pub gap: u32,
    /// Filled an earlier gap.
    pub reordered: bool,
    pub duplicate: bool,
    pub stale: bool,
    pub resync: bool,
}

#[derive(Debug, Clone)]
struct Stream {
    next: u32,
    /// Bit (n mod MAX_WINDOW) = number n arrived, for n in [next − window, next).
    seen: [u64; WORDS],
    stale_run: u32,
    last_stale: u32,
}

impl Stream {
    #[inline]
    fn get(&self, n: u32) -> bool {
        let i = (n % MAX_WINDOW) as usize;
        self.seen[i / 64] >> (i % 64) & 1 == 1
    }

    #[inline]
    fn set(&mut self, n: u32, v: bool) {
        let i = (n % MAX_WINDOW) as usize;
        if v {
            self.seen[i / 64] |= 1 << (i % 64);
        } else {
            self.seen[i / 64] &= !(1 << (i % 64));
        }
    }
}

/// Loss accounting for every stream one decoder owns.
#[derive(Debug)]
pub(crate) struct SeqTracker {
    window: u32,
    /// Keyed by `switch << 16 | hw_id << 8 | bits` (one word to hash).
    streams: FastMap<u64, Stream>,
    /// Final losses.
    pub lost: u64,
    /// Missing numbers still inside a window.
    pub pending: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub stale: u64,
    pub resyncs: u64,
}

impl SeqTracker {
    /// `window`: how far back a late report still counts as reordered (1..=[`MAX_WINDOW`]).
    pub(crate) fn new(window: u32) -> Self {
        Self {
            window: window.clamp(1, MAX_WINDOW),
            streams: FastMap::default(),
            lost: 0,
            pending: 0,
            reordered: 0,
            duplicates: 0,
            stale: 0,
            resyncs: 0,
        }
    }

    /// Streams tracked.
    #[cfg(test)]
    pub(crate) fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Accounts report `seq` (`bits` wide: 1..=32) of stream (`switch`, `hw_id`).
    pub(crate) fn observe(&mut self, switch: u32, hw_id: u8, bits: u8, seq: u32) -> SeqOutcome {
        let bits = bits.clamp(1, 32);
        let mask = if bits == 32 {
            u32::MAX
        } else {
            (1u32 << bits) - 1
        };
        let half = 1u32 << (bits - 1);
        let seq = seq & mask;
        let w = self.window.min(half);
        let s = match self
            .streams
            .entry(u64::from(switch) << 16 | u64::from(hw_id) << 8 | u64::from(bits))
        {
            std::collections::hash_map::Entry::Vacant(v) => {
                let mut st = Stream {
                    next: seq.wrapping_add(1) & mask,
                    seen: [0; WORDS],
                    stale_run: 0,
                    last_stale: 0,
                };
                // Numbers before the first one are not ours to count: mark the window seen.
                st.seen = [u64::MAX; WORDS];
                st.set(seq, true);
                v.insert(st);
                return SeqOutcome::default();
            }
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        };
        let ahead = seq.wrapping_sub(s.next) & mask;
        if ahead < half {
            s.stale_run = 0;
            let d = ahead; // numbers s.next .. seq are missing
            let slide = d as u64 + 1;
            if slide >= w as u64 {
                // The whole old window leaves: its missing numbers are lost.
                let mut missing_old = 0u64;
                for k in 1..=w {
                    if !s.get(s.next.wrapping_sub(k) & mask) {
                        missing_old += 1;
                    }
                }
                self.lost += missing_old;
                self.pending -= missing_old;
                // Of the d new missing numbers, those below the new window are lost at once.
                let in_window = (d as u64).min(w as u64 - 1);
                self.lost += d as u64 - in_window;
                self.pending += in_window;
                s.seen = [0; WORDS];
                // Numbers in [seq − w + 1, seq) that are not missing: none (all are new gaps
                // or below the window), so only seq is set.
                s.set(seq, true);
            } else {
                // Slide by d + 1: numbers next − w .. next − w + d + 1 leave the window.
                for k in 0..slide as u32 {
                    let leaving = s.next.wrapping_sub(w).wrapping_add(k) & mask;
                    if !s.get(leaving) {
                        self.lost += 1;
                        self.pending -= 1;
                    }
                    let entering = s.next.wrapping_add(k) & mask;
                    s.set(entering, false);
                }
                s.set(seq, true);
                self.pending += d as u64;
            }
            s.next = seq.wrapping_add(1) & mask;
            return SeqOutcome {
                gap: d,
                ..Default::default()
            };
        }
        let back = s.next.wrapping_sub(seq) & mask; // 1..=2^bits − half
        if back <= w {
            s.stale_run = 0;
            if s.get(seq) {
                self.duplicates += 1;
                return SeqOutcome {
                    duplicate: true,
                    ..Default::default()
                };
            }
            s.set(seq, true);
            self.pending -= 1;
            self.reordered += 1;
            return SeqOutcome {
                reordered: true,
                ..Default::default()
            };
        }
        // Behind the window.
        if s.stale_run > 0 && seq == s.last_stale.wrapping_add(1) & mask {
            s.stale_run += 1;
        } else {
            s.stale_run = 1;
        }
        s.last_stale = seq;
        if s.stale_run >= RESYNC_AFTER {
            // The switch restarted its numbering: what is missing in the old window is lost.
            let mut missing_old = 0u64;
            for k in 1..=w {
                if !s.get(s.next.wrapping_sub(k) & mask) {
                    missing_old += 1;
                }
            }
            self.lost += missing_old;
            self.pending -= missing_old;
            s.seen = [u64::MAX; WORDS];
            s.next = seq.wrapping_add(1) & mask;
            s.stale_run = 0;
            self.resyncs += 1;
            // The reports of the run before this one were counted stale; they belong to the new
            // numbering, so they are neither stale nor lost.
            self.stale -= u64::from(RESYNC_AFTER - 1);
            return SeqOutcome {
                resync: true,
                ..Default::default()
            };
        }
        self.stale += 1;
        SeqOutcome {
            stale: true,
            ..Default::default()
        }
    }

    /// Ends accounting: every pending gap is final.
    pub(crate) fn finish(&mut self) {
        self.lost += self.pending;
        self.pending = 0;
        for s in self.streams.values_mut() {
            s.seen = [u64::MAX; WORDS];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(t: &mut SeqTracker, bits: u8, seqs: &[u32]) -> Vec<u32> {
        seqs.iter().map(|&s| t.observe(1, 0, bits, s).gap).collect()
    }

    #[test]
    fn in_order_no_loss_and_wraparound_at_width() {
        for bits in [22u8, 24, 32] {
            let max = if bits == 32 {
                u32::MAX
            } else {
                (1 << bits) - 1
            };
            let mut t = SeqTracker::new(64);
            let seqs: Vec<u32> = (0..10u32)
                .map(|i| max.wrapping_sub(4).wrapping_add(i) & max)
                .collect();
            assert_eq!(run(&mut t, bits, &seqs), vec![0; 10]);
            t.finish();
            assert_eq!(
                (t.lost, t.reordered, t.duplicates, t.stale),
                (0, 0, 0, 0),
                "{bits}"
            );
        }
    }

    #[test]
    fn gaps_across_wrap_are_exact() {
        let mut t = SeqTracker::new(64);
        let max = (1u32 << 22) - 1;
        // max-2, max-1, (max lost), 0, (1, 2 lost), 3
        assert_eq!(run(&mut t, 22, &[max - 2, max - 1, 0, 3]), vec![0, 0, 1, 2]);
        assert_eq!(t.lost + t.pending, 3);
        t.finish();
        assert_eq!(t.lost, 3);
    }

    #[test]
    fn reordering_inside_window_is_not_loss() {
        let mut t = SeqTracker::new(8);
        run(&mut t, 32, &[10, 12, 11, 13, 15, 14, 14]);
        assert_eq!(t.reordered, 2);
        assert_eq!(t.duplicates, 1);
        t.finish();
        assert_eq!(t.lost, 0);
    }

    #[test]
    fn late_beyond_window_is_stale_and_gap_stays_lost() {
        let mut t = SeqTracker::new(4);
        run(&mut t, 32, &[1, 3, 4, 5, 6, 7, 8, 9]); // 2 missing, window moves past it
        assert_eq!(t.lost, 1);
        assert_eq!(t.pending, 0);
        t.observe(1, 0, 32, 2);
        assert_eq!(t.stale, 1);
        t.finish();
        assert_eq!(t.lost, 1);
    }

    #[test]
    fn large_jump_counts_every_missing_number() {
        let mut t = SeqTracker::new(16);
        run(&mut t, 32, &[100, 101, 1101]);
        assert_eq!(t.lost + t.pending, 999);
        t.observe(1, 0, 32, 1095); // late, in window
        assert_eq!(t.reordered, 1);
        t.finish();
        assert_eq!(t.lost, 998);
    }

    #[test]
    fn restart_resynchronises_without_phantom_loss() {
        let mut t = SeqTracker::new(16);
        run(&mut t, 32, &[1_000_000, 1_000_001]);
        run(&mut t, 32, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(t.resyncs, 1);
        assert_eq!(t.stale, 0);
        t.finish();
        assert_eq!(t.lost, 0);
    }

    #[test]
    fn streams_are_separate_per_switch_and_hw_id() {
        let mut t = SeqTracker::new(16);
        t.observe(1, 0, 32, 5);
        t.observe(1, 1, 32, 100);
        t.observe(2, 0, 32, 7);
        assert_eq!(t.observe(1, 0, 32, 6).gap, 0);
        assert_eq!(t.observe(1, 1, 32, 101).gap, 0);
        assert_eq!(t.observe(2, 0, 32, 9).gap, 1);
        assert_eq!(t.streams(), 3);
    }
}
