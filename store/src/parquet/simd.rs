//! DELTA_BINARY_PACKED blocks of eight columns at a time, straight from row-major rows: the one
//! module of `stel-store` allowed `unsafe` (crate lint: `deny(unsafe_code)`).
//!
//! Why here and why `unsafe`: the encoder's work per counter is a subtraction, a min, an OR and
//! a few bits of packing, so at 1 G samples/s per core (~2.5 cycles each) the transpose from the
//! decoder's row-major batch to per-column bit streams decides the speed. This module does it in
//! vector registers: eight columns of a row are one AVX-512 register, deltas/min/max are vertical
//! operations on rows (no gather), and one miniblock (32 rows × 8 columns) is narrowed to
//! bytes/words/dwords and transposed with two-source permutes (`vpermt2b/w/d`), then each
//! column's bits are squeezed out with `pext`. Runtime dispatch picks the kernel once
//! ([`Kernel::detect`]); the binary is built for the baseline x86-64 target, never `native`.
//!
//! The unsafe operations are of two kinds only, each with a `SAFETY` note:
//! * calling a `#[target_feature]` function, after [`Kernel::detect`] checked that the CPU has
//!   those features (`is_x86_feature_detected!`); a [`Kernel`] value other than `Scalar` can only
//!   be made by that check (its constructor is private to this module);
//! * unaligned 64-byte loads/stores of `[u64; 8]` / `[u8; 64]` arrays through references (the
//!   intrinsics take raw pointers; the reference guarantees the 64 bytes);
//! * `prefetch` of an element's address (SSE, x86_64 baseline; it never faults).
//!
//! Measured alternatives (PERSISTENCE.md): the same algorithm written as plain Rust over
//! `[u64; 8]` lanes and compiled per target feature (the AVX2 and scalar kernels here) reaches
//! half the speed, because its bit packing stays scalar; `bitpacking::BitPacker1x` packs u32
//! only and needs a transpose first.
#![expect(
    clippy::needless_range_loop,
    reason = "lane j indexes several parallel per-column arrays (widths, outputs, transposed rows)"
)]

/// Deltas per DELTA_BINARY_PACKED block and per miniblock (what the rest of the encoder writes).
pub(crate) const BLOCK: usize = 128;
pub(crate) const MINI: usize = 32;
/// Columns per strip (one AVX-512 register of u64).
pub(crate) const STRIP: usize = 8;
/// How many strips ahead the rows are prefetched.
const PREFETCH_STRIPS: usize = 2;
/// Most bytes one column's block can take: zigzag VLQ min (≤ 10) + 4 widths + 4 × 32 × 8, plus
/// room for the 16-byte stores of the packers.
const COL_BYTES: usize = 10 + 4 + 4 * MINI * 8 + 32;

/// The encoder kernel this CPU runs.
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
            if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vbmi")
                && std::is_x86_feature_detected!("bmi2")
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
        #[cfg(target_arch = "x86_64")]
        if v[0].0 == Isa::Avx512 {
            v.push(Self(Isa::Avx2));
        }
        if v[0].0 != Isa::Scalar {
            v.push(Self(Isa::Scalar));
        }
        v
    }

    /// For logs and the bench: `avx512`, `avx2` or `scalar`.
    pub(crate) fn name(self) -> &'static str {
        match self.0 {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Encodes one DELTA block (`n` deltas, 1 ≤ n ≤ 128) of the eight columns `c0..c0 + 8`:
    /// `rows[0]` is the row before the block, `rows[1..=n]` its rows. Writes each column's block
    /// bytes (min as zigzag VLQ, four miniblock widths, the packed miniblocks; miniblocks past
    /// `n` have width 0 and no bytes) and the unsigned min/max of its `n` values into `out`.
    ///
    /// # Panics
    /// If `n` is 0 or over 128, `rows` has fewer than `n + 1` rows, or a row is shorter than
    /// `c0 + 8`.
    pub(crate) fn strip(self, rows: &[&[u64]], c0: usize, n: usize, out: &mut StripOut) {
        assert!(
            (1..=BLOCK).contains(&n) && rows.len() > n,
            "bad block of {n} deltas"
        );
        for r in &rows[..=n] {
            assert!(r.len() >= c0 + STRIP, "row shorter than its strip");
        }
        let mut buf = out
            .buf
            .take()
            .unwrap_or_else(|| Box::new([[0; STRIP]; BLOCK]));
        let b = &mut *buf;
        match self.0 {
            Isa::Scalar => strip_generic(rows, c0, n, out, b),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only constructed by `detect()` after
            // `is_x86_feature_detected!("avx2")` returned true.
            Isa::Avx2 => unsafe { x86::strip_avx2(rows, c0, n, out, b) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only constructed by `detect()` after it checked avx512f,
            // avx512bw, avx512vbmi and bmi2 with `is_x86_feature_detected!`.
            Isa::Avx512 => unsafe { x86::strip_avx512(rows, c0, n, out, b) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => strip_generic(rows, c0, n, out, b),
        }
        out.buf = Some(buf);
    }
}

impl Kernel {
    /// Appends 32 values of `w` bits each (1 ≤ `w` ≤ 32; bits above `w` are ignored), LSB
    /// first, to `out`: exactly `4 * w` bytes, the layout of `chunk::pack32`. Returns `false`,
    /// writing nothing, when this kernel has no vector packer for them (scalar, AVX2): the
    /// caller packs them.
    ///
    /// # Panics
    /// If `w` is 0 or over 32.
    pub(crate) fn pack32_lanes(self, vals: &[u32; MINI], w: u32, out: &mut Vec<u8>) -> bool {
        assert!((1..=32).contains(&w), "width {w} out of 1..=32");
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                let mut buf = [0u8; PACK_BUF];
                // SAFETY: `Isa::Avx512` is only constructed by `detect()` after it checked
                // avx512f (all this function uses besides the x86_64 baseline).
                unsafe { x86::pack32_avx512(vals, w, &mut buf) };
                out.extend_from_slice(&buf[..4 * w as usize]);
                true
            }
            _ => false,
        }
    }
}

/// Bytes [`x86::pack32_avx512`] writes: four 32-byte stores, the last at `3 * w` ≤ 96.
const PACK_BUF: usize = 128;

/// One strip's encoded block: per column its bytes and the min/max of its values.
#[derive(Debug)]
pub(crate) struct StripOut {
    bytes: [[u8; COL_BYTES]; STRIP],
    len: [usize; STRIP],
    pub(crate) lo: [u64; STRIP],
    pub(crate) hi: [u64; STRIP],
    /// The kernels' delta buffer, kept between strips: every row a kernel reads is written
    /// first (`deltas` pads the last miniblock), so it is never zeroed again (zeroing 8 KiB per
    /// strip was 2 % of the encoder's CPU in `stel-bench e2e`).
    buf: Option<Box<Deltas>>,
}

/// One block's deltas, row-major: `[row][column of the strip]`.
type Deltas = [[u64; STRIP]; BLOCK];

impl Default for StripOut {
    fn default() -> Self {
        Self {
            bytes: [[0; COL_BYTES]; STRIP],
            len: [0; STRIP],
            lo: [0; STRIP],
            hi: [0; STRIP],
            buf: None,
        }
    }
}

impl StripOut {
    /// Column `j`'s block bytes.
    pub(crate) fn bytes(&self, j: usize) -> &[u8] {
        &self.bytes[j][..self.len[j]]
    }
}

/// Pass 1 and 2, shared by every kernel: deltas minus the block min (`buf`, row-major, rows past
/// `n` are 0), the OR of each miniblock per column, the min delta, and value min/max.
#[inline(always)]
fn deltas(
    rows: &[&[u64]],
    c0: usize,
    n: usize,
    buf: &mut [[u64; STRIP]; BLOCK],
    out: &mut StripOut,
) -> ([i64; STRIP], [[u64; STRIP]; 4]) {
    let lane = |r: usize| -> [u64; STRIP] {
        let mut a = [0u64; STRIP];
        a.copy_from_slice(&rows[r][c0..c0 + STRIP]);
        a
    };
    // The strips to the right are next: ask for their lines now, one row per row encoded (a
    // strip's 129 rows sit in 129 different pages; hardware prefetchers do not follow that).
    let ahead = c0 + PREFETCH_STRIPS * STRIP;
    let prefetch = |r: usize| {
        #[cfg(target_arch = "x86_64")]
        if let Some(line) = rows[r].get(ahead) {
            // SAFETY: SSE is part of the x86_64 baseline (every x86_64 CPU has it), and a
            // prefetch of a valid reference's address reads nothing and cannot fault.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    (line as *const u64).cast(),
                )
            };
        }
    };
    prefetch(0);
    let mut prev = lane(0);
    let mut mn = [i64::MAX; STRIP];
    let mut lo = [u64::MAX; STRIP];
    let mut hi = [0u64; STRIP];
    for (r, b) in buf.iter_mut().enumerate().take(n) {
        prefetch(r + 1);
        let v = lane(r + 1);
        for j in 0..STRIP {
            let d = v[j].wrapping_sub(prev[j]);
            b[j] = d;
            mn[j] = mn[j].min(d as i64);
            lo[j] = lo[j].min(v[j]);
            hi[j] = hi[j].max(v[j]);
        }
        prev = v;
    }
    out.lo = lo;
    out.hi = hi;
    // Rows past `n` are padding: Parquet pads a block with its min, i.e. 0 after subtracting it.
    let mut ors = [[0u64; STRIP]; 4];
    for (m, or) in ors.iter_mut().enumerate() {
        let (a, b) = (m * MINI, ((m + 1) * MINI).min(n));
        if a >= b {
            break;
        }
        for row in &mut buf[a..b] {
            for j in 0..STRIP {
                let o = row[j].wrapping_sub(mn[j] as u64);
                row[j] = o;
                or[j] |= o;
            }
        }
    }
    for row in &mut buf[n..n.div_ceil(MINI) * MINI] {
        *row = [0; STRIP];
    }
    (mn, ors)
}

/// Writes the block header of every column (min, four zero widths); returns where each column's
/// width bytes are.
#[inline(always)]
fn headers(mn: &[i64; STRIP], out: &mut StripOut) -> [usize; STRIP] {
    let mut at = [0usize; STRIP];
    for j in 0..STRIP {
        let v = mn[j];
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        let b = &mut out.bytes[j];
        let mut k = 0;
        while z >= 0x80 {
            b[k] = (z as u8) | 0x80;
            z >>= 7;
            k += 1;
        }
        b[k] = z as u8;
        b[k + 1..k + 5].fill(0);
        at[j] = k + 1;
        out.len[j] = k + 5;
    }
    at
}

/// The portable kernel: vertical passes (vectorised by the compiler for the enabled target
/// features) and one scalar packer per bit width reading the miniblock column-wise.
#[inline(always)]
fn strip_generic(rows: &[&[u64]], c0: usize, n: usize, out: &mut StripOut, buf: &mut Deltas) {
    let (mn, ors) = deltas(rows, c0, n, buf, out);
    let at = headers(&mn, out);
    for m in 0..n.div_ceil(MINI) {
        let mini = &buf[m * MINI..(m + 1) * MINI];
        for j in 0..STRIP {
            let w = 64 - ors[m][j].leading_zeros();
            out.bytes[j][at[j] + m] = w as u8;
            let p = out.len[j];
            let dst = &mut out.bytes[j][p..p + 4 * w as usize];
            pack_column(mini, j, w, dst);
            out.len[j] = p + 4 * w as usize;
        }
    }
}

/// Packs column `j` of a miniblock (32 rows) at `w` bits, LSB first, into `dst` (4·w bytes).
#[inline(always)]
fn pack_column(mini: &[[u64; STRIP]], j: usize, w: u32, dst: &mut [u8]) {
    macro_rules! widths {
        ($($w:literal)*) => {
            match w {
                0 => {}
                $($w => pack_w::<$w>(mini, j, dst),)*
                _ => {
                    for (chunk, v) in dst.chunks_exact_mut(8).zip(mini) {
                        chunk.copy_from_slice(&v[j].to_le_bytes());
                    }
                }
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
        62 63);
}

/// One packer per width: constant shifts, unrolled.
#[inline(always)]
fn pack_w<const W: u32>(mini: &[[u64; STRIP]], j: usize, dst: &mut [u8]) {
    let mut word = 0;
    let mut acc = 0u64;
    let mut bits = 0u32;
    for row in &mini[..MINI] {
        let v = row[j];
        acc |= v << bits;
        bits += W;
        if bits >= 64 {
            dst[word * 8..word * 8 + 8].copy_from_slice(&acc.to_le_bytes());
            word += 1;
            bits -= 64;
            acc = if bits > 0 { v >> (W - bits) } else { 0 };
        }
    }
    // 32 × W bits = 4W bytes: whole words plus at most one half word.
    if bits > 0 {
        let tail = &mut dst[word * 8..];
        tail.copy_from_slice(&acc.to_le_bytes()[..tail.len()]);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use super::{deltas, headers, pack_column, Deltas, StripOut, MINI, STRIP};

    #[target_feature(enable = "avx2,bmi1,lzcnt")]
    pub(super) fn strip_avx2(
        rows: &[&[u64]],
        c0: usize,
        n: usize,
        out: &mut StripOut,
        buf: &mut Deltas,
    ) {
        super::strip_generic(rows, c0, n, out, buf)
    }

    /// `pext` masks: for width `w`, the low `w` bits of every `bits`-bit lane of a u64.
    const fn masks(bits: usize) -> [u64; 65] {
        let mut out = [0u64; 65];
        let mut w = 0;
        while w <= bits {
            let lane = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
            let mut m = 0u64;
            let mut k = 0;
            while k < 64 / bits {
                m |= lane << (k * bits);
                k += 1;
            }
            out[w] = m;
            w += 1;
        }
        out
    }
    const M8: [u64; 65] = masks(8);
    const M16: [u64; 65] = masks(16);
    const M32: [u64; 65] = masks(32);

    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,bmi2,bmi1,lzcnt")]
    pub(super) fn strip_avx512(
        rows: &[&[u64]],
        c0: usize,
        n: usize,
        out: &mut StripOut,
        buf: &mut Deltas,
    ) {
        let (mn, ors) = deltas(rows, c0, n, buf, out);
        let at = headers(&mn, out);
        for m in 0..n.div_ceil(MINI) {
            let mut ws = [0usize; STRIP];
            let mut wmax = 0;
            for j in 0..STRIP {
                let w = (64 - ors[m][j].leading_zeros()) as usize;
                ws[j] = w;
                out.bytes[j][at[j] + m] = w as u8;
                wmax = wmax.max(w);
            }
            let mini: &[[u64; STRIP]; MINI] = (&buf[m * MINI..(m + 1) * MINI])
                .try_into()
                .expect("a miniblock is 32 rows");
            if wmax == 0 {
                continue;
            } else if wmax <= 8 {
                // Bytes: t[g][j] = rows 8g..8g+8 of column j, one per byte; pext keeps w bits
                // of each: 8 values → exactly w bytes.
                let t = transpose8(mini);
                for j in 0..STRIP {
                    let (w, mask) = (ws[j], M8[ws[j]]);
                    let b = &mut out.bytes[j];
                    let mut p = out.len[j];
                    for tg in &t {
                        let x = _pext_u64(tg[j], mask);
                        b[p..p + 8].copy_from_slice(&x.to_le_bytes());
                        p += w;
                    }
                    out.len[j] = p;
                }
            } else if wmax <= 16 {
                // Words: t[g][j] = rows 4g..4g+4 of column j; two pexts → 8w bits = w bytes.
                let t = transpose16(mini);
                for j in 0..STRIP {
                    let (w, mask) = (ws[j], M16[ws[j]]);
                    let b = &mut out.bytes[j];
                    let mut p = out.len[j];
                    for g in 0..4 {
                        let x0 = u128::from(_pext_u64(t[2 * g][j], mask));
                        let x1 = u128::from(_pext_u64(t[2 * g + 1][j], mask));
                        let x = x0 | (x1 << (4 * w));
                        b[p..p + 16].copy_from_slice(&x.to_le_bytes());
                        p += w;
                    }
                    out.len[j] = p;
                }
            } else if wmax <= 32 {
                // Dwords: t[g][j] = rows 2g, 2g+1 of column j; four pexts → 8w bits, written as
                // two 4w-bit halves (the second starts mid-byte when w is odd).
                let t = transpose32(mini);
                for j in 0..STRIP {
                    let (w, mask) = (ws[j], M32[ws[j]]);
                    let b = &mut out.bytes[j];
                    let mut p = out.len[j];
                    let half = 4 * w / 8;
                    let odd = 4 * (w & 1) as u32;
                    for g in 0..4 {
                        let x = |k: usize| u128::from(_pext_u64(t[4 * g + k][j], mask));
                        let lo = x(0) | (x(1) << (2 * w));
                        let hi = x(2) | (x(3) << (2 * w));
                        b[p..p + 16].copy_from_slice(&lo.to_le_bytes());
                        let y = (hi << odd) | (lo >> (8 * half));
                        b[p + half..p + half + 16].copy_from_slice(&y.to_le_bytes());
                        p += w;
                    }
                    out.len[j] = p;
                }
            } else {
                for j in 0..STRIP {
                    let w = ws[j];
                    let p = out.len[j];
                    pack_column(mini, j, w as u32, &mut out.bytes[j][p..p + 4 * w]);
                    out.len[j] = p + 4 * w;
                }
            }
        }
    }

    #[inline(always)]
    fn load(a: &[u64; 8]) -> __m512i {
        // SAFETY: `a` is a reference to 64 initialised bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(a.as_ptr().cast()) }
    }

    #[inline(always)]
    fn load_idx(a: &[u8; 64]) -> __m512i {
        // SAFETY: `a` is a reference to 64 initialised bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(a.as_ptr().cast()) }
    }

    #[inline(always)]
    fn store(a: &mut [u64; 8], v: __m512i) {
        // SAFETY: `a` is a unique reference to 64 bytes; the store is unaligned.
        unsafe { _mm512_storeu_si512(a.as_mut_ptr().cast(), v) }
    }

    /// Permute tables as bytes. Byte tables: output byte `8j + i` takes the low byte of qword
    /// `j` of the first (`i` even) or second (`i` odd) source.
    const fn idx8(i: usize) -> [u8; 64] {
        let mut t = [0u8; 64];
        let mut j = 0;
        while j < 8 {
            t[8 * j + i] = (8 * j) as u8;
            t[8 * j + i + 1] = (64 + 8 * j) as u8;
            j += 1;
        }
        t
    }
    const I8: [[u8; 64]; 4] = [idx8(0), idx8(2), idx8(4), idx8(6)];

    /// Word tables (as bytes, little endian): output word `4j + i` takes the low word of qword
    /// `j` of the first or second source.
    const fn idx16(i: usize) -> [u8; 64] {
        let mut t = [0u8; 64];
        let mut j = 0;
        while j < 8 {
            t[2 * (4 * j + i)] = (4 * j) as u8;
            t[2 * (4 * j + i + 1)] = (32 + 4 * j) as u8;
            j += 1;
        }
        t
    }
    const I16: [[u8; 64]; 2] = [idx16(0), idx16(2)];

    /// Dword table: output dword `2j` / `2j + 1` takes the low dword of qword `j` of the
    /// first / second source.
    const fn idx32() -> [u8; 64] {
        let mut t = [0u8; 64];
        let mut j = 0;
        while j < 8 {
            t[4 * (2 * j)] = (2 * j) as u8;
            t[4 * (2 * j + 1)] = (16 + 2 * j) as u8;
            j += 1;
        }
        t
    }
    const I32: [u8; 64] = idx32();

    /// 32 rows × 8 columns of values < 2^8 → `[g][j]`: rows 8g..8g+8 of column j as bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn transpose8(rows: &[[u64; STRIP]; MINI]) -> [[u64; 8]; 4] {
        let mut out = [[0u64; 8]; 4];
        let idx: [__m512i; 4] = core::array::from_fn(|k| load_idx(&I8[k]));
        for (g, o) in out.iter_mut().enumerate() {
            let r = |i: usize| load(&rows[8 * g + i]);
            let p0 = _mm512_permutex2var_epi8(r(0), idx[0], r(1));
            let p1 = _mm512_permutex2var_epi8(r(2), idx[1], r(3));
            let p2 = _mm512_permutex2var_epi8(r(4), idx[2], r(5));
            let p3 = _mm512_permutex2var_epi8(r(6), idx[3], r(7));
            let a = _mm512_mask_blend_epi8(0x0C0C_0C0C_0C0C_0C0C, p0, p1);
            let b = _mm512_mask_blend_epi8(0xC0C0_C0C0_C0C0_C0C0, p2, p3);
            store(o, _mm512_mask_blend_epi8(0xF0F0_F0F0_F0F0_F0F0, a, b));
        }
        out
    }

    /// 32 rows × 8 columns of values < 2^16 → `[g][j]`: rows 4g..4g+4 of column j as words.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn transpose16(rows: &[[u64; STRIP]; MINI]) -> [[u64; 8]; 8] {
        let mut out = [[0u64; 8]; 8];
        let idx: [__m512i; 2] = core::array::from_fn(|k| load_idx(&I16[k]));
        for (g, o) in out.iter_mut().enumerate() {
            let r = |i: usize| load(&rows[4 * g + i]);
            let p0 = _mm512_permutex2var_epi16(r(0), idx[0], r(1));
            let p1 = _mm512_permutex2var_epi16(r(2), idx[1], r(3));
            store(o, _mm512_mask_blend_epi16(0xCCCC_CCCC, p0, p1));
        }
        out
    }

    /// 32 rows × 8 columns of values < 2^32 → `[g][j]`: rows 2g, 2g+1 of column j as dwords.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose32(rows: &[[u64; STRIP]; MINI]) -> [[u64; 8]; 16] {
        let mut out = [[0u64; 8]; 16];
        let idx = load_idx(&I32);
        for (g, o) in out.iter_mut().enumerate() {
            store(
                o,
                _mm512_permutex2var_epi32(load(&rows[2 * g]), idx, load(&rows[2 * g + 1])),
            );
        }
        out
    }

    /// [`super::Kernel::pack32_lanes`] in vector registers, branch-free whatever `w`: each
    /// register of 16 values is folded pairwise three times, 32-bit lanes of `w` bits into
    /// 64-bit lanes of `2w` bits, into 128-bit lanes of `4w` bits, into 256-bit lanes of `8w`
    /// bits, which is `w` whole bytes (eight values). The four 256-bit lanes are stored at
    /// bytes 0, `w`, `2w`, `3w` in that order: the bytes of a lane past its `w` are zero and the
    /// next store overwrites them.
    #[target_feature(enable = "avx512f")]
    pub(super) fn pack32_avx512(vals: &[u32; MINI], w: u32, buf: &mut [u8; super::PACK_BUF]) {
        let (lo, hi) = vals.split_at(16);
        let a = pack16(load16(lo.try_into().expect("16 values")), w);
        let b = pack16(load16(hi.try_into().expect("16 values")), w);
        let w = w as usize;
        let lanes = [
            _mm512_castsi512_si256(a),
            _mm512_extracti64x4_epi64::<1>(a),
            _mm512_castsi512_si256(b),
            _mm512_extracti64x4_epi64::<1>(b),
        ];
        for (k, v) in lanes.into_iter().enumerate() {
            let at = k * w;
            store32((&mut buf[at..at + 32]).try_into().expect("32 bytes"), v);
        }
    }

    /// Shift count for `_mm512_sll_epi64` / `_mm512_srl_epi64` (64 or more shifts to 0).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn count(n: u32) -> __m128i {
        _mm_cvtsi64_si128(i64::from(n))
    }

    /// 16 values of `w` bits (1 ≤ `w` ≤ 32) → each 256-bit lane holds its eight values packed
    /// (value `i` of the lane at bit `i * w`), zero above `8w` bits.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pack16(x: __m512i, w: u32) -> __m512i {
        let x = _mm512_and_si512(x, _mm512_set1_epi32(((1u64 << w) - 1) as u32 as i32));
        // 1: dwords (v0, v1) of each qword → v0 | v1 << w.
        let y = _mm512_or_si512(
            _mm512_and_si512(x, _mm512_set1_epi64(0xFFFF_FFFF)),
            _mm512_sll_epi64(_mm512_srli_epi64::<32>(x), count(w)),
        );
        // 2: qwords (y0, y1) of each 128-bit lane → y0 | y1 << 2w as (low, high) qwords: the
        // low one gets y1's bits that fit (moved down from the odd qword), the high one the
        // bits that spill over.
        let s = 2 * w;
        let fit = _mm512_shuffle_epi32::<0x4E>(_mm512_sll_epi64(y, count(s)));
        let spill = _mm512_srl_epi64(y, count(64 - s));
        let z = _mm512_mask_blend_epi64(0xAA, _mm512_or_si512(y, fit), spill);
        // 3: 128-bit halves (a, b) of each 256-bit lane → a | b << 4w: b's qwords moved up by
        // 4w / 64 qwords and shifted by 4w % 64 bits (with the bits each lower qword spills).
        let t = 4 * w;
        let (k, r) = ((t / 64) as usize, t % 64);
        let up = _mm512_maskz_permutexvar_epi64(UP_MASK[k], load(&UP_IDX[k]), z);
        let carry = _mm512_maskz_permutexvar_epi64(CARRY_MASK[k], load(&CARRY_IDX[k]), z);
        _mm512_or_si512(
            _mm512_maskz_mov_epi64(0x33, z),
            _mm512_or_si512(
                _mm512_sll_epi64(up, count(r)),
                _mm512_srl_epi64(carry, count(64 - r)),
            ),
        )
    }

    /// Qword `q` of each 256-bit lane takes the lane's qword `2 + q - by` (its upper half's
    /// qword `q - by`) where that is 0 or 1; the mask keeps those.
    const fn shift_idx(by: usize) -> [u64; 8] {
        let mut t = [0u64; 8];
        let mut q = 0;
        while q < 4 {
            if q >= by && q - by <= 1 {
                t[q] = (2 + q - by) as u64;
                t[4 + q] = (6 + q - by) as u64;
            }
            q += 1;
        }
        t
    }
    const fn shift_mask(by: usize) -> u8 {
        let mut m = 0u8;
        let mut q = 0;
        while q < 4 {
            if q >= by && q - by <= 1 {
                m |= (1 << q) | (1 << (4 + q));
            }
            q += 1;
        }
        m
    }
    /// Step 3's permutes for 4w / 64 = 0, 1, 2 qwords: the upper half moved up that many
    /// (`UP`), and one more (`CARRY`, shifted right to give the bits that cross a qword).
    const UP_IDX: [[u64; 8]; 3] = [shift_idx(0), shift_idx(1), shift_idx(2)];
    const UP_MASK: [u8; 3] = [shift_mask(0), shift_mask(1), shift_mask(2)];
    const CARRY_IDX: [[u64; 8]; 3] = [shift_idx(1), shift_idx(2), shift_idx(3)];
    const CARRY_MASK: [u8; 3] = [shift_mask(1), shift_mask(2), shift_mask(3)];

    #[inline(always)]
    fn load16(a: &[u32; 16]) -> __m512i {
        // SAFETY: `a` is a reference to 64 initialised bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(a.as_ptr().cast()) }
    }

    #[inline(always)]
    fn store32(a: &mut [u8; 32], v: __m256i) {
        // SAFETY: `a` is a unique reference to 32 bytes; the store is unaligned.
        unsafe { _mm256_storeu_si256(a.as_mut_ptr().cast(), v) }
    }
}
