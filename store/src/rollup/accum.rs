//! The finest tier, from every sample: [`Accumulator`] (one per session) turns rows into
//! [`IntervalRow`]s; [`IntervalRow::absorb`] builds coarser tiers from finer rows.
//!
//! Definitions (what a delta is, which interval it belongs to, the entry delta, bursts, loss)
//! are in `store/ROLLUPS.md` §4; this file implements them twice — the general per-counter path
//! (any row: nulls, time going backwards, the first row of an interval) and the kernel
//! (`kernel.rs`) for runs of complete rows — and the tests hold the two equal.

use std::sync::Arc;

use super::{
    burst::{Cutoffs, Seg},
    config::BurstRule,
    kernel::{BurstCols, Cols, Kernel},
    plan::Plan,
};
use crate::batch::CounterBatch;

/// "No time": a figure without an occurrence.
pub const NO_TIME: i64 = i64::MIN;

/// One series' burst figures for one threshold over one interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThresholdRow {
    /// The inner deltas (entry excluded).
    pub inner: Seg,
    /// The entry delta's length if it was above, else 0.
    pub entry_above_ns: u64,
}

/// One series' burst figures over one interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesRow {
    /// The entry delta's length (0: no entry delta).
    pub entry_ns: u64,
    /// Per threshold, in configured order.
    pub thr: Vec<ThresholdRow>,
}

impl SeriesRow {
    fn new(thresholds: usize) -> Self {
        Self {
            entry_ns: 0,
            thr: vec![ThresholdRow::default(); thresholds],
        }
    }

    /// Inner deltas.
    pub fn deltas(&self) -> u64 {
        self.thr.first().map_or(0, |t| t.inner.n)
    }

    /// The entry delta as a segment for threshold `i` (empty when there is none).
    pub fn entry_seg(&self, i: usize) -> Seg {
        if self.entry_ns == 0 {
            Seg::default()
        } else {
            Seg::one(self.entry_ns, self.thr[i].entry_above_ns > 0)
        }
    }
}

/// One session's figures over one interval (all objects; per counter column `c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntervalRow {
    /// Interval start (a multiple of the interval since the epoch).
    pub start_ns: i64,
    pub first_ts: i64,
    pub last_ts: i64,
    pub samples: u64,
    pub lost: u64,
    /// `u64::MAX` / 0 when the interval has no delta.
    pub min_dt: u64,
    pub max_dt: u64,
    pub first: Vec<u64>,
    pub first_ok: Vec<bool>,
    pub last: Vec<u64>,
    pub last_ok: Vec<bool>,
    /// Counters: largest delta; levels: largest value. `hi_t == NO_TIME`: none (see
    /// [`IntervalRow::peak`]).
    pub hi: Vec<u64>,
    pub hi_t: Vec<i64>,
    pub lo: Vec<u64>,
    pub lo_t: Vec<i64>,
    /// Levels: sum of values.
    pub sum: Vec<u64>,
    /// Values that were null.
    pub nulls: Vec<u64>,
    /// Counters: deltas that went backwards.
    pub resets: Vec<u64>,
    pub series: Vec<SeriesRow>,
}

impl IntervalRow {
    fn empty(width: usize, series: usize, thresholds: usize, start_ns: i64) -> Self {
        Self {
            start_ns,
            first_ts: NO_TIME,
            last_ts: NO_TIME,
            samples: 0,
            lost: 0,
            min_dt: u64::MAX,
            max_dt: 0,
            first: vec![0; width],
            first_ok: vec![false; width],
            last: vec![0; width],
            last_ok: vec![false; width],
            hi: vec![0; width],
            hi_t: vec![NO_TIME; width],
            lo: vec![u64::MAX; width],
            lo_t: vec![NO_TIME; width],
            sum: vec![0; width],
            nulls: vec![0; width],
            resets: vec![0; width],
            series: vec![SeriesRow::new(thresholds); series],
        }
    }

    /// Counters per row.
    pub fn width(&self) -> usize {
        self.first.len()
    }

    /// Column `c`'s largest delta (counter) / value (level) and its time, if any.
    ///
    /// The kernels replace only on strictly greater (smaller), starting from 0 (`u64::MAX`),
    /// so an interval whose deltas are all 0 leaves no time on `hi` — then the minimum, also 0,
    /// has the first occurrence, which is the peak's too (and the mirror case for `lo`).
    pub fn peak(&self, c: usize) -> Option<(u64, i64)> {
        if self.hi_t[c] != NO_TIME {
            Some((self.hi[c], self.hi_t[c]))
        } else if self.lo_t[c] != NO_TIME {
            Some((0, self.lo_t[c]))
        } else {
            None
        }
    }

    /// Column `c`'s smallest delta / value and its time, if any (see [`IntervalRow::peak`]).
    pub fn trough(&self, c: usize) -> Option<(u64, i64)> {
        if self.lo_t[c] != NO_TIME {
            Some((self.lo[c], self.lo_t[c]))
        } else if self.hi_t[c] != NO_TIME {
            Some((u64::MAX, self.hi_t[c]))
        } else {
            None
        }
    }

    /// Values of column `c` present in the interval.
    pub fn count(&self, c: usize) -> u64 {
        self.samples - self.nulls[c]
    }

    /// Appends `b` (the next interval of the same session, a finer row of the same coarse
    /// interval): the coarse row is exactly what the samples of both give directly.
    ///
    /// # Panics
    /// If `b` has another width or series count.
    pub fn absorb(&mut self, b: &IntervalRow) {
        assert_eq!(self.width(), b.width(), "rows of one session");
        assert_eq!(self.series.len(), b.series.len(), "rows of one session");
        if b.samples == 0 {
            return;
        }
        if self.samples == 0 {
            let start = self.start_ns;
            *self = b.clone();
            self.start_ns = start;
            return;
        }
        self.last_ts = b.last_ts;
        self.samples += b.samples;
        self.lost += b.lost;
        self.min_dt = self.min_dt.min(b.min_dt);
        self.max_dt = self.max_dt.max(b.max_dt);
        self.last.copy_from_slice(&b.last);
        self.last_ok.copy_from_slice(&b.last_ok);
        for c in 0..self.width() {
            // Normalise "none" first so ties keep the earlier occurrence.
            let (a_hi, b_hi) = (self.peak(c), b.peak(c));
            let (a_lo, b_lo) = (self.trough(c), b.trough(c));
            if let Some((v, t)) = match (a_hi, b_hi) {
                (Some(a), Some(x)) => Some(if x.0 > a.0 { x } else { a }),
                (a, x) => a.or(x),
            } {
                self.hi[c] = v;
                self.hi_t[c] = t;
            }
            if let Some((v, t)) = match (a_lo, b_lo) {
                (Some(a), Some(x)) => Some(if x.0 < a.0 { x } else { a }),
                (a, x) => a.or(x),
            } {
                self.lo[c] = v;
                self.lo_t[c] = t;
            }
            self.sum[c] = self.sum[c].wrapping_add(b.sum[c]);
            self.nulls[c] += b.nulls[c];
            self.resets[c] += b.resets[c];
        }
        for (a, x) in self.series.iter_mut().zip(&b.series) {
            for i in 0..a.thr.len() {
                let e = x.entry_seg(i);
                a.thr[i].inner = a.thr[i].inner.then(e).then(x.thr[i].inner);
            }
        }
    }
}

/// Per series: the previous valid value and its time (the stream, across intervals).
#[derive(Debug, Clone, Default)]
struct SeriesPrev {
    v: Vec<u64>,
    t: Vec<i64>,
    ok: Vec<bool>,
}

/// The open interval's burst machines, `[threshold][series]` (structure of arrays, so the
/// complete-row path updates every series with vector operations).
#[derive(Debug, Clone, Default)]
struct BurstAcc {
    series: usize,
    /// Inner deltas per series taken by the general path; plus `fast_rows` for every series.
    n: Vec<u64>,
    fast_rows: u64,
    /// Scratch of the complete-row path: per series delta and "not backwards" mask.
    d: Vec<u64>,
    fwd: Vec<u64>,
    run: Vec<u64>,
    above: Vec<u64>,
    runs: Vec<u64>,
    longest: Vec<u64>,
    head: Vec<u64>,
    /// All ones while every inner delta so far was above.
    head_open: Vec<u64>,
    entry_ns: Vec<u64>,
    entry_above: Vec<u64>,
}

/// Scratch of the burst kernel for one run of rows: per row its gap and per threshold cutoff,
/// the series' deltas and "not backwards" masks (allocated once per session).
#[derive(Debug, Default)]
struct BurstScratch {
    /// Per series: its column.
    cols: Vec<i64>,
    dt: Vec<u64>,
    cut: Vec<u64>,
    d: Vec<u64>,
    fwd: Vec<u8>,
}

impl BurstScratch {
    fn new(plan: &Plan, thresholds: usize) -> Self {
        let strips = plan.series.len().div_ceil(8);
        Self {
            cols: plan.series.iter().map(|s| s.column as i64).collect(),
            dt: vec![0; CHUNK_ROWS],
            cut: vec![0; CHUNK_ROWS * thresholds],
            d: vec![0; CHUNK_ROWS * strips * 8],
            fwd: vec![0; CHUNK_ROWS * strips],
        }
    }
}

impl BurstAcc {
    fn new(series: usize, thresholds: usize) -> Self {
        let z = vec![0u64; series * thresholds];
        Self {
            series,
            n: vec![0; series],
            fast_rows: 0,
            d: vec![0; series],
            fwd: vec![0; series],
            run: z.clone(),
            above: z.clone(),
            runs: z.clone(),
            longest: z.clone(),
            head: z.clone(),
            head_open: vec![u64::MAX; series * thresholds],
            entry_ns: vec![0; series],
            entry_above: z,
        }
    }

    /// One inner delta of series `s` (`above[i]` per threshold).
    #[inline]
    fn inner(&mut self, s: usize, dt: u64, above: impl Fn(usize) -> bool, thresholds: usize) {
        self.n[s] += 1;
        for i in 0..thresholds {
            let k = i * self.series + s;
            let m = 0u64.wrapping_sub(u64::from(above(i)));
            let was = self.run[k] != 0;
            self.run[k] = (self.run[k] + dt) & m;
            self.above[k] += dt & m;
            self.runs[k] += u64::from(m != 0 && !was);
            self.longest[k] = self.longest[k].max(self.run[k]);
            self.head[k] += dt & m & self.head_open[k];
            self.head_open[k] &= m;
        }
    }

    /// One complete row of inner deltas for every series: `vals` the row's octet values,
    /// `prev` the series' previous values (updated), `cut` per threshold. Straight-line loops
    /// over the series (structure of arrays), so they vectorise.
    fn row(&mut self, vals: &[u64], prev: &mut [u64], dt: u64, cut: &[u64]) {
        let n = self.series;
        for (((d, f), v), p) in self
            .d
            .iter_mut()
            .zip(&mut self.fwd)
            .zip(vals)
            .zip(prev.iter_mut())
        {
            *d = v.wrapping_sub(*p);
            *f = 0u64.wrapping_sub(u64::from(*v >= *p));
            *p = *v;
        }
        for (i, &c) in cut.iter().enumerate() {
            let r = i * n..(i + 1) * n;
            let it = self.run[r.clone()]
                .iter_mut()
                .zip(&mut self.above[r.clone()])
                .zip(&mut self.runs[r.clone()])
                .zip(&mut self.longest[r.clone()])
                .zip(&mut self.head[r.clone()])
                .zip(&mut self.head_open[r])
                .zip(self.d.iter().zip(&self.fwd));
            for ((((((run, above), runs), longest), head), open), (d, f)) in it {
                let m = f & 0u64.wrapping_sub(u64::from(*d >= c));
                *runs += m & u64::from(*run == 0) & 1;
                *run = (*run + dt) & m;
                *above += dt & m;
                *longest = (*longest).max(*run);
                *head += dt & m & *open;
                *open &= m;
            }
        }
        self.fast_rows += 1;
    }

    fn finish(&self, out: &mut [SeriesRow]) {
        for (s, row) in out.iter_mut().enumerate() {
            row.entry_ns = self.entry_ns[s];
            for (i, t) in row.thr.iter_mut().enumerate() {
                let k = i * self.series + s;
                t.inner = Seg::from_parts(
                    self.n[s] + self.fast_rows,
                    self.above[k],
                    self.runs[k],
                    self.head[k],
                    self.run[k],
                    self.longest[k],
                );
                t.entry_above_ns = self.entry_above[k];
            }
        }
    }
}

/// The open interval.
#[derive(Debug)]
struct Open {
    k: i64,
    row: IntervalRow,
    bursts: BurstAcc,
    /// Validity of the last row processed (`None`: all valid).
    last_valid: Option<Vec<bool>>,
}

/// Which values of a row are present.
#[derive(Debug, Clone, Copy)]
enum Valid<'a> {
    All,
    /// A decoder batch's part masks and the mask of a complete row.
    Masks(&'a [u32], u32),
    /// Per value, row-major.
    Bits(&'a [bool]),
}

/// Rows to take: times, row-major values, validity.
#[derive(Debug)]
struct Rows<'a> {
    ts: &'a [i64],
    values: &'a [u64],
    valid: Valid<'a>,
}

impl Rows<'_> {
    fn complete(&self, r: usize, w: usize) -> bool {
        match self.valid {
            Valid::All => true,
            Valid::Masks(m, full) => m[r] & full == full,
            Valid::Bits(b) => b[r * w..(r + 1) * w].iter().all(|x| *x),
        }
    }

    fn validity(&self, r: usize, w: usize, part_of: &[u8]) -> Vec<bool> {
        match self.valid {
            Valid::All => vec![true; w],
            Valid::Masks(m, _) => (0..w).map(|c| m[r] & (1 << part_of[c]) != 0).collect(),
            Valid::Bits(b) => b[r * w..(r + 1) * w].to_vec(),
        }
    }
}

/// Rows of one complete-row run are handed to the kernel in chunks of this many: the chunk
/// (240 KB at the design session) and the next one, which the kernel prefetches, stay in L2 for
/// the burst pass that follows.
const CHUNK_ROWS: usize = 16;

/// One session's finest-tier state: the previous sample of every counter and the open
/// interval. Owned by one thread; rows must come in arrival order.
#[derive(Debug)]
pub struct Accumulator {
    plan: Arc<Plan>,
    interval_ns: i64,
    thresholds: usize,
    cut: Cutoffs,
    kernel: Kernel,
    level_mask: Vec<u64>,
    /// Counter column → template part.
    part_of: Vec<u8>,
    prev_ts: Option<i64>,
    /// Smallest gap between snapshots seen so far (the stream interval).
    nominal: u64,
    prev: Vec<u64>,
    prev_ok: Vec<bool>,
    /// Per column time of `prev`; only kept up to date while `prev_t_all` is `None`.
    prev_t: Vec<i64>,
    /// `Some(t)`: every column's previous value is from the row at `t` (after complete rows).
    prev_t_all: Option<i64>,
    /// Columns whose previous value is missing.
    prev_missing: usize,
    sprev: SeriesPrev,
    open: Option<Open>,
    /// Scratch for the burst pass.
    vals: Vec<u64>,
    bscratch: BurstScratch,
    /// Tests: every row through the general path (the reference the kernel path must match).
    general_only: bool,
}

impl Accumulator {
    /// The finest tier of `plan`'s session at `interval_ns`, bursts by `rule`.
    pub fn new(plan: Arc<Plan>, interval_ns: i64, rule: &BurstRule) -> Self {
        Self::with_kernel(plan, interval_ns, rule, Kernel::detect())
    }

    pub(crate) fn with_kernel(
        plan: Arc<Plan>,
        interval_ns: i64,
        rule: &BurstRule,
        kernel: Kernel,
    ) -> Self {
        let w = plan.width();
        let schema = &plan.schema;
        let part_of = (0..w)
            .map(|c| {
                schema
                    .part_offsets
                    .partition_point(|&off| off <= c)
                    .saturating_sub(1) as u8
            })
            .collect();
        let ns = plan.series.len();
        Self {
            level_mask: plan
                .level
                .iter()
                .map(|l| if *l { u64::MAX } else { 0 })
                .collect(),
            interval_ns,
            thresholds: rule.thresholds.len(),
            cut: Cutoffs::new(rule.bytes_per_s, &rule.thresholds),
            kernel,
            part_of,
            prev_ts: None,
            nominal: u64::MAX,
            prev: vec![0; w],
            prev_ok: vec![false; w],
            prev_t: vec![NO_TIME; w],
            prev_t_all: None,
            prev_missing: w,
            sprev: SeriesPrev {
                v: vec![0; ns],
                t: vec![NO_TIME; ns],
                ok: vec![false; ns],
            },
            open: None,
            vals: vec![0; ns],
            bscratch: BurstScratch::new(&plan, rule.thresholds.len()),
            general_only: false,
            plan,
        }
    }

    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// The kernel in use (`avx512`, `avx2`, `scalar`).
    pub fn kernel_name(&self) -> &'static str {
        self.kernel.name()
    }

    /// Takes every row of `batch` (whose schema is this plan's), calling `done` with each
    /// interval that closes.
    pub fn push(&mut self, batch: &CounterBatch, done: &mut dyn FnMut(IntervalRow)) {
        let valid = if batch.part_masks.is_empty() {
            Valid::All
        } else {
            let parts = batch.schema.parts().max(1);
            let full = if parts >= 32 {
                u32::MAX
            } else {
                (1u32 << parts) - 1
            };
            Valid::Masks(&batch.part_masks, full)
        };
        self.push_view(
            &Rows {
                ts: &batch.ts,
                values: &batch.values,
                valid,
            },
            done,
        );
    }

    /// Takes rows given as row-major `values` at times `ts`, with (optionally) per-value
    /// validity, row-major like `values` (what a raw Parquet file's nulls say).
    ///
    /// # Panics
    /// If the lengths do not match the plan's width.
    pub fn push_rows(
        &mut self,
        ts: &[i64],
        values: &[u64],
        valid: Option<&[bool]>,
        done: &mut dyn FnMut(IntervalRow),
    ) {
        let w = self.plan.width();
        assert_eq!(values.len(), ts.len() * w, "rows of the plan's width");
        if let Some(v) = valid {
            assert_eq!(v.len(), values.len(), "one validity per value");
        }
        self.push_view(
            &Rows {
                ts,
                values,
                valid: valid.map_or(Valid::All, Valid::Bits),
            },
            done,
        );
    }

    fn push_view(&mut self, v: &Rows<'_>, done: &mut dyn FnMut(IntervalRow)) {
        let w = self.plan.width();
        let rows = v.ts.len();
        let mut r = 0;
        while r < rows {
            // A run for the kernel: complete rows after a complete row, strictly rising time,
            // inside the open interval, every series past its entry.
            let fast = self.fast_ready()
                && v.complete(r, w)
                && self.prev_ts.is_some_and(|p| v.ts[r] > p)
                && self
                    .open
                    .as_ref()
                    .is_some_and(|o| v.ts[r].div_euclid(self.interval_ns) == o.k);
            if !fast {
                let t = v.ts[r];
                let row = &v.values[r * w..(r + 1) * w];
                if v.complete(r, w) {
                    self.general(t, row, None, done);
                } else {
                    let valid = v.validity(r, w, &self.part_of);
                    self.general(t, row, Some(valid), done);
                }
                r += 1;
                continue;
            }
            let k = self.open.as_ref().map_or(0, |o| o.k);
            let end_t = (k + 1).saturating_mul(self.interval_ns);
            let mut e = r + 1;
            while e < rows
                && e - r < CHUNK_ROWS
                && v.complete(e, w)
                && v.ts[e] > v.ts[e - 1]
                && v.ts[e] < end_t
            {
                e += 1;
            }
            self.run(v, r, e);
            r = e;
        }
    }

    /// Whether the next complete row may take the kernel path.
    fn fast_ready(&self) -> bool {
        !self.general_only && self.prev_missing == 0 && self.prev_t_all.is_some()
    }

    /// Rows `r0..r1` of `batch`: complete, rising, inside the open interval, after a complete
    /// row of it.
    fn run(&mut self, v: &Rows<'_>, r0: usize, r1: usize) {
        let w = self.plan.width();
        let Some(o) = self.open.as_mut() else { return };
        let ts = &v.ts[r0..r1];
        let mut pt = self.prev_ts.unwrap_or(ts[0]);
        // Row-level figures and the gap accounting.
        for &t in ts {
            let dt = (t - pt) as u64;
            note_gap(&mut self.nominal, &mut o.row, dt);
            pt = t;
        }
        let mut rows: [&[u64]; CHUNK_ROWS] = [&[]; CHUNK_ROWS];
        for (slot, i) in rows.iter_mut().zip(r0..r1) {
            *slot = &v.values[i * w..(i + 1) * w];
        }
        let rows = &rows[..r1 - r0];
        let row = &mut o.row;
        let n = v.values.len();
        let mut cols = Cols {
            prev: &mut self.prev,
            hi: &mut row.hi,
            hi_t: &mut row.hi_t,
            lo: &mut row.lo,
            lo_t: &mut row.lo_t,
            sum: &mut row.sum,
            resets: &mut row.resets,
            level: &self.level_mask,
            next: &v.values[(r1 * w).min(n)..((r1 + CHUNK_ROWS) * w).min(n)],
        };
        self.kernel.run(rows, ts, 0, w, &mut cols);
        // Bursts after the kernel (which streams every line of the run into cache; the series
        // keep their own previous values).
        let nser = self.plan.series.len();
        if nser > 0 {
            let mut pt = self.prev_ts.unwrap_or(ts[0]);
            if self.kernel.has_bursts() {
                let th = self.thresholds;
                let sc = &mut self.bscratch;
                for (i, &t) in ts.iter().enumerate() {
                    sc.dt[i] = (t - pt) as u64;
                    sc.cut[i * th..(i + 1) * th].copy_from_slice(self.cut.at(t - pt));
                    pt = t;
                }
                let b = &mut o.bursts;
                self.kernel.bursts(
                    rows,
                    &sc.dt,
                    &sc.cut,
                    th,
                    &mut BurstCols {
                        cols: &sc.cols,
                        prev: &mut self.sprev.v,
                        run: &mut b.run,
                        above: &mut b.above,
                        runs: &mut b.runs,
                        longest: &mut b.longest,
                        head: &mut b.head,
                        open: &mut b.head_open,
                        d: &mut sc.d,
                        fwd: &mut sc.fwd,
                    },
                );
                b.fast_rows += rows.len() as u64;
            } else {
                for (&row, &t) in rows.iter().zip(ts) {
                    for (v, s) in self.vals.iter_mut().zip(&self.plan.series) {
                        *v = row[s.column];
                    }
                    let dt = t - pt;
                    let cut = self.cut.at(dt);
                    o.bursts.row(&self.vals, &mut self.sprev.v, dt as u64, cut);
                    pt = t;
                }
            }
            let last = *ts.last().unwrap_or(&pt);
            self.sprev.t.fill(last);
        }
        let last = ts[ts.len() - 1];
        o.row.samples += ts.len() as u64;
        o.row.last_ts = last;
        o.last_valid = None;
        self.prev_ts = Some(last);
        self.prev_t_all = Some(last);
    }

    /// One row the general way (`valid`: per column, `None` = all present).
    fn general(
        &mut self,
        t: i64,
        row_in: &[u64],
        valid: Option<Vec<bool>>,
        done: &mut dyn FnMut(IntervalRow),
    ) {
        let w = self.plan.width();
        let k = t.div_euclid(self.interval_ns);
        if self.open.as_ref().is_some_and(|o| o.k != k) {
            self.close(done);
        }
        if self.open.is_none() {
            let mut row = IntervalRow::empty(
                w,
                self.plan.series.len(),
                self.thresholds,
                k.saturating_mul(self.interval_ns),
            );
            row.first_ts = t;
            row.first.copy_from_slice(&row_in[..w]);
            match &valid {
                None => row.first_ok.fill(true),
                Some(v) => row.first_ok.copy_from_slice(v),
            }
            self.open = Some(Open {
                k,
                row,
                bursts: BurstAcc::new(self.plan.series.len(), self.thresholds),
                last_valid: None,
            });
        }
        if let Some(all) = self.prev_t_all.take() {
            self.prev_t.fill(all);
        }
        let Some(o) = self.open.as_mut() else { return };
        let forward = self.prev_ts.is_none_or(|p| t > p);
        if let Some(p) = self.prev_ts.filter(|_| forward) {
            note_gap(&mut self.nominal, &mut o.row, (t - p) as u64);
        }
        let ok = |c: usize| valid.as_ref().is_none_or(|v| v[c]);
        let r = &mut o.row;
        #[expect(
            clippy::needless_range_loop,
            reason = "column c indexes the row and a dozen per-column arrays"
        )]
        for c in 0..w {
            if !ok(c) {
                r.nulls[c] += 1;
                continue;
            }
            let v = row_in[c];
            let level = self.level_mask[c] != 0;
            let x = if level {
                Some(v)
            } else if self.prev_ok[c] && t > self.prev_t[c] {
                if v < self.prev[c] {
                    r.resets[c] += 1;
                    None
                } else {
                    Some(v - self.prev[c])
                }
            } else {
                None
            };
            if let Some(x) = x {
                if x > r.hi[c] {
                    r.hi[c] = x;
                    r.hi_t[c] = t;
                }
                if x < r.lo[c] {
                    r.lo[c] = x;
                    r.lo_t[c] = t;
                }
                if level {
                    r.sum[c] = r.sum[c].wrapping_add(v);
                }
            }
            if !self.prev_ok[c] {
                self.prev_ok[c] = true;
                self.prev_missing -= 1;
            }
            self.prev[c] = v;
            self.prev_t[c] = t;
        }
        let start = r.start_ns;
        for (s, ser) in self.plan.series.iter().enumerate() {
            if !ok(ser.column) {
                continue;
            }
            let v = row_in[ser.column];
            let sp = &mut self.sprev;
            if sp.ok[s] && t > sp.t[s] {
                let dt = t - sp.t[s];
                let back = v < sp.v[s];
                let d = v.wrapping_sub(sp.v[s]);
                let cut = self.cut.at(dt);
                let b = &mut o.bursts;
                if sp.t[s] < start {
                    b.entry_ns[s] = dt as u64;
                    for (i, c) in cut.iter().enumerate() {
                        b.entry_above[i * b.series + s] =
                            if !back && d >= *c { dt as u64 } else { 0 };
                    }
                } else {
                    b.inner(s, dt as u64, |i| !back && d >= cut[i], self.thresholds);
                }
            }
            sp.v[s] = v;
            sp.t[s] = t;
            sp.ok[s] = true;
        }
        r.samples += 1;
        r.last_ts = t;
        // Time going back: the stream continues from this row all the same (as on raw).
        self.prev_ts = Some(t);
        let complete = valid.is_none();
        o.last_valid = valid;
        if complete && self.prev_missing == 0 && forward {
            self.prev_t_all = Some(t);
        }
    }

    /// Closes the open interval (if any) and hands it to `done`.
    pub fn close(&mut self, done: &mut dyn FnMut(IntervalRow)) {
        let Some(mut o) = self.open.take() else {
            return;
        };
        let r = &mut o.row;
        r.last.copy_from_slice(&self.prev);
        match &o.last_valid {
            None => r.last_ok.fill(true),
            Some(v) => r.last_ok.copy_from_slice(v),
        }
        o.bursts.finish(&mut r.series);
        done(o.row);
    }

    /// Closes the open interval if time `now_ns` (switch time of the newest data anywhere) is
    /// past its end: a session that stopped sending still gets its last interval written.
    pub fn close_if_before(&mut self, now_ns: i64, done: &mut dyn FnMut(IntervalRow)) {
        if self
            .open
            .as_ref()
            .is_some_and(|o| (o.k + 1).saturating_mul(self.interval_ns) <= now_ns)
        {
            self.close(done);
        }
    }
}

/// Row-level figures of one gap: `min_dt`/`max_dt` and the snapshots it lost.
fn note_gap(nominal: &mut u64, row: &mut IntervalRow, dt: u64) {
    if dt == 0 {
        return;
    }
    *nominal = (*nominal).min(dt);
    row.min_dt = row.min_dt.min(dt);
    row.max_dt = row.max_dt.max(dt);
    let n = *nominal;
    if dt.saturating_mul(2) > n.saturating_mul(3) {
        row.lost += (dt + n / 2) / n - 1;
    }
}

#[cfg(test)]
mod tests;
