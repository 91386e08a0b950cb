//! Big-endian u64 → native, the innermost loop of decoding. Chosen once per decoder at runtime:
//! AVX2 where the CPU has it (measured ~3.5× the baseline loop here), the portable loop
//! elsewhere. We never build for `target-cpu=native`.

pub use crate::ipfix::BswapFn;

#[inline(always)]
fn portable_inner(dst: &mut [u64], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(8)) {
        *d = u64::from_be_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
    }
}

/// The portable loop (SSE2 baseline on x86-64).
pub fn portable(dst: &mut [u64], src: &[u8]) {
    portable_inner(dst, src)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn avx2_inner(dst: &mut [u64], src: &[u8]) {
    // The same safe loop, compiled with AVX2 enabled so it vectorises to vpshufb.
    portable_inner(dst, src)
}

#[cfg(target_arch = "x86_64")]
fn avx2(dst: &mut [u64], src: &[u8]) {
    // SAFETY: `avx2` is only handed out by `select()` after `is_x86_feature_detected!("avx2")`
    // returned true on this CPU; the callee is otherwise safe code.
    unsafe { avx2_inner(dst, src) }
}

/// The fastest implementation this CPU supports. `STEL_NO_AVX2=1` forces the portable loop (for
/// benchmarks and for tests that want both paths).
pub fn select() -> (BswapFn, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("STEL_NO_AVX2").is_none() && std::is_x86_feature_detected!("avx2") {
            return (avx2, "avx2");
        }
    }
    (portable, "portable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_paths_agree() {
        let src: Vec<u8> = (0..8 * 37).map(|i| (i * 7 + 3) as u8).collect();
        let mut want = vec![0u64; 37];
        for (i, w) in want.iter_mut().enumerate() {
            *w = u64::from_be_bytes(src[8 * i..8 * i + 8].try_into().unwrap());
        }
        let mut got = vec![0u64; 37];
        portable(&mut got, &src);
        assert_eq!(got, want);
        let (f, _) = select();
        let mut got2 = vec![0u64; 37];
        f(&mut got2, &src);
        assert_eq!(got2, want);
    }
}
