//! Burst figures: the "above threshold" test exactly as `stel-query bursts` evaluates it, and
//! the segment monoid that lets intervals (and query windows) be composed exactly.

/// A run of consecutive deltas of one series, as far as bursts are concerned.
///
/// `n` deltas; `above` ns of them above the threshold; `runs` maximal runs of above deltas;
/// `head` the run that starts at the first delta (0 if that delta is not above); `tail` the run
/// that ends at the last one; `longest` the longest run; `full`: every delta is above.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seg {
    pub n: u64,
    pub above: u64,
    pub runs: u64,
    pub head: u64,
    pub tail: u64,
    pub longest: u64,
    pub full: bool,
}

impl Seg {
    /// One delta of length `dt` ns, above the threshold or not (a reset is "not above").
    pub fn one(dt: u64, above: bool) -> Self {
        if above {
            Self {
                n: 1,
                above: dt,
                runs: 1,
                head: dt,
                tail: dt,
                longest: dt,
                full: true,
            }
        } else {
            Self {
                n: 1,
                ..Self::default()
            }
        }
    }

    /// A segment as stored in a tier row (`full` is implied: one run touching both ends).
    pub fn from_parts(n: u64, above: u64, runs: u64, head: u64, tail: u64, longest: u64) -> Self {
        Self {
            n,
            above,
            runs,
            head,
            tail,
            longest,
            full: n > 0 && runs == 1 && head > 0 && tail > 0 && head == above,
        }
    }

    /// `self` followed by `b`.
    pub fn then(self, b: Seg) -> Seg {
        if self.n == 0 {
            return b;
        }
        if b.n == 0 {
            return self;
        }
        let join = self.tail > 0 && b.head > 0;
        Seg {
            n: self.n + b.n,
            above: self.above + b.above,
            runs: self.runs + b.runs - u64::from(join),
            head: if self.full {
                self.above + b.head
            } else {
                self.head
            },
            tail: if b.full { self.tail + b.above } else { b.tail },
            longest: self
                .longest
                .max(b.longest)
                .max(if join { self.tail + b.head } else { 0 }),
            full: self.full && b.full,
        }
    }
}

/// Utilisation in % of a delta of `d` octets over `dt_ns` at a line rate of `bytes_per_s`: the
/// one expression `stel-query bursts` (and its Spark SQL) and the tiers evaluate, the same f64
/// operations in the same order.
pub fn utilisation(d: u64, dt_ns: i64, bytes_per_s: f64) -> f64 {
    d as f64 / (dt_ns as f64 / 1e9) / bytes_per_s * 100.0
}

/// Whether a delta of `d` octets over `dt_ns` is above `threshold` % of `bytes_per_s`
/// ([`utilisation`] `>` threshold).
pub fn above(d: u64, dt_ns: i64, bytes_per_s: f64, threshold: f64) -> bool {
    utilisation(d, dt_ns, bytes_per_s) > threshold
}

/// The smallest `d` for which [`above`] holds at `dt_ns` (`u64::MAX` + never: `None`). The
/// expression is monotone in `d` (each f64 operation is monotone non-decreasing), so "above" is
/// exactly `d >= cutoff`: one integer compare per delta, no floating point on the data path.
pub fn cutoff(dt_ns: i64, bytes_per_s: f64, threshold: f64) -> Option<u64> {
    if dt_ns <= 0 {
        return None;
    }
    if !above(u64::MAX, dt_ns, bytes_per_s, threshold) {
        return None;
    }
    let est = threshold / 100.0 * bytes_per_s * (dt_ns as f64 / 1e9);
    // Bracket the boundary around the estimate, then bisect: lo is not above, hi is.
    let mut hi = if est >= u64::MAX as f64 {
        u64::MAX
    } else {
        (est.max(0.0) as u64).saturating_add(2)
    };
    let mut step = 1u64;
    while !above(hi, dt_ns, bytes_per_s, threshold) {
        hi = hi.saturating_add(step);
        step = step.saturating_mul(2);
    }
    let mut lo = hi.saturating_sub(2);
    let mut step = 1u64;
    while lo > 0 && above(lo, dt_ns, bytes_per_s, threshold) {
        lo = lo.saturating_sub(step);
        step = step.saturating_mul(2);
    }
    if above(lo, dt_ns, bytes_per_s, threshold) {
        return Some(lo); // lo == 0 and above: every delta is
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if above(mid, dt_ns, bytes_per_s, threshold) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// Cutoffs per threshold for the `dt` last asked (streams are uniform: one computation per
/// interval change, not per delta).
#[derive(Debug, Clone)]
pub struct Cutoffs {
    bytes_per_s: f64,
    thresholds: Vec<f64>,
    dt: i64,
    cut: Vec<u64>,
}

impl Cutoffs {
    pub fn new(bytes_per_s: f64, thresholds: &[f64]) -> Self {
        Self {
            bytes_per_s,
            thresholds: thresholds.to_vec(),
            dt: 0,
            cut: vec![u64::MAX; thresholds.len()],
        }
    }

    /// Per threshold, the smallest delta that is above at `dt` (`u64::MAX` when none is; a delta
    /// of `u64::MAX` octets does not occur).
    pub fn at(&mut self, dt: i64) -> &[u64] {
        if dt != self.dt {
            self.dt = dt;
            for (c, t) in self.cut.iter_mut().zip(&self.thresholds) {
                *c = cutoff(dt, self.bytes_per_s, *t).unwrap_or(u64::MAX);
            }
        }
        &self.cut
    }

    pub fn thresholds(&self) -> usize {
        self.thresholds.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoff_is_exactly_where_the_expression_flips() {
        let bps = 100_000.0 * 1e6 / 8.0;
        for dt in [1, 7, 10_000, 10_001, 999_999, 1_000_000_000, 60_000_000_000] {
            for thr in [0.001, 50.0, 90.0, 92.5, 100.0, 130.0] {
                let c = cutoff(dt, bps, thr).unwrap();
                assert!(above(c, dt, bps, thr), "{dt} {thr} {c}");
                assert!(c == 0 || !above(c - 1, dt, bps, thr), "{dt} {thr} {c}");
            }
        }
        assert_eq!(cutoff(0, bps, 50.0), None);
    }

    /// Runs of a sequence, the slow way.
    fn naive(seq: &[(u64, bool)]) -> Seg {
        let mut s = Seg {
            n: seq.len() as u64,
            ..Seg::default()
        };
        let mut run = 0;
        for (dt, a) in seq {
            if *a {
                run += dt;
                s.above += dt;
                if run == *dt {
                    s.runs += 1;
                }
                s.longest = s.longest.max(run);
            } else {
                run = 0;
            }
        }
        s.tail = run;
        // head: the run starting at index 0.
        s.head = seq.iter().take_while(|x| x.1).map(|x| x.0).sum();
        s.full = !seq.is_empty() && seq.iter().all(|x| x.1);
        s
    }

    #[test]
    fn concatenation_equals_the_whole() {
        // Every split point of every pattern of 0..8 deltas.
        for len in 0..8usize {
            for bits in 0..(1u32 << len) {
                let seq: Vec<(u64, bool)> = (0..len)
                    .map(|i| (10 + i as u64, bits & (1 << i) != 0))
                    .collect();
                let whole = naive(&seq);
                for cut in 0..=len {
                    let a = seq[..cut]
                        .iter()
                        .fold(Seg::default(), |s, (dt, ab)| s.then(Seg::one(*dt, *ab)));
                    let b = naive(&seq[cut..]);
                    assert_eq!(naive(&seq[..cut]).then(b), whole, "{seq:?} at {cut}");
                    assert_eq!(a.then(b), whole);
                    let stored = Seg::from_parts(b.n, b.above, b.runs, b.head, b.tail, b.longest);
                    assert_eq!(stored, b, "full is implied by the stored parts");
                }
            }
        }
    }
}
