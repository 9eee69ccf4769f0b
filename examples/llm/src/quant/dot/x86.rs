//! x86-64 kernels: AVX2 (`pmaddubsw` + `pmaddwd`), AVX-VNNI or AVX512-VNNI (`vpdpbusd`), chosen
//! at run time.
//!
//! Four rows at a time share each activation load. The Q4 kernels take two blocks per step: 32
//! bytes of quants hold blocks `b` and `b + 1`, whose low nibbles (elements 0..15 of both) and
//! high nibbles (elements 16..31) each meet the matching halves of the two activation blocks, so
//! one step yields lanes 0-3 of both blocks in one register and lanes 4-7 in another. The row's
//! accumulators are kept in that layout (`X = [A0..3 | B0..3]`, `Y = [A4..7 | B4..7]`, with `A`
//! and `B` the even- and odd-block accumulators of [`super`]), and each lane still sees exactly
//! the fused multiply-adds the arithmetic specifies, in the same order. Signed-by-signed
//! products (Q4_0, Q8_0) use the sign trick (`|w| * sign(q, w)`), because both instructions
//! multiply unsigned by signed bytes.

use std::arch::x86_64::*;

use super::Operands;
use crate::quant::GgmlType;

/// Most blocks whose scales are prepared at once (even, so block pairs and the even/odd
/// accumulators keep their parity across chunks).
const CHUNK: usize = 64;
/// Rows multiplied together.
const ROWS: usize = 4;
/// Rows multiplied together by the K-quant kernels: two rows' accumulators leave registers for
/// the unpacked quants (four spilled to the stack; two measured 5-10% faster on Q4_K and Q6_K,
/// `benches/dot.rs`, 2026-12-02).
const SUPER_ROWS: usize = 2;
/// Bytes ahead of the quants being read to prefetch. The loops do enough arithmetic per byte
/// that the hardware prefetcher alone keeps too few cache misses in flight: on the 2-core x86
/// dev box (weights streamed from DRAM) prefetching 4 KiB ahead took the whole model's products
/// from ~20 ms to ~11 ms per token on one core.
///
/// The prefetches go to L2 ([`PREFETCH_HINT`]), not L1: a core can keep more L2 misses in
/// flight than L1 misses, and the lines need not sit in L1 until they are read. Measured
/// 2026-12-01 with SmolLM2-135M Q4_1 on one core of that box: the Q8_0 output head (30 MiB a
/// token) went from 3.8-4.6 ms to 1.5-1.6 ms per token (19.6 GB/s, the core's streaming read
/// rate), the Q4_1 layers changed within the noise; 8 KiB ahead beat 2 and 4 KiB for the head.
const PREFETCH: usize = 8192;
/// The same for the scales and minimums (2 bytes a block where the quants have 16 or 32).
const PREFETCH_SCALES: usize = 1024;
/// Where prefetched lines go: L2 (and the caches beyond it).
const PREFETCH_HINT: i32 = _MM_HINT_T1;

pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

pub(super) fn has_avx_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

pub(super) fn has_avx512_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
}

/// The integer dot product the kernels are built around.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Dot {
    /// `pmaddubsw` + `pmaddwd` (AVX2).
    Avx2,
    /// `vpdpbusd`, VEX-encoded (AVX-VNNI).
    AvxVnni,
    /// `vpdpbusd` on 256-bit registers, EVEX-encoded (AVX512-VNNI + AVX512VL: AMD Zen 4 and
    /// Intel server chips, which lack AVX-VNNI).
    Avx512Vnni,
}

impl Dot {
    fn available(self) -> bool {
        match self {
            Dot::Avx2 => has_avx2(),
            Dot::AvxVnni => has_avx_vnni(),
            Dot::Avx512Vnni => has_avx512_vnni(),
        }
    }
}

const T_Q4_0: u8 = 0;
const T_Q4_1: u8 = 1;
const T_Q8_0: u8 = 2;
const T_Q5_0: u8 = 3;
const T_Q5_1: u8 = 4;
const T_Q4_K: u8 = 5;
const T_Q5_K: u8 = 6;
const T_Q6_K: u8 = 7;

/// Runs the kernel for `op` built on `dot`: into `out` (steps 1-5), or, when `out` is empty,
/// into `exact` (step 6, units of `op.unit` blocks).
pub(super) fn dot_rows(op: &Operands, dot: Dot, out: &mut [f32], exact: &mut [f64]) {
    assert!(dot.available(), "caller checked Isa::available");
    macro_rules! go {
        ($isa:ident, $t:expr) => {
            go!($isa, rows, $t)
        };
        ($isa:ident, $rows:ident, $t:expr) => {
            if out.is_empty() {
                $isa::$rows::<{ $t }, true>(op, out, exact)
            } else {
                $isa::$rows::<{ $t }, false>(op, out, exact)
            }
        };
    }
    macro_rules! per_type {
        ($isa:ident) => {
            match op.ty {
                GgmlType::Q4_0 => go!($isa, T_Q4_0),
                GgmlType::Q4_1 => go!($isa, T_Q4_1),
                GgmlType::Q5_0 => go!($isa, krows, T_Q5_0),
                GgmlType::Q5_1 => go!($isa, krows, T_Q5_1),
                GgmlType::Q4_K => go!($isa, krows, T_Q4_K),
                GgmlType::Q5_K => go!($isa, krows, T_Q5_K),
                GgmlType::Q6_K => go!($isa, krows, T_Q6_K),
                _ => go!($isa, T_Q8_0),
            }
        };
    }
    // SAFETY: the CPU has the instructions (asserted above); `Operands` holds `out.len()` (or
    // `exact.len()`) rows of `nb` blocks (checked by `operands`), which is every index the
    // kernels read.
    unsafe {
        match dot {
            Dot::Avx2 => per_type!(avx2),
            Dot::AvxVnni => per_type!(vnni),
            Dot::Avx512Vnni => per_type!(vnni512),
        }
    }
}

/// Step 5 of the arithmetic on a register: `(u0 + u2) + (u1 + u3)` with `u = lo + hi`.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(t: __m256) -> f32 {
    let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
    let v = _mm_add_ps(u, _mm_movehl_ps(u, u)); // (u0 + u2, u1 + u3, ..)
    _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps::<1>(v, v)))
}

/// The sum of four f64 lanes holding integers below 2^53: exact, so the order is free.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_pd(v: __m256d) -> f64 {
    let u = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
    _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)))
}

/// Step 6 for one row's unit: the eight lanes `t` rounded to the grid (ties to even) and added
/// to the four-lane f64 accumulator `acc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn to_grid(t: __m256, acc: &mut __m256d) {
    let scale = _mm256_set1_pd((1u64 << super::GRID_BITS) as f64);
    for v in [_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t)] {
        let g = _mm256_mul_pd(_mm256_cvtps_pd(v), scale);
        *acc = _mm256_add_pd(*acc, _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(g));
    }
}

/// Step 6 at the end of a unit, for each of `R` rows: the lanes `t = x + y` onto the row's grid
/// accumulator `ex`, and `x`, `y` start again from zero.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn end_unit<const R: usize>(x: &mut [__m256; R], y: &mut [__m256; R], ex: &mut [__m256d; R]) {
    for i in 0..R {
        to_grid(_mm256_add_ps(x[i], y[i]), &mut ex[i]);
        (x[i], y[i]) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    }
}

/// The `R` rows' results from accumulators `x`, `y` (even and odd blocks): step 5 into `out`,
/// or (`EXACT`) the grid sums `ex` into `exact`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn finish_rows<const R: usize, const EXACT: bool>(
    x: &[__m256; R],
    y: &[__m256; R],
    ex: &[__m256d; R],
    out: &mut [f32],
    exact: &mut [f64],
) {
    for i in 0..R {
        if EXACT {
            exact[i] = hsum_pd(ex[i]);
        } else {
            out[i] = hsum(_mm256_add_ps(x[i], y[i]));
        }
    }
}

/// One f16 bit pattern as f32 (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn h2f(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Per-row scale buffers: Q4 rows store one 8-float vector per block pair (`[c_b x4 | c_b+1
/// x4]`), Q8_0 rows one float per block; Q4_1 rows also their minimums as `[m_b, 0, 0, 0 |
/// m_b+1, 0, 0, 0]` per pair (step 4 adds `m * s` to lane 0 of each block's accumulator).
#[derive(Clone, Copy)]
struct Scales {
    c: [f32; 4 * CHUNK],
    m: [f32; 4 * CHUNK],
}

const NO_SCALES: Scales = Scales { c: [0.0; 4 * CHUNK], m: [0.0; 4 * CHUNK] };

thread_local! {
    /// Scale buffers, one set per thread and reused by every call: zeroing 8 KiB per call (a
    /// product on a few hundred rows) showed in profiles. Every entry a kernel reads it has
    /// written in the same call.
    static SCALES: std::cell::RefCell<[Scales; ROWS]> = const { std::cell::RefCell::new([NO_SCALES; ROWS]) };
}

/// Steps 2 (and 4's minimums, Q4_1) for blocks `c0..c0 + n` of row `i` into `sc` (laid out
/// for `T`; `n` at most CHUNK): groups of eight blocks vectorised, the rest one at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales<const T: u8>(op: &Operands, i: usize, c0: usize, n: usize, sc: &mut Scales) {
    // SAFETY: the caller keeps this function's contract: the CPU has the features it is
    // compiled for (`dot_rows` checks), and every index it reads lies within `op`'s rows and
    // blocks (`operands` checks).
    unsafe {
        let row = i * op.nb + c0;
        let (d, dx) = (op.d.as_ptr().add(row), op.ad.as_ptr().add(c0));
        let m = op.m.as_ptr().wrapping_add(row); // dereferenced only for Q4_1
                                                 // Prefetches never fault, so addresses past the end are harmless (and not dereferenced).
        _mm_prefetch::<PREFETCH_HINT>(d.cast::<i8>().wrapping_add(PREFETCH_SCALES));
        if T == T_Q4_1 {
            _mm_prefetch::<PREFETCH_HINT>(m.cast::<i8>().wrapping_add(PREFETCH_SCALES));
        }
        let mut j = 0;
        while j + 8 <= n {
            let v =
                _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(d.add(j) as *const __m128i)), _mm256_loadu_ps(dx.add(j)));
            if T == T_Q8_0 {
                _mm256_storeu_ps(sc.c.as_mut_ptr().add(j), v);
            } else {
                // Pair p of this group: [v[2p] x4 | v[2p+1] x4], and [m[2p], 0, 0, 0 | m[2p+1], ..].
                let p0 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
                let first = _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, 0, 0, -1, 0, 0, 0));
                let mw = if T == T_Q4_1 {
                    _mm256_cvtph_ps(_mm_loadu_si128(m.add(j) as *const __m128i))
                } else {
                    _mm256_setzero_ps()
                };
                for p in 0..4 {
                    let idx = _mm256_add_epi32(p0, _mm256_set1_epi32(2 * p as i32));
                    let at = (j / 2 + p) * 8;
                    _mm256_storeu_ps(sc.c.as_mut_ptr().add(at), _mm256_permutevar8x32_ps(v, idx));
                    if T == T_Q4_1 {
                        let mp = _mm256_and_ps(_mm256_permutevar8x32_ps(mw, idx), first);
                        _mm256_storeu_ps(sc.m.as_mut_ptr().add(at), mp);
                    }
                }
            }
            j += 8;
        }
        for b in j..n {
            let c = h2f(*d.add(b)) * *dx.add(b);
            if T == T_Q8_0 {
                sc.c[b] = c;
            } else {
                // Lanes 0-3 of the pair's vector for an even block, 4-7 for an odd one; an odd
                // last block leaves its pair's other half zero (see `accumulate`).
                let base = (b / 2) * 8 + (b % 2) * 4;
                sc.c[base..base + 4].fill(c);
                sc.m[base..base + 4].fill(0.0);
                if T == T_Q4_1 {
                    sc.m[base] = h2f(*m.add(b));
                }
                if b % 2 == 0 {
                    sc.c[base + 4..base + 8].fill(0.0);
                    sc.m[base + 4..base + 8].fill(0.0);
                }
            }
        }
    }
}

/// The activations' `s` of blocks `c0..c0 + n` laid out like [`Scales::m`] (`[s_b, 0, 0, 0 |
/// s_b+1, 0, 0, 0]` per pair), for Q4_1's step 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_sums(op: &Operands, c0: usize, n: usize, out: &mut [f32; 4 * CHUNK]) {
    // SAFETY: the caller keeps this function's contract: the CPU has the features it is
    // compiled for (`dot_rows` checks), and every index it reads lies within `op`'s rows and
    // blocks (`operands` checks).
    unsafe {
        out[..n.next_multiple_of(2) * 4].fill(0.0);
        for b in 0..n {
            out[(b / 2) * 8 + (b % 2) * 4] = *op.as_.get_unchecked(c0 + b);
        }
    }
}

/// Byte `k` of the result is 0xFF where bit `k` of `x` is set, else 0 (llama.cpp's
/// `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2")]
fn bytes_from_bits(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Block `b` of row `row` of a Q5_0 or Q5_1 type as 32 weight bytes in element order: the
/// integers `w` of step 1 (signed for Q5_0, unsigned for Q5_1).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kweights<const T: u8>(op: &Operands, row: usize, b: usize) -> __m256i {
    // SAFETY: the caller keeps this function's contract: the CPU has the features it is
    // compiled for (`dot_rows` checks), and every index it reads lies within `op`'s rows and
    // blocks (`operands` checks: each plane holds whole groups of every row).
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let blk = row * op.nb + b;
        let p = op.qs.as_ptr().add(blk * 16);
        _mm_prefetch::<PREFETCH_HINT>(p.cast::<i8>().wrapping_add(PREFETCH));
        let q = _mm_loadu_si128(p as *const __m128i);
        let v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(q), q), low);
        let qh = (op.qh.as_ptr().add(blk * 4) as *const u32).read_unaligned();
        let v = _mm256_or_si256(v, _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10)));
        if T == T_Q5_0 {
            _mm256_sub_epi8(v, _mm256_set1_epi8(16))
        } else {
            v
        }
    }
}

/// Steps 2 and 4's weight terms for block `b` of a Q5_0 or Q5_1 row: the lanes' scale `c`
/// (times the activation scale `dx`) and the minimum `mw` (0 for Q5_0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kscales<const T: u8>(op: &Operands, row: usize, b: usize, dx: f32) -> (__m256, f32) {
    // SAFETY: as for `kweights`.
    unsafe {
        let blk = row * op.nb + b;
        let c = _mm256_set1_ps(h2f(*op.d.get_unchecked(blk)) * dx);
        (c, if T == T_Q5_1 { h2f(*op.m.get_unchecked(blk)) } else { 0.0 })
    }
}

/// A K-quant super-block's step-2 and step-4 terms for one row, for all eight of its blocks at
/// once (the same roundings as [`super::kscales_super`], eight lanes at a time). Kept in
/// memory, not registers: the kernel reads each once, as an operand, and its registers hold
/// the rows' accumulators.
#[derive(Clone, Copy)]
struct SuperScales {
    /// Block `t`'s lane scales: `c[t]` in every lane (Q4_K, Q5_K), or Q6_K's two sub-block
    /// scales, the first in lanes 0-3 and the second in 4-7.
    c: [__m256; 8],
    /// Q4_K, Q5_K: the minimum `mw[t]` of block `t`.
    mw: [f32; 8],
}

/// Steps 2 and 4's terms of super-block `s` of row `row`, whose blocks start at `b0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn super_scales<const T: u8>(op: &Operands, row: usize, s: usize, b0: usize, out: &mut SuperScales) {
    // SAFETY: as for `kweights`; a super-block's sixteen scale bytes lie in `op.sc`.
    unsafe {
        let g = row * (op.nb / 8) + s;
        let d = _mm256_set1_ps(h2f(*op.d.get_unchecked(g)));
        let dx = _mm256_loadu_ps(op.ad.as_ptr().add(b0));
        let sc = op.sc.as_ptr().add(g * 16);
        _mm_prefetch::<PREFETCH_HINT>(sc.cast::<i8>().wrapping_add(PREFETCH_SCALES));
        if T == T_Q6_K {
            let v = _mm_loadu_si128(sc as *const __m128i);
            let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)));
            // Scale k belongs to block k / 2.
            let dlo = _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
            let dhi = _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
            let c = [_mm256_mul_ps(_mm256_mul_ps(d, lo), dlo), _mm256_mul_ps(_mm256_mul_ps(d, hi), dhi)];
            for (t, ct) in out.c.iter_mut().enumerate() {
                let k = 2 * (t % 4) as i32;
                *ct = _mm256_permutevar8x32_ps(c[t / 4], _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1));
            }
            return;
        }
        let scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(sc as *const __m128i)));
        let c = _mm256_mul_ps(_mm256_mul_ps(d, scales), dx);
        for (t, ct) in out.c.iter_mut().enumerate() {
            *ct = _mm256_permutevar8x32_ps(c, _mm256_set1_epi32(t as i32));
        }
        let dmin = _mm256_set1_ps(h2f(*op.m.get_unchecked(g)));
        let mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(sc.add(8) as *const __m128i)));
        let mw = _mm256_xor_ps(_mm256_mul_ps(dmin, mins), _mm256_set1_ps(-0.0));
        _mm256_storeu_ps(out.mw.as_mut_ptr(), mw);
    }
}

/// Blocks `t` and `t + 1` (`t` even) of super-block `s` of row `row` as weight bytes in element
/// order: the nibble (Q4_K), the 5-bit value (Q5_K), or the unsigned 6-bit value (Q6_K, whose
/// `w` is this minus 32: the kernel subtracts 32 times the activations' lane sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_weights<const T: u8>(op: &Operands, row: usize, s: usize, t: usize) -> (__m256i, __m256i) {
    // SAFETY: as for `kweights`.
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let g = row * (op.nb / 8) + s;
        if T == T_Q6_K {
            // Blocks 4h + k of half h: low nibbles of the 32 bytes at 32k (k = 0, 1), then
            // high nibbles (k = 2, 3); bits 2k, 2k + 1 of the half's 32 `qh` bytes on top.
            let (half, k) = (t / 4, t % 4);
            let p = op.qs.as_ptr().add(g * 128 + 64 * half);
            let h = op.qh.as_ptr().add(g * 64 + 32 * half);
            if k == 0 {
                _mm_prefetch::<PREFETCH_HINT>(p.cast::<i8>().wrapping_add(PREFETCH));
                _mm_prefetch::<PREFETCH_HINT>(h.cast::<i8>().wrapping_add(PREFETCH / 2));
            }
            let (q0, q1) = (_mm256_loadu_si256(p as *const __m256i), _mm256_loadu_si256(p.add(32) as *const __m256i));
            let (q0, q1) = if k == 0 { (q0, q1) } else { (_mm256_srli_epi16::<4>(q0), _mm256_srli_epi16::<4>(q1)) };
            let qh = _mm256_loadu_si256(h as *const __m256i);
            let three = _mm256_set1_epi8(3);
            let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k as i32)), three);
            let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k as i32 + 2)), three);
            return (
                _mm256_or_si256(_mm256_and_si256(q0, low), _mm256_slli_epi16::<4>(h0)),
                _mm256_or_si256(_mm256_and_si256(q1, low), _mm256_slli_epi16::<4>(h1)),
            );
        }
        let p = op.qs.as_ptr().add(g * 128 + 16 * t);
        _mm_prefetch::<PREFETCH_HINT>(p.cast::<i8>().wrapping_add(PREFETCH));
        let q = _mm256_loadu_si256(p as *const __m256i);
        let (w0, w1) = (_mm256_and_si256(q, low), _mm256_and_si256(_mm256_srli_epi16::<4>(q), low));
        if T == T_Q5_K {
            let qh = _mm256_loadu_si256(op.qh.as_ptr().add(g * 32) as *const __m256i);
            let one = _mm256_set1_epi8(1);
            let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(t as i32)), one);
            let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(t as i32 + 1)), one);
            return (_mm256_or_si256(w0, _mm256_slli_epi16::<4>(h0)), _mm256_or_si256(w1, _mm256_slli_epi16::<4>(h1)));
        }
        (w0, w1)
    }
}

/// Blocks per span: whole units, at most [`CHUNK`] of them when a unit fits, else one unit
/// (taken in chunks of [`CHUNK`], even, so block parity carries over). A unit never straddles
/// two spans, and chunks never straddle a span boundary.
fn span_for(unit: usize) -> usize {
    if unit <= CHUNK {
        CHUNK / unit * unit
    } else {
        unit
    }
}

/// One kernel module per instruction set: the same code around a different integer dot
/// product (`$dot(acc, u, s)` adds the eight lanes of `u` (unsigned bytes) times `s` (signed
/// bytes), four products a lane, to `acc`).
macro_rules! kernels {
    ($name:ident, $features:literal, |$acc:ident, $u:ident, $s:ident| $dot:expr) => {
        mod $name {
            use super::*;

            #[inline]
            #[target_feature(enable = $features)]
            fn dot($acc: __m256i, $u: __m256i, $s: __m256i) -> __m256i {
                $dot
            }

            /// Lanes of signed weight bytes `w` with activations `a` (the sign trick).
            #[inline]
            #[target_feature(enable = $features)]
            fn dot_signed(w: __m256i, a: __m256i) -> __m256i {
                dot(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
            }

            /// Lanes of one 32-byte register of nibbles `nib` (Q4_1) or `nib - 8` (Q4_0) with
            /// activation bytes `a`.
            #[inline]
            #[target_feature(enable = $features)]
            fn dot_nib<const T: u8>(nib: __m256i, a: __m256i) -> __m256i {
                if T == T_Q4_1 {
                    dot(_mm256_setzero_si256(), nib, a)
                } else {
                    dot_signed(_mm256_sub_epi8(nib, _mm256_set1_epi8(8)), a)
                }
            }

            /// Steps 1, 3 and 4 for blocks `c0..c0 + n` of `R` rows, whose scales start at
            /// block `off` of `sc` and `sp` (even): Q4 rows two blocks a step into `x`/`y` (see
            /// the module note), Q8_0 rows one block a step into `x` (even blocks, `A`) and `y`
            /// (odd, `B`).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn accumulate<const T: u8, const R: usize>(
                op: &Operands,
                r0: usize,
                (c0, n, off): (usize, usize, usize),
                (sc, sp): (&[Scales; ROWS], &[f32; 4 * CHUNK]),
                x: &mut [__m256; R],
                y: &mut [__m256; R],
            ) {
                // SAFETY: the caller keeps this function's contract: the CPU has the features it is
                // compiled for (`dot_rows` checks), and every index it reads lies within `op`'s rows and
                // blocks (`operands` checks).
                unsafe {
                    let qb = if T == T_Q8_0 { 32 } else { 16 };
                    let row_q = op.nb * qb;
                    let qs = op.qs.as_ptr().add(r0 * row_q);
                    let aq = op.aq.as_ptr();
                    let mut j = 0;
                    while j < n {
                        let b = c0 + j;
                        let pair = j + 1 < n;
                        if T == T_Q8_0 {
                            let a0 = _mm256_loadu_si256(aq.add(b * 32) as *const __m256i);
                            for i in 0..R {
                                let p = qs.add(i * row_q + b * 32);
                                _mm_prefetch::<PREFETCH_HINT>(p.cast::<i8>().wrapping_add(PREFETCH));
                                let l = _mm256_cvtepi32_ps(dot_signed(_mm256_loadu_si256(p as *const __m256i), a0));
                                x[i] = _mm256_fmadd_ps(_mm256_set1_ps(sc[i].c[off + j]), l, x[i]);
                            }
                            if pair {
                                let a1 = _mm256_loadu_si256(aq.add(b * 32 + 32) as *const __m256i);
                                for i in 0..R {
                                    let p = qs.add(i * row_q + b * 32 + 32);
                                    let l = _mm256_cvtepi32_ps(dot_signed(_mm256_loadu_si256(p as *const __m256i), a1));
                                    y[i] = _mm256_fmadd_ps(_mm256_set1_ps(sc[i].c[off + j + 1]), l, y[i]);
                                }
                            }
                        } else {
                            // An odd last block pairs with a zero block: zero quants and a zero
                            // scale half, whose fused multiply-adds `fma(0, 0, acc)` leave the odd
                            // accumulators unchanged (a lane is never -0: it starts at +0, and a
                            // nonzero scale times a nonzero integer cannot round to zero).
                            let a0 = _mm256_loadu_si256(aq.add(b * 32) as *const __m256i);
                            let a1 = if pair {
                                _mm256_loadu_si256(aq.add(b * 32 + 32) as *const __m256i)
                            } else {
                                _mm256_setzero_si256()
                            };
                            let alo = _mm256_permute2x128_si256::<0x20>(a0, a1);
                            let ahi = _mm256_permute2x128_si256::<0x31>(a0, a1);
                            let low = _mm256_set1_epi8(0x0F);
                            let s1 = _mm256_loadu_ps(sp.as_ptr().add((off + j) * 4));
                            for i in 0..R {
                                let p = qs.add(i * row_q + b * 16);
                                _mm_prefetch::<PREFETCH_HINT>(p.cast::<i8>().wrapping_add(PREFETCH));
                                let v = if pair {
                                    _mm256_loadu_si256(p as *const __m256i)
                                } else {
                                    _mm256_zextsi128_si256(_mm_loadu_si128(p as *const __m128i))
                                };
                                let lo = _mm256_and_si256(v, low);
                                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                                let s = _mm256_loadu_ps(sc[i].c.as_ptr().add((off + j) * 4));
                                x[i] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot_nib::<T>(lo, alo)), x[i]);
                                y[i] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot_nib::<T>(hi, ahi)), y[i]);
                                if T == T_Q4_1 {
                                    // Step 4: lane 0 of each block (X = [A0.. | B0..]) takes m * s.
                                    let m = _mm256_loadu_ps(sc[i].m.as_ptr().add((off + j) * 4));
                                    x[i] = _mm256_fmadd_ps(m, s1, x[i]);
                                }
                            }
                        }
                        j += 2;
                    }
                }
            }

            /// `t = A + B` from the accumulators' layout.
            #[inline]
            #[target_feature(enable = $features)]
            fn lanes<const T: u8>(x: __m256, y: __m256) -> __m256 {
                if T == T_Q8_0 {
                    _mm256_add_ps(x, y)
                } else {
                    // A = [X.lo | Y.lo], B = [X.hi | Y.hi].
                    _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(x, y), _mm256_permute2f128_ps::<0x31>(x, y))
                }
            }

            /// `R` rows from `r0`: steps 1-5 into `out`, or (`EXACT`) step 6 into `exact`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn group<const T: u8, const R: usize, const EXACT: bool>(
                op: &Operands,
                r0: usize,
                (sc, sp, sp_ready): (&mut [Scales; ROWS], &mut [f32; 4 * CHUNK], bool),
                out: &mut [f32],
                exact: &mut [f64],
            ) {
                // SAFETY: the caller keeps this function's contract: the CPU has the features it is
                // compiled for (`dot_rows` checks), and every index it reads lies within `op`'s rows and
                // blocks (`operands` checks).
                unsafe {
                    let (mut x, mut y) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
                    let mut ex = [_mm256_setzero_pd(); R];
                    let unit = if EXACT { op.unit } else { op.nb };
                    let span = span_for(unit);
                    let mut c0 = 0;
                    while c0 < op.nb {
                        // Chunks restart at every span (whole units), so block parity counts from a
                        // unit's first block even when a unit takes several chunks.
                        let n = CHUNK.min(op.nb - c0).min(span - c0 % span);
                        for i in 0..R {
                            scales::<T>(op, r0 + i, c0, n, &mut sc[i]);
                        }
                        if T == T_Q4_1 && !sp_ready {
                            pair_sums(op, c0, n, sp);
                        }
                        // The units (or the part of one) in this chunk.
                        let mut u = c0;
                        while u < c0 + n {
                            let ue = (u - u % unit + unit).min(op.nb).min(c0 + n);
                            accumulate::<T, R>(op, r0, (u, ue - u, u - c0), (sc, sp), &mut x, &mut y);
                            if EXACT && (ue == op.nb || ue % unit == 0) {
                                for i in 0..R {
                                    to_grid(lanes::<T>(x[i], y[i]), &mut ex[i]);
                                    (x[i], y[i]) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                                }
                            }
                            u = ue;
                        }
                        c0 += n;
                    }
                    for i in 0..R {
                        if EXACT {
                            exact[i] = hsum_pd(ex[i]);
                        } else {
                            out[i] = hsum(lanes::<T>(x[i], y[i]));
                        }
                    }
                }
            }

            /// All rows: groups of four, then one at a time; into `out`, or (`EXACT`) `exact`.
            pub(super) unsafe fn rows<const T: u8, const EXACT: bool>(
                op: &Operands,
                out: &mut [f32],
                exact: &mut [f64],
            ) {
                // SAFETY: the caller keeps this function's contract: the CPU has the features it is
                // compiled for (`dot_rows` checks), and every index it reads lies within `op`'s rows and
                // blocks (`operands` checks).
                unsafe {
                    SCALES.with(|cell| match cell.try_borrow_mut() {
                        Ok(mut sc) => rows_in::<T, EXACT>(op, out, exact, &mut sc),
                        // Not reached (no kernel calls another), but never worth a panic.
                        Err(_) => rows_in::<T, EXACT>(op, out, exact, &mut [NO_SCALES; ROWS]),
                    })
                }
            }

            /// Steps 1-4 for block `b` of `R` rows from `r0` (Q5_0, Q5_1), into
            /// `acc` (the even or the odd accumulators, eight lanes in order).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn kblock<const T: u8, const R: usize>(op: &Operands, r0: usize, b: usize, acc: &mut [__m256; R]) {
                // SAFETY: the caller keeps this function's contract (see `kweights`).
                unsafe {
                    let a = _mm256_loadu_si256(op.aq.as_ptr().add(b * 32) as *const __m256i);
                    let (dx, sx) = (*op.ad.get_unchecked(b), _mm256_set1_ps(*op.as_.get_unchecked(b)));
                    for i in 0..R {
                        let w = kweights::<T>(op, r0 + i, b);
                        let l = if T == T_Q5_0 { dot_signed(w, a) } else { dot(_mm256_setzero_si256(), w, a) };
                        let (c, mw) = kscales::<T>(op, r0 + i, b, dx);
                        acc[i] = _mm256_fmadd_ps(c, _mm256_cvtepi32_ps(l), acc[i]);
                        if T == T_Q5_1 {
                            // Step 4 on lane 0; the other lanes add 0 * s, which leaves them
                            // unchanged (never -0, see `accumulate`).
                            acc[i] = _mm256_fmadd_ps(_mm256_setr_ps(mw, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), sx, acc[i]);
                        }
                    }
                }
            }

            /// `R` rows from `r0` of a Q5_0 or Q5_1 type: steps 1-5 into `out`, or
            /// (`EXACT`) step 6 into `exact`; even blocks of a unit into `x`, odd into `y`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn kgroup<const T: u8, const R: usize, const EXACT: bool>(
                op: &Operands,
                r0: usize,
                out: &mut [f32],
                exact: &mut [f64],
            ) {
                // SAFETY: the caller keeps this function's contract (see `kweights`).
                unsafe {
                    let (mut x, mut y) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
                    let mut ex = [_mm256_setzero_pd(); R];
                    let unit = if EXACT { op.unit } else { op.nb };
                    let mut u0 = 0;
                    while u0 < op.nb {
                        let ue = (u0 + unit).min(op.nb);
                        let mut b = u0;
                        while b < ue {
                            kblock::<T, R>(op, r0, b, &mut x);
                            if b + 1 < ue {
                                kblock::<T, R>(op, r0, b + 1, &mut y);
                            }
                            b += 2;
                        }
                        if EXACT {
                            end_unit(&mut x, &mut y, &mut ex);
                        }
                        u0 = ue;
                    }
                    finish_rows::<R, EXACT>(&x, &y, &ex, out, exact);
                }
            }

            /// `R` rows from `r0` of a K-quant type, a super-block (eight blocks) at a time:
            /// the super-block's scales for its eight blocks in a few vector operations, one
            /// load of quants for a block pair (Q4_K, Q5_K) and the activations' lane sums once
            /// for all rows (Q6_K). Each lane sees the same operations as in `kgroup`, in the same
            /// order: steps 1-5 into `out`, or (`EXACT`) step 6 into `exact` in units of
            /// `op.unit` blocks (even, so a unit ends after a block pair).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn sgroup<const T: u8, const R: usize, const EXACT: bool>(
                op: &Operands,
                r0: usize,
                out: &mut [f32],
                exact: &mut [f64],
            ) {
                // SAFETY: the caller keeps this function's contract (see `kweights`); `operands`
                // checked that rows hold whole super-blocks.
                unsafe {
                    let (mut x, mut y) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
                    let mut ex = [_mm256_setzero_pd(); R];
                    let unit = if EXACT { op.unit } else { op.nb };
                    let zero = SuperScales { c: [_mm256_setzero_ps(); 8], mw: [0.0; 8] };
                    let mut ss = [zero; R];
                    let has_min = T == T_Q4_K || T == T_Q5_K;
                    // Where the current unit ends (counted, not `b % unit`: a division per
                    // block pair cost a third of the kernel's time).
                    let mut unit_end = unit.min(op.nb);
                    for s in 0..op.nb / 8 {
                        let b0 = 8 * s;
                        for (i, si) in ss.iter_mut().enumerate() {
                            super_scales::<T>(op, r0 + i, s, b0, si);
                        }
                        for t in [0, 2, 4, 6] {
                            let b = b0 + t;
                            let a0 = _mm256_loadu_si256(op.aq.as_ptr().add(b * 32) as *const __m256i);
                            let a1 = _mm256_loadu_si256(op.aq.as_ptr().add(b * 32 + 32) as *const __m256i);
                            // Q6_K: 32 times the activations' lane sums, taken from every row's lanes.
                            let ones = _mm256_set1_epi8(1);
                            let (z0, z1) = if T == T_Q6_K {
                                (
                                    _mm256_slli_epi32::<5>(dot(_mm256_setzero_si256(), ones, a0)),
                                    _mm256_slli_epi32::<5>(dot(_mm256_setzero_si256(), ones, a1)),
                                )
                            } else {
                                (_mm256_setzero_si256(), _mm256_setzero_si256())
                            };
                            let s0 = _mm256_set1_ps(*op.as_.get_unchecked(b));
                            let s1 = _mm256_set1_ps(*op.as_.get_unchecked(b + 1));
                            for i in 0..R {
                                let (w0, w1) = pair_weights::<T>(op, r0 + i, s, t);
                                let l0 = _mm256_sub_epi32(dot(_mm256_setzero_si256(), w0, a0), z0);
                                let l1 = _mm256_sub_epi32(dot(_mm256_setzero_si256(), w1, a1), z1);
                                x[i] = _mm256_fmadd_ps(ss[i].c[t], _mm256_cvtepi32_ps(l0), x[i]);
                                if has_min {
                                    // Step 4 on lane 0; the other lanes add 0 * s (see `kblock`).
                                    let m0 = _mm256_zextps128_ps256(_mm_load_ss(&ss[i].mw[t]));
                                    x[i] = _mm256_fmadd_ps(m0, s0, x[i]);
                                }
                                y[i] = _mm256_fmadd_ps(ss[i].c[t + 1], _mm256_cvtepi32_ps(l1), y[i]);
                                if has_min {
                                    let m1 = _mm256_zextps128_ps256(_mm_load_ss(&ss[i].mw[t + 1]));
                                    y[i] = _mm256_fmadd_ps(m1, s1, y[i]);
                                }
                            }
                            if EXACT && b + 2 == unit_end {
                                end_unit(&mut x, &mut y, &mut ex);
                                unit_end = (unit_end + unit).min(op.nb);
                            }
                        }
                    }
                    finish_rows::<R, EXACT>(&x, &y, &ex, out, exact);
                }
            }

            /// All rows of a 5/6-bit or K-quant type: groups of four, then one at a time.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn krows<const T: u8, const EXACT: bool>(
                op: &Operands,
                out: &mut [f32],
                exact: &mut [f64],
            ) {
                // SAFETY: the caller keeps this function's contract (see `kweights`).
                unsafe {
                    let n = if EXACT { exact.len() } else { out.len() };
                    let super_blocks = T == T_Q4_K || T == T_Q5_K || T == T_Q6_K;
                    let rows = if super_blocks { SUPER_ROWS } else { ROWS };
                    let mut r = 0;
                    while r < n {
                        let k = if r + rows <= n { rows } else { 1 };
                        let (o, e) =
                            if EXACT { (&mut [][..], &mut exact[r..r + k]) } else { (&mut out[r..r + k], &mut [][..]) };
                        match (super_blocks, k) {
                            (true, SUPER_ROWS) => sgroup::<T, SUPER_ROWS, EXACT>(op, r, o, e),
                            (true, _) => sgroup::<T, 1, EXACT>(op, r, o, e),
                            (false, ROWS) => kgroup::<T, ROWS, EXACT>(op, r, o, e),
                            (false, _) => kgroup::<T, 1, EXACT>(op, r, o, e),
                        }
                        r += k;
                    }
                }
            }

            #[target_feature(enable = $features)]
            unsafe fn rows_in<const T: u8, const EXACT: bool>(
                op: &Operands,
                out: &mut [f32],
                exact: &mut [f64],
                sc: &mut [Scales; ROWS],
            ) {
                // SAFETY: the caller keeps this function's contract: the CPU has the features it is
                // compiled for (`dot_rows` checks), and every index it reads lies within `op`'s rows and
                // blocks (`operands` checks).
                unsafe {
                    let n = if EXACT { exact.len() } else { out.len() };
                    // Q4_1's activation sums depend on the chunk, not the row: when one chunk
                    // covers the rows, they are laid out once for every group.
                    let mut sp = [0f32; 4 * CHUNK];
                    let unit = if EXACT { op.unit } else { op.nb };
                    let sp_ready = T == T_Q4_1 && op.nb <= CHUNK.min(span_for(unit));
                    if sp_ready {
                        pair_sums(op, 0, op.nb, &mut sp);
                    }
                    let mut r = 0;
                    while r < n {
                        let k = if r + ROWS <= n { ROWS } else { 1 };
                        let (o, e) =
                            if EXACT { (&mut [][..], &mut exact[r..r + k]) } else { (&mut out[r..r + k], &mut [][..]) };
                        if k == ROWS {
                            group::<T, ROWS, EXACT>(op, r, (sc, &mut sp, sp_ready), o, e);
                        } else {
                            group::<T, 1, EXACT>(op, r, (sc, &mut sp, sp_ready), o, e);
                        }
                        r += k;
                    }
                }
            }
        }
    };
}

kernels!(avx2, "avx2,fma,f16c", |acc, u, s| _mm256_add_epi32(
    acc,
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
));
kernels!(vnni, "avx2,fma,f16c,avxvnni", |acc, u, s| _mm256_dpbusd_avx_epi32(acc, u, s));
kernels!(vnni512, "avx2,fma,f16c,avx512vnni,avx512vl", |acc, u, s| _mm256_dpbusd_epi32(acc, u, s));

/// Keeps `reduce8` (the portable statement of step 5) and `hsum` visibly the same formula.
#[cfg(test)]
#[test]
fn hsum_is_reduce8() {
    if !has_avx2() {
        return;
    }
    let t = [1e8f32, 3.0, -1e8, 7.5, 0.25, -3.0, 1.0, 1e-3];
    // SAFETY: AVX2 checked above; the array holds 8 floats.
    let h = unsafe { hsum(_mm256_loadu_ps(t.as_ptr())) };
    assert_eq!(h.to_bits(), super::reduce8(t).to_bits());
}
