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

/// AVX2 with non-temporal (streaming) stores: the destination is a decoder batch (8 MiB at
/// the design session), far larger than a core's L2, and its lines were last touched by a sink
/// long ago, so normal stores first read every line from memory (read for ownership) only to
/// overwrite it. Streaming stores write whole lines without that read. They are weakly ordered:
/// the `sfence` at the end orders them before anything this thread does next (handing the batch
/// to a sink thread through a channel).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn avx2_stream_inner(dst: &mut [u64], src: &[u8]) {
    use core::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_setr_epi8, _mm256_shuffle_epi8, _mm256_stream_si256,
        _mm_sfence,
    };
    let n = dst.len().min(src.len() / 8);
    let (dst, src) = (&mut dst[..n], &src[..8 * n]);
    // Head: up to the first 32-byte aligned destination address (streaming stores need it).
    let head = dst.as_ptr().align_offset(32).min(n);
    portable_inner(&mut dst[..head], &src[..8 * head]);
    let rev = _mm256_setr_epi8(
        7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13,
        12, 11, 10, 9, 8,
    );
    let body = (n - head) / 4 * 4;
    let (d, s) = (
        &mut dst[head..head + body],
        &src[8 * head..8 * (head + body)],
    );
    for (d4, s32) in d.chunks_exact_mut(4).zip(s.chunks_exact(32)) {
        // SAFETY: `s32` is 32 readable bytes (unaligned load); `d4` is 32 writable bytes at a
        // 32-byte aligned address (`head` aligned the first, every chunk is 32 bytes).
        unsafe {
            let v = _mm256_loadu_si256(s32.as_ptr().cast::<__m256i>());
            _mm256_stream_si256(
                d4.as_mut_ptr().cast::<__m256i>(),
                _mm256_shuffle_epi8(v, rev),
            );
        }
    }
    portable_inner(&mut dst[head + body..], &src[8 * (head + body)..]);
    _mm_sfence();
}

#[cfg(target_arch = "x86_64")]
fn avx2_stream(dst: &mut [u64], src: &[u8]) {
    // SAFETY: handed out by `select()` only after `is_x86_feature_detected!("avx2")` returned
    // true on this CPU; the callee's unsafe operations are justified inside it.
    unsafe { avx2_stream_inner(dst, src) }
}

/// The fastest implementation this CPU supports: AVX2 with streaming stores. `STEL_NO_AVX2=1`
/// forces the portable loop (for benchmarks and for tests that want both paths);
/// `STEL_BSWAP_STREAM=0` AVX2 with normal stores (the decoder before streaming stores).
pub fn select() -> (BswapFn, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("STEL_NO_AVX2").is_none() && std::is_x86_feature_detected!("avx2") {
            if std::env::var("STEL_BSWAP_STREAM").is_ok_and(|v| v == "0") {
                return (avx2, "avx2");
            }
            return (avx2_stream, "avx2_stream");
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
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // Every head alignment and tail length of the streaming variant.
            for start in 0..4 {
                for len in 0..=33 {
                    let mut got3 = vec![0u64; 37];
                    avx2_stream(&mut got3[start..start + len], &src[..8 * len]);
                    assert_eq!(&got3[start..start + len], &want[..len], "{start} {len}");
                    assert!(got3[..start].iter().all(|&v| v == 0));
                    assert!(got3[start + len..].iter().all(|&v| v == 0));
                }
            }
        }
    }
}
