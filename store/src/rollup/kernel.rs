//! The per-sample work of the finest tier, over runs of complete rows: the one module of
//! `stel::rollup` allowed `unsafe` (crate lint: `deny(unsafe_code)`), for runtime dispatch only.
//!
//! Per counter and row: the delta from the previous row, whether it went backwards (reset or
//! wrap), and — branch-free — the interval's largest and smallest delta (levels: value) with the
//! time of the first occurrence, the levels' sum and the counters' reset count. The kernel walks
//! a strip of eight columns down a run of rows with the strip's state in registers, so the per
//! counter cost is one load and a dozen vector operations on eight lanes.
//!
//! The code is one generic body over `[u64; 8]` lanes; [`Kernel`] calls it compiled for AVX-512
//! (F + VL: native unsigned compares and masked blends), for AVX2, or for the baseline target,
//! chosen once at run time ([`Kernel::detect`], `is_x86_feature_detected!`), never a `native`
//! build. The only `unsafe` is calling a `#[target_feature]` function after that check.

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
    use super::{run_generic, Cols};

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
        run_generic(rows, ts, c0, c1, st);
    }
}
