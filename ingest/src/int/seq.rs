//! Report loss from sequence numbers, per (reporting switch, hw_id), at the field's real width.
//!
//! Each stream keeps `next` (the number expected next) and a bitmap of the last `window`
//! numbers below it: which arrived. A report ahead of `next` by `d` leaves `d` numbers missing
//! (*pending*); a late report inside the window fills its slot (*reordered*, pending − 1); a
//! number sliding out of the window still missing becomes *lost* for good. So
//! `lost + pending` is exact at every moment, and `lost` alone once the window has moved on
//! (or after [`SeqTracker::finish`]). Arithmetic is modulo 2^width (32 for v0.5/v1.0, 22 for
//! v2.0, 24 for the Tofino variant), so wraparound is neither loss nor reordering.
//!
//! Numbers are what the sender says, so none is believed on its own when it is far from where
//! the stream is:
//! * more than `window` ahead (up to `max_gap`): a *suspect* jump, believed (its gap counted
//!   as loss) only once the next number follows it — one stray or forged number never moves the
//!   stream or creates loss;
//! * behind the window (*stale*), or more than `max_gap` ahead: believed only when
//!   [`RESYNC_AFTER`] consecutive numbers follow each other there — then the switch restarted
//!   its numbering (a *resync*): the stream starts again there, nothing counted as lost for the
//!   jump.
//!
//! Streams are created only by well-formed reports, at most `max_streams` per decoder, and
//! dropped after `idle_ns` without reports or, when the table is full, least recently seen
//! first ([`super::bounded`]); a dropped stream's pending gaps become lost.

use super::{
    bounded::{Aged, Bounded},
    FastHasher,
};

/// Largest reordering window (bits of the ring).
pub(crate) const MAX_WINDOW: u32 = 1024;
const WORDS: usize = (MAX_WINDOW / 64) as usize;
/// Consecutive numbers outside the window and the gap limit that mean a restart.
pub(crate) const RESYNC_AFTER: u32 = 4;

/// What one report did to its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SeqOutcome {
    /// Numbers skipped right before this one (the report's `seq_gap`; for a confirmed jump the
    /// gap before the jump, given to the report that confirmed it).
    pub gap: u32,
    /// Filled an earlier gap.
    pub reordered: bool,
    pub duplicate: bool,
    pub stale: bool,
    /// Too far ahead to believe yet.
    pub suspect: bool,
    pub resync: bool,
    /// No stream: a malformed report of an unknown stream, or the first of a stream.
    pub untracked: bool,
}

#[derive(Debug, Clone)]
struct Stream {
    next: u32,
    /// Sequence width (bits).
    bits: u8,
    /// Bit (n mod MAX_WINDOW) = number n arrived, for n in [next − window, next).
    seen: [u64; WORDS],
    /// The current run of numbers outside the window: its last number and length, and how many
    /// of its reports were counted stale / suspect (undone when the run is believed).
    run_last: u32,
    run_len: u32,
    run_stale: u32,
    run_suspect: u32,
    last_ns: i64,
}

impl Aged for Stream {
    fn last_ns(&self) -> i64 {
        self.last_ns
    }
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

    fn mask(&self) -> u32 {
        if self.bits == 32 {
            u32::MAX
        } else {
            (1u32 << self.bits) - 1
        }
    }

    /// Numbers missing in the window below `next`.
    fn missing(&self, w: u32) -> u64 {
        let mask = self.mask();
        (1..=w)
            .filter(|&k| !self.get(self.next.wrapping_sub(k) & mask))
            .count() as u64
    }
}

/// Loss-tracking limits (from `IntDecodeConfig`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeqLimits {
    /// How far back a late report still counts as reordered (1..=[`MAX_WINDOW`]).
    pub window: u32,
    /// Largest jump ahead believed as loss (once confirmed); larger ones are restarts.
    pub max_gap: u32,
    /// Streams tracked at most.
    pub max_streams: usize,
    /// A stream without reports for this long is dropped.
    pub idle_ns: i64,
}

/// Loss accounting for every stream one decoder owns.
#[derive(Debug)]
pub(crate) struct SeqTracker {
    window: u32,
    max_gap: u32,
    /// Keyed by `switch << 16 | hw_id << 8 | bits` (one word to hash).
    streams: Bounded<Stream, std::hash::BuildHasherDefault<FastHasher>>,
    /// Final losses.
    pub lost: u64,
    /// Missing numbers still inside a window.
    pub pending: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub stale: u64,
    pub suspect: u64,
    pub resyncs: u64,
}

impl SeqTracker {
    pub(crate) fn new(l: SeqLimits) -> Self {
        let window = l.window.clamp(1, MAX_WINDOW);
        Self {
            window,
            max_gap: l.max_gap.max(window),
            streams: Bounded::new(l.max_streams, l.idle_ns),
            lost: 0,
            pending: 0,
            reordered: 0,
            duplicates: 0,
            stale: 0,
            suspect: 0,
            resyncs: 0,
        }
    }

    /// Streams tracked now.
    pub(crate) fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Streams dropped (idle, or to make room).
    pub(crate) fn streams_dropped(&self) -> (u64, u64) {
        (self.streams.expired, self.streams.evicted)
    }

    /// The most streams kept.
    pub(crate) fn max_streams(&self) -> usize {
        self.streams.cap()
    }

    /// A dropped stream's pending gaps are final.
    fn settle(window: u32, lost: &mut u64, pending: &mut u64, s: &Stream) {
        let half = 1u32 << (s.bits - 1);
        let m = s.missing(window.min(half));
        *lost += m;
        *pending -= m;
    }

    /// The periodic idle check (one comparison unless it is due).
    #[inline]
    pub(crate) fn tick(&mut self, now_ns: i64) {
        let (w, lost, pending) = (self.window, &mut self.lost, &mut self.pending);
        self.streams
            .tick(now_ns, |s| Self::settle(w, lost, pending, s));
    }

    /// Accounts report `seq` (`bits` wide: 1..=32) of stream (`switch`, `hw_id`), received at
    /// `now_ns`. `create`: the report was well-formed, so it may start a stream; a malformed
    /// one only counts in a stream that exists.
    pub(crate) fn observe(
        &mut self,
        switch: u32,
        hw_id: u8,
        bits: u8,
        seq: u32,
        now_ns: i64,
        create: bool,
    ) -> SeqOutcome {
        let bits = bits.clamp(1, 32);
        let mask = if bits == 32 {
            u32::MAX
        } else {
            (1u32 << bits) - 1
        };
        let half = 1u32 << (bits - 1);
        let seq = seq & mask;
        let w = self.window.min(half);
        let key = u64::from(switch) << 16 | u64::from(hw_id) << 8 | u64::from(bits);
        let Some(s) = self.streams.get_mut(key) else {
            if create {
                let mut st = Stream {
                    next: seq.wrapping_add(1) & mask,
                    bits,
                    // Numbers before the first one are not ours to count: the window is seen.
                    seen: [u64::MAX; WORDS],
                    run_last: 0,
                    run_len: 0,
                    run_stale: 0,
                    run_suspect: 0,
                    last_ns: now_ns,
                };
                st.set(seq, true);
                let (win, lost, pending) = (self.window, &mut self.lost, &mut self.pending);
                self.streams
                    .insert(key, st, now_ns, |s| Self::settle(win, lost, pending, s));
            }
            return SeqOutcome {
                untracked: true,
                ..Default::default()
            };
        };
        s.last_ns = s.last_ns.max(now_ns);
        let ahead = seq.wrapping_sub(s.next) & mask;
        if ahead == 0 && w > 1 {
            // In order (the usual case; what `forward` does for it): the number `w` below
            // `seq` leaves the window, `seq` enters it.
            s.run_len = 0;
            if !s.get(seq.wrapping_sub(w) & mask) {
                self.lost += 1;
                self.pending -= 1;
            }
            s.set(seq, true);
            s.next = seq.wrapping_add(1) & mask;
            return SeqOutcome::default();
        }
        if ahead < half && ahead < w {
            // In order, or a gap the window covers: believed at once.
            s.run_len = 0;
            return Self::forward(s, seq, ahead, w, &mut self.lost, &mut self.pending);
        }
        let back = s.next.wrapping_sub(seq) & mask;
        if ahead >= half && back <= w {
            s.run_len = 0;
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
        // Outside the window: part of a run of consecutive numbers, or the start of one.
        if s.run_len > 0 && seq == s.run_last.wrapping_add(1) & mask {
            s.run_len += 1;
        } else {
            s.run_len = 1;
            s.run_stale = 0;
            s.run_suspect = 0;
        }
        s.run_last = seq;
        let jump = ahead < half && ahead <= self.max_gap;
        if jump && s.run_len >= 2 {
            // A jump ahead, confirmed by the number after it: the gap before the run's first
            // number is loss. Undo the run's suspect counts and take its numbers in order.
            self.suspect -= u64::from(s.run_suspect);
            self.stale -= u64::from(s.run_stale);
            let first = seq.wrapping_sub(s.run_len - 1) & mask;
            let gap = first.wrapping_sub(s.next) & mask;
            let mut out = Self::forward(s, first, gap, w, &mut self.lost, &mut self.pending);
            for k in 1..s.run_len {
                let n = first.wrapping_add(k) & mask;
                out.gap += Self::forward(s, n, 0, w, &mut self.lost, &mut self.pending).gap;
            }
            s.run_len = 0;
            return out;
        }
        if s.run_len >= RESYNC_AFTER {
            // The switch restarted its numbering: what is missing in the old window is lost;
            // the run's reports belong to the new numbering (neither stale nor suspect).
            let m = s.missing(w);
            self.lost += m;
            self.pending -= m;
            self.stale -= u64::from(s.run_stale);
            self.suspect -= u64::from(s.run_suspect);
            s.seen = [u64::MAX; WORDS];
            s.next = seq.wrapping_add(1) & mask;
            s.run_len = 0;
            self.resyncs += 1;
            return SeqOutcome {
                resync: true,
                ..Default::default()
            };
        }
        if ahead < half {
            s.run_suspect += 1;
            self.suspect += 1;
            SeqOutcome {
                suspect: true,
                ..Default::default()
            }
        } else {
            s.run_stale += 1;
            self.stale += 1;
            SeqOutcome {
                stale: true,
                ..Default::default()
            }
        }
    }

    /// Number `seq`, `d` ahead of `next` (`d` ≤ the gap limit): `d` numbers go missing, the
    /// window slides past `seq`.
    fn forward(
        s: &mut Stream,
        seq: u32,
        d: u32,
        w: u32,
        lost: &mut u64,
        pending: &mut u64,
    ) -> SeqOutcome {
        let mask = s.mask();
        let slide = u64::from(d) + 1;
        if slide >= u64::from(w) {
            // The whole old window leaves: its missing numbers are lost.
            let missing_old = s.missing(w);
            *lost += missing_old;
            *pending -= missing_old;
            // Of the d new missing numbers, those below the new window are lost at once.
            let in_window = u64::from(d).min(u64::from(w) - 1);
            *lost += u64::from(d) - in_window;
            *pending += in_window;
            s.seen = [0; WORDS];
            // Numbers in [seq − w + 1, seq) that are not missing: none (all are new gaps or
            // below the window), so only seq is set.
            s.set(seq, true);
        } else {
            // Slide by d + 1: numbers next − w .. next − w + d + 1 leave the window.
            for k in 0..slide as u32 {
                let leaving = s.next.wrapping_sub(w).wrapping_add(k) & mask;
                if !s.get(leaving) {
                    *lost += 1;
                    *pending -= 1;
                }
                let entering = s.next.wrapping_add(k) & mask;
                s.set(entering, false);
            }
            s.set(seq, true);
            *pending += u64::from(d);
        }
        s.next = seq.wrapping_add(1) & mask;
        SeqOutcome {
            gap: d,
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

    fn tracker(window: u32) -> SeqTracker {
        SeqTracker::new(SeqLimits {
            window,
            max_gap: 1 << 20,
            max_streams: 64,
            idle_ns: 1 << 40,
        })
    }

    fn run(t: &mut SeqTracker, bits: u8, seqs: &[u32]) -> Vec<u32> {
        seqs.iter()
            .map(|&s| t.observe(1, 0, bits, s, 0, true).gap)
            .collect()
    }

    #[test]
    fn in_order_no_loss_and_wraparound_at_width() {
        for bits in [22u8, 24, 32] {
            let max = if bits == 32 {
                u32::MAX
            } else {
                (1 << bits) - 1
            };
            let mut t = tracker(64);
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
        let mut t = tracker(64);
        let max = (1u32 << 22) - 1;
        // max-2, max-1, (max lost), 0, (1, 2 lost), 3
        assert_eq!(run(&mut t, 22, &[max - 2, max - 1, 0, 3]), vec![0, 0, 1, 2]);
        assert_eq!(t.lost + t.pending, 3);
        t.finish();
        assert_eq!(t.lost, 3);
    }

    #[test]
    fn reordering_inside_window_is_not_loss() {
        let mut t = tracker(8);
        run(&mut t, 32, &[10, 12, 11, 13, 15, 14, 14]);
        assert_eq!(t.reordered, 2);
        assert_eq!(t.duplicates, 1);
        t.finish();
        assert_eq!(t.lost, 0);
    }

    #[test]
    fn late_beyond_window_is_stale_and_gap_stays_lost() {
        let mut t = tracker(4);
        run(&mut t, 32, &[1, 3, 4, 5, 6, 7, 8, 9]); // 2 missing, window moves past it
        assert_eq!(t.lost, 1);
        assert_eq!(t.pending, 0);
        t.observe(1, 0, 32, 2, 0, true);
        assert_eq!(t.stale, 1);
        t.finish();
        assert_eq!(t.lost, 1);
    }

    #[test]
    fn a_large_jump_counts_once_the_next_number_confirms_it() {
        let mut t = tracker(16);
        // 1101 alone is suspect; 1102 after it makes the 999 missing numbers loss, reported as
        // the confirming report's gap.
        assert_eq!(run(&mut t, 32, &[100, 101, 1101]), [0, 0, 0]);
        assert_eq!((t.lost + t.pending, t.suspect), (0, 1));
        assert_eq!(run(&mut t, 32, &[1102]), [999]);
        assert_eq!((t.lost + t.pending, t.suspect), (999, 0));
        t.observe(1, 0, 32, 1095, 0, true); // late, in window
        assert_eq!(t.reordered, 1);
        t.finish();
        assert_eq!(t.lost, 998);
    }

    #[test]
    fn random_numbers_are_suspect_or_stale_never_loss() {
        let mut t = tracker(256);
        run(&mut t, 32, &[5, 6, 7]);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t.observe(1, 0, 32, x as u32, 0, true);
        }
        // The stream is where it was: the next honest number is in order.
        assert_eq!(t.observe(1, 0, 32, 8, 0, true).gap, 0);
        t.finish();
        assert!(t.lost < 1_000, "garbage believed: {} lost", t.lost);
        assert!(t.suspect + t.stale > 99_000, "{} {}", t.suspect, t.stale);
    }

    #[test]
    fn restart_resynchronises_without_phantom_loss() {
        let mut t = tracker(16);
        run(&mut t, 32, &[1_000_000, 1_000_001]);
        run(&mut t, 32, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(t.resyncs, 1);
        assert_eq!(t.stale, 0);
        // A restart far ahead (past the gap limit) resynchronises the same way.
        run(
            &mut t,
            32,
            &[
                3_000_000_000,
                3_000_000_001,
                3_000_000_002,
                3_000_000_003,
                3_000_000_004,
            ],
        );
        assert_eq!((t.resyncs, t.suspect), (2, 0));
        t.finish();
        assert_eq!(t.lost, 0);
    }

    #[test]
    fn malformed_reports_never_create_streams_and_the_table_is_bounded() {
        let mut t = SeqTracker::new(SeqLimits {
            window: 64,
            max_gap: 1 << 20,
            max_streams: 8,
            idle_ns: 1_000,
        });
        assert!(t.observe(1, 0, 32, 5, 0, false).untracked);
        assert_eq!(t.streams(), 0);
        for sw in 0..1000 {
            t.observe(sw, 0, 32, 7, 10, true);
            assert!(t.streams() <= 8);
        }
        assert_eq!(t.streams_dropped().1, 1000 - 8);
        // A dropped stream's pending gap becomes lost.
        let mut t = SeqTracker::new(SeqLimits {
            window: 64,
            max_gap: 1 << 20,
            max_streams: 1,
            idle_ns: 1_000,
        });
        t.observe(1, 0, 32, 1, 0, true);
        t.observe(1, 0, 32, 4, 0, true);
        assert_eq!((t.lost, t.pending), (0, 2));
        t.observe(2, 0, 32, 1, 5, true);
        assert_eq!((t.lost, t.pending), (2, 0));
        // Idle streams go at the periodic check.
        t.tick(10_000);
        assert_eq!((t.streams(), t.streams_dropped().0), (0, 1));
    }

    #[test]
    fn streams_are_separate_per_switch_and_hw_id() {
        let mut t = tracker(16);
        t.observe(1, 0, 32, 5, 0, true);
        t.observe(1, 1, 32, 100, 0, true);
        t.observe(2, 0, 32, 7, 0, true);
        assert_eq!(t.observe(1, 0, 32, 6, 0, true).gap, 0);
        assert_eq!(t.observe(1, 1, 32, 101, 0, true).gap, 0);
        assert_eq!(t.observe(2, 0, 32, 9, 0, true).gap, 1);
        assert_eq!(t.streams(), 3);
    }
}
