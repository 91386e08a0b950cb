//! The per-sample work of the finest tier, over runs of complete rows: the one module of
//! `stel::rollup` allowed `unsafe` (crate lint: `deny(unsafe_code)`), for runtime dispatch and
//! the AVX-512 intrinsics.
//!
//! Per counter and row: the delta from the previous row, whether it went backwards (reset or
//! wrap), and — branch-free — the interval's largest and smallest delta (levels: value) with the
//! time of the first occurrence, the levels' sum and the counters' reset count. The kernel walks
//! a strip of eight columns down a run of rows with the strip's state in registers.
//!
//! The portable body is one generic function over `[u64; 8]` lanes, compiled for AVX2 or for the
//! baseline target. The AVX-512 (F + VL) kernel is written with intrinsics and does less per
//! value: per row and strip one load, a subtract, an unsigned compare into a mask register (any
//! counter going backwards) and an unsigned max and min; the times of new extremes are found
//! afterwards by a second look at the (cached) run only where an extreme moved, and a run in
//! which a counter went backwards is redone by the portable body. It also runs the burst
//! machines ([`Kernel::bursts`]): a gather of the run's octet series per row, then per
//! threshold the run/above/longest/head figures with masked adds, eight series per register.
//! Chosen once at run time ([`Kernel::detect`], `is_x86_feature_detected!`), never a `native`
//! build. The `unsafe` is calling `#[target_feature]` functions after that check and the
//! intrinsics' pointer loads and stores (each within a slice, bounds checked or masked).

/// Columns per strip.
pub(crate) const LANES: usize = 8;

/// The open interval's per-column state the kernel updates (all slices are the session's
/// width; only columns `c0..c1` are touched).
#[derive(Debug)]
pub(crate) struct Cols<'a> {
    /// Previous row's values; the run's last row on return.
    pub prev: &'a mut [u64],
    /// Counters: largest delta; levels: largest value (strictly greater replaces: the first
    /// occurrence wins). Starts at 0.
    pub hi: &'a mut [u64],
    pub hi_t: &'a mut [i64],
    /// Smallest delta / value (strictly smaller replaces). Starts at `u64::MAX`.
    pub lo: &'a mut [u64],
    pub lo_t: &'a mut [i64],
    /// Levels: sum of values (wrapping).
    pub sum: &'a mut [u64],
    /// Counters: deltas that went backwards.
    pub resets: &'a mut [u64],
    /// `u64::MAX` for a level, 0 for a counter.
    pub level: &'a [u64],
    /// The values that follow the run (the next run of the batch): the AVX-512 kernel streams
    /// them into L2 while it works on this one (a hint; may be empty).
    pub next: &'a [u64],
}

/// The burst machines' state over a run of complete rows (`[threshold][series]` for the
/// per-threshold arrays, like `accum::BurstAcc`).
#[derive(Debug)]
pub(crate) struct BurstCols<'a> {
    /// Per series: its column in a row.
    pub cols: &'a [i64],
    /// Per series: the previous value; the run's last row on return.
    pub prev: &'a mut [u64],
    pub run: &'a mut [u64],
    pub above: &'a mut [u64],
    pub runs: &'a mut [u64],
    pub longest: &'a mut [u64],
    pub head: &'a mut [u64],
    /// All ones while every inner delta so far was above.
    pub open: &'a mut [u64],
    /// Scratch: `rows × series.div_ceil(8) × 8` deltas and `rows × series.div_ceil(8)` masks.
    pub d: &'a mut [u64],
    pub fwd: &'a mut [u8],
}

/// The kernel this CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kernel(Isa);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

impl Kernel {
    /// The best kernel the CPU supports (checked at run time).
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl")
            {
                return Self(Isa::Avx512);
            }
            if std::is_x86_feature_detected!("avx2") {
                return Self(Isa::Avx2);
            }
        }
        Self(Isa::Scalar)
    }

    /// Every kernel this CPU can run, best first (tests compare them).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Self> {
        let mut v = vec![Self::detect()];
        if v[0].0 == Isa::Avx512 {
            v.push(Self(Isa::Avx2));
        }
        if v[0].0 != Isa::Scalar {
            v.push(Self(Isa::Scalar));
        }
        v
    }

    /// `avx512`, `avx2` or `scalar`.
    pub(crate) fn name(self) -> &'static str {
        match self.0 {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Runs rows `rows` (each at least `c1` long, at times `ts`, strictly after the previous
    /// row and each other, every value present) over columns `c0..c1` of `st`.
    ///
    /// # Panics
    /// If `rows` and `ts` differ in length or a row or state slice is shorter than `c1`.
    pub(crate) fn run(self, rows: &[&[u64]], ts: &[i64], c0: usize, c1: usize, st: &mut Cols<'_>) {
        assert_eq!(rows.len(), ts.len(), "one time per row");
        for r in rows {
            assert!(r.len() >= c1, "row shorter than the columns asked");
        }
        match self.0 {
            Isa::Scalar => run_generic(rows, ts, c0, c1, st),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only constructed by `detect()` after
            // `is_x86_feature_detected!("avx2")` returned true.
            Isa::Avx2 => unsafe { x86::run_avx2(rows, ts, c0, c1, st) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only constructed by `detect()` after it checked avx512f
            // and avx512vl with `is_x86_feature_detected!`.
            Isa::Avx512 => unsafe { x86::run_avx512(rows, ts, c0, c1, st) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => run_generic(rows, ts, c0, c1, st),
        }
    }
}

impl Kernel {
    /// Whether [`Kernel::bursts`] runs here (AVX-512); otherwise the accumulator's portable
    /// row loop does.
    pub(crate) fn has_bursts(self) -> bool {
        self.0 == Isa::Avx512
    }

    /// The burst machines over rows `rows` (complete, strictly rising, every delta inner): `dt`
    /// per row, `cut` per row and threshold (`[row][threshold]`, `thresholds` per row).
    /// Returns false (and does nothing) when this kernel has no burst pass.
    ///
    /// # Panics
    /// If a slice is shorter than the rows, series and thresholds ask, or a series column lies
    /// outside a row.
    pub(crate) fn bursts(
        self,
        rows: &[&[u64]],
        dt: &[u64],
        cut: &[u64],
        thresholds: usize,
        b: &mut BurstCols<'_>,
    ) -> bool {
        let n = b.prev.len();
        let strips = n.div_ceil(LANES);
        assert!(dt.len() >= rows.len() && cut.len() >= rows.len() * thresholds);
        assert!(b.cols.len() == n && b.d.len() >= rows.len() * strips * LANES);
        assert!(b.fwd.len() >= rows.len() * strips);
        for a in [
            &*b.run,
            &*b.above,
            &*b.runs,
            &*b.longest,
            &*b.head,
            &*b.open,
        ] {
            assert!(
                a.len() >= n * thresholds,
                "one figure per series and threshold"
            );
        }
        let need = b
            .cols
            .iter()
            .map(|&c| usize::try_from(c).map_or(usize::MAX, |c| c + 1));
        let need = need.max().unwrap_or(0);
        assert!(
            rows.iter().all(|r| r.len() >= need),
            "series column outside the row"
        );
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                // SAFETY: `Isa::Avx512` is only constructed by `detect()` after it checked
                // avx512f and avx512vl with `is_x86_feature_detected!`; the series columns lie
                // inside every row (checked above).
                unsafe { x86::bursts_avx512(rows, dt, cut, thresholds, b) };
                true
            }
            _ => false,
        }
    }
}

/// Whole strips of [`LANES`] columns, then the remaining columns one at a time.
#[inline(always)]
fn run_generic(rows: &[&[u64]], ts: &[i64], c0: usize, c1: usize, st: &mut Cols<'_>) {
    let mut c = c0;
    while c + LANES <= c1 {
        strip::<LANES>(rows, ts, c, st);
        c += LANES;
    }
    while c < c1 {
        strip::<1>(rows, ts, c, st);
        c += 1;
    }
}

/// One strip of `L` columns from `c` down every row, its state in registers.
#[inline(always)]
fn strip<const L: usize>(rows: &[&[u64]], ts: &[i64], c: usize, st: &mut Cols<'_>) {
    let load = |s: &[u64]| -> [u64; L] {
        let mut a = [0u64; L];
        a.copy_from_slice(&s[c..c + L]);
        a
    };
    let load_i = |s: &[i64]| -> [i64; L] {
        let mut a = [0i64; L];
        a.copy_from_slice(&s[c..c + L]);
        a
    };
    let mut p = load(st.prev);
    let mut hi = load(st.hi);
    let mut hi_t = load_i(st.hi_t);
    let mut lo = load(st.lo);
    let mut lo_t = load_i(st.lo_t);
    let mut sum = load(st.sum);
    let mut resets = load(st.resets);
    let lvl = load(st.level);
    for (row, &t) in rows.iter().zip(ts) {
        let v: &[u64] = &row[c..c + L];
        for j in 0..L {
            let x_d = v[j].wrapping_sub(p[j]);
            // Mask arithmetic (all ones / zero) so every lane does the same work.
            let back = 0u64.wrapping_sub(u64::from(v[j] < p[j]));
            let x = (v[j] & lvl[j]) | (x_d & !lvl[j]);
            let ok = lvl[j] | !back;
            let gt = ok & 0u64.wrapping_sub(u64::from(x > hi[j]));
            hi[j] = (x & gt) | (hi[j] & !gt);
            hi_t[j] = (t & gt as i64) | (hi_t[j] & !gt as i64);
            let lt = ok & 0u64.wrapping_sub(u64::from(x < lo[j]));
            lo[j] = (x & lt) | (lo[j] & !lt);
            lo_t[j] = (t & lt as i64) | (lo_t[j] & !lt as i64);
            sum[j] = sum[j].wrapping_add(v[j] & lvl[j]);
            resets[j] = resets[j].wrapping_add(back & !lvl[j] & 1);
            p[j] = v[j];
        }
    }
    st.prev[c..c + L].copy_from_slice(&p);
    st.hi[c..c + L].copy_from_slice(&hi);
    st.hi_t[c..c + L].copy_from_slice(&hi_t);
    st.lo[c..c + L].copy_from_slice(&lo);
    st.lo_t[c..c + L].copy_from_slice(&lo_t);
    st.sum[c..c + L].copy_from_slice(&sum);
    st.resets[c..c + L].copy_from_slice(&resets);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m512i, __mmask8, _mm512_cmpgt_epu64_mask, _mm512_cmplt_epu64_mask, _mm512_loadu_epi64,
        _mm512_mask_add_epi64, _mm512_mask_blend_epi64, _mm512_mask_cmpeq_epu64_mask,
        _mm512_mask_cmpge_epu64_mask, _mm512_mask_cmplt_epu64_mask, _mm512_mask_i64gather_epi64,
        _mm512_mask_mov_epi64, _mm512_mask_storeu_epi64, _mm512_maskz_add_epi64,
        _mm512_maskz_loadu_epi64, _mm512_maskz_mov_epi64, _mm512_max_epu64, _mm512_min_epu64,
        _mm512_set1_epi64, _mm512_setzero_si512, _mm512_storeu_epi64, _mm512_sub_epi64,
        _mm512_test_epi64_mask, _mm_prefetch, _MM_HINT_T0, _MM_HINT_T1,
    };

    use super::{run_generic, strip, BurstCols, Cols, LANES};

    /// Eight lanes of `s` from `i` (lanes past the end read as 0).
    macro_rules! load {
        ($s:expr, $i:expr) => {{
            let s = &$s[$i..];
            let k = lanes(s.len());
            // SAFETY: the mask covers only lanes inside `s`; masked-off lanes are not read.
            unsafe { _mm512_maskz_loadu_epi64(k, s.as_ptr().cast()) }
        }};
    }
    /// Eight whole lanes of `s` from `i` (bounds checked).
    macro_rules! load8 {
        ($s:expr, $i:expr) => {{
            let s = &$s[$i..$i + LANES];
            // SAFETY: `s` is eight values long.
            unsafe { _mm512_loadu_epi64(s.as_ptr().cast()) }
        }};
    }
    /// Stores eight whole lanes into `s` from `i` (bounds checked).
    macro_rules! store8 {
        ($s:expr, $i:expr, $v:expr) => {{
            let s = &mut $s[$i..$i + LANES];
            // SAFETY: `s` is eight values long.
            unsafe { _mm512_storeu_epi64(s.as_mut_ptr().cast(), $v) }
        }};
    }
    /// Stores the lanes of `v` that lie inside `s` from `i`.
    macro_rules! store {
        ($s:expr, $i:expr, $v:expr) => {{
            let s = &mut $s[$i..];
            let k = lanes(s.len());
            // SAFETY: the mask covers only lanes inside `s`; masked-off lanes are not written.
            unsafe { _mm512_mask_storeu_epi64(s.as_mut_ptr().cast(), k, $v) }
        }};
    }

    /// How far ahead (columns, in the same row) the strip kernel prefetches: four strips, a
    /// few hundred cycles before it loads them.
    const PREFETCH: usize = 4 * LANES;

    /// The lane mask of the first `n` lanes (all eight from 8 on).
    #[inline(always)]
    fn lanes(n: usize) -> __mmask8 {
        if n >= LANES {
            0xff
        } else {
            (1u8 << n) - 1
        }
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) fn run_avx2(rows: &[&[u64]], ts: &[i64], c0: usize, c1: usize, st: &mut Cols<'_>) {
        run_generic(rows, ts, c0, c1, st);
    }

    /// # Safety
    /// The CPU must support AVX-512 F and VL.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) fn run_avx512(rows: &[&[u64]], ts: &[i64], c0: usize, c1: usize, st: &mut Cols<'_>) {
        let mut c = c0;
        // Bytes of `st.next` prefetched so far: one line per row and strip, in address order.
        let mut pf = 0;
        while c + LANES <= c1 {
            strip512(rows, ts, c, st, &mut pf);
            c += LANES;
        }
        while c < c1 {
            strip::<1>(rows, ts, c, st);
            c += 1;
        }
    }

    /// One strip of eight columns from `c` down every row.
    #[target_feature(enable = "avx512f,avx512vl")]
    fn strip512(rows: &[&[u64]], ts: &[i64], c: usize, st: &mut Cols<'_>, pf: &mut usize) {
        let next = st.next.as_ptr().cast::<u8>();
        let next_len = std::mem::size_of_val(st.next);
        let p0 = load8!(st.prev, c);
        let hi0 = load8!(st.hi, c);
        let lo0 = load8!(st.lo, c);
        let lv = load8!(st.level, c);
        let lvl: __mmask8 = _mm512_test_epi64_mask(lv, lv);
        let (mut p, mut hi, mut lo) = (p0, hi0, lo0);
        // Lanes where a counter went backwards somewhere in the run.
        let mut back: __mmask8 = 0;
        if lvl == 0 {
            for row in rows {
                let v = load8!(row, c);
                // This row's line `PREFETCH` columns on, and the next line of the next run
                // (hints; never dereferenced).
                _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(c + PREFETCH).cast());
                if *pf < next_len {
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(*pf).cast());
                    *pf += 64;
                }
                back |= _mm512_cmplt_epu64_mask(v, p);
                let d = _mm512_sub_epi64(v, p);
                hi = _mm512_max_epu64(hi, d);
                lo = _mm512_min_epu64(lo, d);
                p = v;
            }
        } else {
            let mut sum = load8!(st.sum, c);
            for row in rows {
                let v = load8!(row, c);
                _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(c + PREFETCH).cast());
                if *pf < next_len {
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(*pf).cast());
                    *pf += 64;
                }
                back |= _mm512_mask_cmplt_epu64_mask(!lvl, v, p);
                let x = _mm512_mask_blend_epi64(lvl, _mm512_sub_epi64(v, p), v);
                hi = _mm512_max_epu64(hi, x);
                lo = _mm512_min_epu64(lo, x);
                sum = _mm512_mask_add_epi64(sum, lvl, sum, v);
                p = v;
            }
            if back == 0 {
                store8!(st.sum, c, sum);
            }
        }
        if back != 0 {
            // A reset or wrap in this run (rare): the portable body, from the state as it was.
            strip::<LANES>(rows, ts, c, st);
            return;
        }
        // Where an extreme moved (strictly), its time is the first row that reaches it.
        let (mut up, mut down) = (
            _mm512_cmpgt_epu64_mask(hi, hi0),
            _mm512_cmplt_epu64_mask(lo, lo0),
        );
        if up | down != 0 {
            let mut hi_t = load8!(st.hi_t, c);
            let mut lo_t = load8!(st.lo_t, c);
            let mut q = p0;
            for (row, &t) in rows.iter().zip(ts) {
                let v = load8!(row, c);
                let x = _mm512_mask_blend_epi64(lvl, _mm512_sub_epi64(v, q), v);
                let tv = _mm512_set1_epi64(t);
                let f = _mm512_mask_cmpeq_epu64_mask(up, x, hi);
                hi_t = _mm512_mask_mov_epi64(hi_t, f, tv);
                up &= !f;
                let g = _mm512_mask_cmpeq_epu64_mask(down, x, lo);
                lo_t = _mm512_mask_mov_epi64(lo_t, g, tv);
                down &= !g;
                if up | down == 0 {
                    break;
                }
                q = v;
            }
            store8!(st.hi_t, c, hi_t);
            store8!(st.lo_t, c, lo_t);
        }
        store8!(st.prev, c, p);
        store8!(st.hi, c, hi);
        store8!(st.lo, c, lo);
    }

    /// The burst pass (see [`super::Kernel::bursts`], which checked the slices).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and VL; every `b.cols` entry must index inside every row.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn bursts_avx512(
        rows: &[&[u64]],
        dt: &[u64],
        cut: &[u64],
        thresholds: usize,
        b: &mut BurstCols<'_>,
    ) {
        let n = b.prev.len();
        let strips = n.div_ceil(LANES);
        let zero = _mm512_setzero_si512();
        // Deltas and "not backwards" masks of the run, per row and strip of eight series.
        for k in 0..strips {
            let s = k * LANES;
            let m = lanes(n - s);
            let idx = load!(b.cols, s);
            let mut p = load!(b.prev, s);
            for (r, row) in rows.iter().enumerate() {
                // SAFETY: the caller guarantees every column indexes inside the row; masked-off
                // lanes are not read.
                let v =
                    unsafe { _mm512_mask_i64gather_epi64::<8>(zero, m, idx, row.as_ptr().cast()) };
                b.fwd[r * strips + k] = _mm512_mask_cmpge_epu64_mask(m, v, p);
                store8!(b.d, (r * strips + k) * LANES, _mm512_sub_epi64(v, p));
                p = v;
            }
            store!(b.prev, s, p);
        }
        let one = _mm512_set1_epi64(1);
        for i in 0..thresholds {
            for k in 0..strips {
                let o = i * n + k * LANES;
                // Lanes past the series (the last strip's tail) are neither read nor stored.
                let lim = (i + 1) * n;
                let mut run = load!(b.run[..lim], o);
                let mut above = load!(b.above[..lim], o);
                let mut runs = load!(b.runs[..lim], o);
                let mut longest = load!(b.longest[..lim], o);
                let mut head = load!(b.head[..lim], o);
                let ov = load!(b.open[..lim], o);
                let mut open: __mmask8 = _mm512_test_epi64_mask(ov, ov);
                for r in 0..rows.len() {
                    let d: __m512i = load8!(b.d, (r * strips + k) * LANES);
                    let c = _mm512_set1_epi64(cut[r * thresholds + i] as i64);
                    let m = _mm512_mask_cmpge_epu64_mask(b.fwd[r * strips + k], d, c);
                    let dtv = _mm512_set1_epi64(dt[r] as i64);
                    let starts = _mm512_mask_cmpeq_epu64_mask(m, run, zero);
                    runs = _mm512_mask_add_epi64(runs, starts, runs, one);
                    run = _mm512_maskz_add_epi64(m, run, dtv);
                    above = _mm512_mask_add_epi64(above, m, above, dtv);
                    longest = _mm512_max_epu64(longest, run);
                    head = _mm512_mask_add_epi64(head, m & open, head, dtv);
                    open &= m;
                }
                store!(b.run[..lim], o, run);
                store!(b.above[..lim], o, above);
                store!(b.runs[..lim], o, runs);
                store!(b.longest[..lim], o, longest);
                store!(b.head[..lim], o, head);
                store!(
                    b.open[..lim],
                    o,
                    _mm512_maskz_mov_epi64(open, _mm512_set1_epi64(-1))
                );
            }
        }
    }
}
