//! aarch64 kernels (the Macs): Advanced SIMD, with `sdot` where the dot-product extension
//! exists (every Apple M-series chip), otherwise `smull` and pairwise adds.
//!
//! Same structure as the x86 kernels: four rows share each activation block load; per row and
//! block two 16-byte halves give four exact i32 lanes each (elements 4k..4k+3, step 1 of
//! [`super`]), converted and fused-multiply-added into the row's accumulators.

use std::arch::aarch64::*;
use std::arch::asm;

use super::Operands;
use crate::quant::rows::h2f;
use crate::quant::GgmlType;

/// Most blocks whose scales are prepared at once (even, see the x86 kernels).
const CHUNK: usize = 64;
/// Rows multiplied together.
const ROWS: usize = 4;
/// Bytes ahead of the quants being read to prefetch (see the x86 kernels).
const PREFETCH: usize = 4096;

/// Asks for the cache line at `p` (never faults, so any address will do).
#[inline]
unsafe fn prefetch(p: *const u8) {
    // SAFETY: a prefetch hint reads nothing architecturally and cannot fault.
    unsafe {
        asm!("prfm pldl1keep, [{p}]", p = in(reg) p, options(nostack, preserves_flags, readonly));
    }
}

pub(super) fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

const T_Q4_0: u8 = 0;
const T_Q4_1: u8 = 1;
const T_Q8_0: u8 = 2;
const T_Q5_0: u8 = 3;
const T_Q5_1: u8 = 4;
const T_Q4_K: u8 = 5;
const T_Q5_K: u8 = 6;
const T_Q6_K: u8 = 7;

/// Runs the kernel for `op` (with `sdot` when `dot`): into `out` (steps 1-5), or, when `out`
/// is empty, into `exact` (step 6, units of `op.unit` blocks).
pub(super) fn dot_rows(op: &Operands, dot: bool, out: &mut [f32], exact: &mut [f64]) {
    assert!(!dot || has_dotprod(), "caller checked Isa::available");
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
    // SAFETY: Advanced SIMD is part of every aarch64 target, the dot-product extension was
    // asserted above when used; `Operands` holds `out.len()` (or `exact.len()`) rows of `nb`
    // blocks (checked by `operands`), which is every index the kernels touch.
    unsafe {
        if dot {
            per_type!(sdot)
        } else {
            per_type!(smull)
        }
    }
}

/// Step 6 for one row's unit: the lanes `lo` (0-3), `hi` (4-7) rounded to the grid (ties to
/// even) and added to the four f64 accumulators `acc` (lanes 0-1, 2-3).
#[inline]
unsafe fn to_grid(lo: float32x4_t, hi: float32x4_t, acc: &mut [float64x2_t; 2]) {
    // SAFETY: register-only Advanced SIMD, which every aarch64 target has.
    unsafe {
        let scale = vdupq_n_f64((1u64 << super::GRID_BITS) as f64);
        for v in [lo, hi] {
            let g0 = vrndnq_f64(vmulq_f64(vcvt_f64_f32(vget_low_f32(v)), scale));
            let g1 = vrndnq_f64(vmulq_f64(vcvt_high_f64_f32(v), scale));
            acc[0] = vaddq_f64(acc[0], g0);
            acc[1] = vaddq_f64(acc[1], g1);
        }
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

/// Four f16 bit patterns to f32 (exact). FCVTL from half precision is base Advanced SIMD;
/// the intrinsic (`vcvt_f32_f16`) is not stable Rust yet.
#[inline]
unsafe fn f16x4(p: *const u16) -> float32x4_t {
    // SAFETY: the caller keeps this function's contract: every pointer it reads lies within
    // `op`'s rows and blocks (`operands` checks), and `sdot` runs only where `dot_rows`
    // checked for it.
    unsafe {
        let h = vld1_u16(p);
        let out: float32x4_t;
        // SAFETY: a register-only conversion (no memory, no stack, no flags).
        asm!("fcvtl {o:v}.4s, {h:v}.4h", o = out(vreg) out, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
        out
    }
}

/// Block `b` of row `row` of a 5/6-bit or K-quant type as two signed 16-byte halves (elements
/// 0..15, 16..31) holding the integers `w` of step 1.
#[inline]
unsafe fn kweights<const T: u8>(op: &Operands, row: usize, b: usize) -> (int8x16_t, int8x16_t) {
    // SAFETY: the caller keeps this function's contract: every pointer it reads lies within
    // `op`'s rows and blocks (`operands` checks: each plane holds whole groups of every row).
    unsafe {
        let low = vdupq_n_u8(0x0F);
        let s8 = vreinterpretq_s8_u8;
        if T == T_Q5_0 || T == T_Q5_1 {
            let blk = row * op.nb + b;
            let p = op.qs.as_ptr().add(blk * 16);
            prefetch(p.wrapping_add(PREFETCH));
            let q = vld1q_u8(p);
            let qh = op.qh.as_ptr().add(blk * 4);
            // Bit e of qh -> 0x10 in byte e.
            let bit = vcombine_u8(vcreate_u8(0x8040201008040201), vcreate_u8(0x8040201008040201));
            let hb =
                |b0: u8, b1: u8| vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1)), bit), vdupq_n_u8(0x10));
            let lo = vorrq_u8(vandq_u8(q, low), hb(*qh, *qh.add(1)));
            let hi = vorrq_u8(vshrq_n_u8::<4>(q), hb(*qh.add(2), *qh.add(3)));
            return if T == T_Q5_0 {
                (vsubq_s8(s8(lo), vdupq_n_s8(16)), vsubq_s8(s8(hi), vdupq_n_s8(16)))
            } else {
                (s8(lo), s8(hi))
            };
        }
        let (g, t) = (row * (op.nb / 8) + b / 8, b % 8);
        if T == T_Q6_K {
            let (half, qq) = (t / 4, t % 4);
            let p = op.qs.as_ptr().add(g * 128 + 64 * half + 32 * (qq % 2));
            prefetch(p.wrapping_add(PREFETCH));
            let h = op.qh.as_ptr().add(g * 64 + 32 * half);
            prefetch(h.wrapping_add(PREFETCH / 2));
            let shift = vdupq_n_s8(-(2 * qq as i8));
            let one = |q: uint8x16_t, qh: uint8x16_t| {
                let lo = if qq < 2 { vandq_u8(q, low) } else { vshrq_n_u8::<4>(q) };
                let hb = vshlq_n_u8::<4>(vandq_u8(vshlq_u8(qh, shift), vdupq_n_u8(3)));
                vsubq_s8(s8(vorrq_u8(lo, hb)), vdupq_n_s8(32))
            };
            return (one(vld1q_u8(p), vld1q_u8(h)), one(vld1q_u8(p.add(16)), vld1q_u8(h.add(16))));
        }
        // Q4_K, Q5_K.
        let p = op.qs.as_ptr().add(g * 128 + 32 * (t / 2));
        prefetch(p.wrapping_add(PREFETCH));
        let shift = vdupq_n_s8(-(t as i8));
        let one = |q: uint8x16_t, qh: *const u8| {
            let v = if t % 2 == 0 { vandq_u8(q, low) } else { vshrq_n_u8::<4>(q) };
            if T == T_Q5_K {
                s8(vorrq_u8(v, vshlq_n_u8::<4>(vandq_u8(vshlq_u8(vld1q_u8(qh), shift), vdupq_n_u8(1)))))
            } else {
                s8(v)
            }
        };
        let qh = op.qh.as_ptr().wrapping_add(g * 32); // read only for Q5_K
        (one(vld1q_u8(p), qh), one(vld1q_u8(p.add(16)), qh.wrapping_add(16)))
    }
}

/// Step 5 of the arithmetic: `u = lo + hi`, then `(u0 + u2) + (u1 + u3)`.
#[inline]
unsafe fn hsum(lo: float32x4_t, hi: float32x4_t) -> f32 {
    // SAFETY: register-only Advanced SIMD, which every aarch64 target has.
    unsafe {
        let u = vaddq_f32(lo, hi);
        let v = vadd_f32(vget_low_f32(u), vget_high_f32(u)); // (u0 + u2, u1 + u3)
        vget_lane_f32::<0>(v) + vget_lane_f32::<1>(v)
    }
}

/// Four lanes of `w * a` (signed bytes), four products a lane, with `sdot`.
#[inline]
#[target_feature(enable = "dotprod")]
unsafe fn dot_sdot(w: int8x16_t, a: int8x16_t) -> int32x4_t {
    // SAFETY: the caller checked the dot-product extension (`dot_rows`); registers only.
    unsafe {
        let mut acc = vdupq_n_s32(0);
        // SAFETY: a register-only instruction of the dot-product extension, which this function's
        // target feature requires of its callers.
        asm!("sdot {acc:v}.4s, {w:v}.16b, {a:v}.16b", acc = inout(vreg) acc, w = in(vreg) w, a = in(vreg) a,
         options(pure, nomem, nostack, preserves_flags));
        acc
    }
}

/// The same lanes with base instructions: 16-bit products, then two pairwise adds. A pair of
/// products is at most 2 * 128 * 127, which fits an i16.
#[inline]
unsafe fn dot_smull(w: int8x16_t, a: int8x16_t) -> int32x4_t {
    // SAFETY: register-only Advanced SIMD, which every aarch64 target has.
    unsafe {
        let p0 = vmull_s8(vget_low_s8(w), vget_low_s8(a));
        let p1 = vmull_high_s8(w, a);
        vpaddlq_s16(vpaddq_s16(p0, p1))
    }
}

macro_rules! kernels {
    ($name:ident, $($feature:literal)?, $dot:ident) => {
        mod $name {
            use super::*;

            /// The block's weights at `p` as two signed 16-byte halves (elements 0..15, 16..31).
            #[inline]
            $(#[target_feature(enable = $feature)])?
            unsafe fn weights<const T: u8>(p: *const u8) -> (int8x16_t, int8x16_t) {
                // SAFETY: the caller keeps this function's contract: every pointer it reads lies within
                // `op`'s rows and blocks (`operands` checks), and `sdot` runs only where `dot_rows`
                // checked for it.
                unsafe {
                if T == T_Q8_0 {
                    return (vld1q_s8(p as *const i8), vld1q_s8((p as *const i8).add(16)));
                }
                let q = vld1q_u8(p);
                let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
                let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
                if T == T_Q4_1 {
                    (lo, hi)
                } else {
                    (vsubq_s8(lo, vdupq_n_s8(8)), vsubq_s8(hi, vdupq_n_s8(8)))
                }
                }
            }

            /// Step 2 for blocks `c0..c0 + n` of row `i` into `sc` (see the x86 twin).
            #[inline]
            $(#[target_feature(enable = $feature)])?
            unsafe fn scales(op: &Operands, i: usize, c0: usize, n: usize, sc: &mut [f32; CHUNK]) {
                // SAFETY: the caller keeps this function's contract: every pointer it reads lies within
                // `op`'s rows and blocks (`operands` checks), and `sdot` runs only where `dot_rows`
                // checked for it.
                unsafe {
                let (d, dx) = (op.d.as_ptr().add(i * op.nb + c0), op.ad.as_ptr().add(c0));
                let mut j = 0;
                while j + 4 <= n {
                    vst1q_f32(sc.as_mut_ptr().add(j), vmulq_f32(f16x4(d.add(j)), vld1q_f32(dx.add(j))));
                    j += 4;
                }
                for b in j..n {
                    sc[b] = h2f(*d.add(b)) * *dx.add(b);
                }
                }
            }

            /// Steps 1, 3 and 4 for blocks `c0..c0 + n` of `R` rows, whose scales start at block
            /// `off` of `sc`; block parity counts from `c0`.
            #[inline]
            $(#[target_feature(enable = $feature)])?
            unsafe fn accumulate<const T: u8, const R: usize>(
                op: &Operands,
                r0: usize,
                (c0, n, off): (usize, usize, usize),
                sc: &[[f32; CHUNK]; ROWS],
                acc: &mut [[float32x4_t; 4]; R],
            ) {
                // SAFETY: the caller keeps this function's contract: every pointer it reads lies within
                // `op`'s rows and blocks (`operands` checks), and `sdot` runs only where `dot_rows`
                // checked for it.
                unsafe {
                let qb = if T == T_Q8_0 { 32 } else { 16 };
                let row_q = op.nb * qb;
                let qs = op.qs.as_ptr().add(r0 * row_q);
                let aq = op.aq.as_ptr();
                for j in 0..n {
                    let b = c0 + j;
                    let a0 = vld1q_s8(aq.add(b * 32));
                    let a1 = vld1q_s8(aq.add(b * 32 + 16));
                    let par = 2 * (j % 2); // [even lo, even hi, odd lo, odd hi]
                    for i in 0..R {
                        let p = qs.add(i * row_q + b * qb);
                        prefetch(p.wrapping_add(PREFETCH));
                        let (w0, w1) = weights::<T>(p);
                        let l0 = vcvtq_f32_s32($dot(w0, a0));
                        let l1 = vcvtq_f32_s32($dot(w1, a1));
                        let s = vdupq_n_f32(sc[i][off + j]);
                        acc[i][par] = vfmaq_f32(acc[i][par], l0, s);
                        acc[i][par + 1] = vfmaq_f32(acc[i][par + 1], l1, s);
                        if T == T_Q4_1 {
                            // Step 4: lane 0 of the block's accumulator takes m * s.
                            let m = h2f(*op.m.get_unchecked((r0 + i) * op.nb + b));
                            let l = m.mul_add(*op.as_.get_unchecked(b), vgetq_lane_f32::<0>(acc[i][par]));
                            acc[i][par] = vsetq_lane_f32::<0>(l, acc[i][par]);
                        }
                    }
                }
                }
            }

            /// Steps 1-4 for block `b` (position `j` in its unit) of `R` rows from `r0` (5/6-bit
            /// and K-quant types). A K-quant row's terms are made once a super-block, into
            /// `terms` (at its first block, or the first of a unit that starts inside one).
            #[inline]
            $(#[target_feature(enable = $feature)])?
            unsafe fn kblock<const T: u8, const R: usize>(
                op: &Operands,
                r0: usize,
                (b, j): (usize, usize),
                acc: &mut [[float32x4_t; 4]; R],
                terms: &mut [[([f32; 2], f32); 8]; R],
            ) {
                // SAFETY: as for `kweights`; `sdot` runs only where `dot_rows` checked for it.
                unsafe {
                    let a0 = vld1q_s8(op.aq.as_ptr().add(b * 32));
                    let a1 = vld1q_s8(op.aq.as_ptr().add(b * 32 + 16));
                    let (dx, sx) = (*op.ad.get_unchecked(b), *op.as_.get_unchecked(b));
                    let par = 2 * (j % 2);
                    let k_quant = T == T_Q4_K || T == T_Q5_K || T == T_Q6_K;
                    if k_quant && (b % 8 == 0 || j == 0) {
                        for i in 0..R {
                            terms[i] = super::super::kscales_super(op, r0 + i, b / 8);
                        }
                    }
                    for i in 0..R {
                        let (w0, w1) = kweights::<T>(op, r0 + i, b);
                        let l0 = vcvtq_f32_s32($dot(w0, a0));
                        let l1 = vcvtq_f32_s32($dot(w1, a1));
                        let (c, mw) = if k_quant { terms[i][b % 8] } else { super::super::kscales(op, r0 + i, b, dx) };
                        acc[i][par] = vfmaq_f32(acc[i][par], l0, vdupq_n_f32(c[0]));
                        acc[i][par + 1] = vfmaq_f32(acc[i][par + 1], l1, vdupq_n_f32(c[1]));
                        if T == T_Q5_1 || T == T_Q4_K || T == T_Q5_K {
                            let l = mw.mul_add(sx, vgetq_lane_f32::<0>(acc[i][par]));
                            acc[i][par] = vsetq_lane_f32::<0>(l, acc[i][par]);
                        }
                    }
                }
            }

            /// `R` rows from `r0` of a 5/6-bit or K-quant type: steps 1-5 into `out`, or
            /// (`EXACT`) step 6 into `exact`.
            #[inline]
            $(#[target_feature(enable = $feature)])?
            unsafe fn kgroup<const T: u8, const R: usize, const EXACT: bool>(
                op: &Operands,
                r0: usize,
                out: &mut [f32],
                exact: &mut [f64],
            ) {
                // SAFETY: as for `kblock`.
                unsafe {
                let z = vdupq_n_f32(0.0);
                let mut acc = [[z; 4]; R];
                let mut ex = [[vdupq_n_f64(0.0); 2]; R];
                let mut terms = [[([0f32; 2], 0f32); 8]; R];
                let unit = if EXACT { op.unit } else { op.nb };
                let mut u0 = 0;
                while u0 < op.nb {
                    let ue = (u0 + unit).min(op.nb);
                    for b in u0..ue {
                        kblock::<T, R>(op, r0, (b, b - u0), &mut acc, &mut terms);
                    }
                    if EXACT {
                        for i in 0..R {
                            let a = &acc[i];
                            to_grid(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]), &mut ex[i]);
                            acc[i] = [z; 4];
                        }
                    }
                    u0 = ue;
                }
                for i in 0..R {
                    if EXACT {
                        let u = vaddq_f64(ex[i][0], ex[i][1]);
                        exact[i] = vgetq_lane_f64::<0>(u) + vgetq_lane_f64::<1>(u);
                    } else {
                        let a = &acc[i];
                        out[i] = hsum(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
                    }
                }
                }
            }

            /// All rows of a 5/6-bit or K-quant type: groups of four, then one at a time.
            $(#[target_feature(enable = $feature)])?
            pub(super) unsafe fn krows<const T: u8, const EXACT: bool>(op: &Operands, out: &mut [f32], exact: &mut [f64]) {
                // SAFETY: as for `kblock`.
                unsafe {
                let n = if EXACT { exact.len() } else { out.len() };
                let mut r = 0;
                while r < n {
                    let k = if r + ROWS <= n { ROWS } else { 1 };
                    let (o, e) = if EXACT { (&mut [][..], &mut exact[r..r + k]) } else { (&mut out[r..r + k], &mut [][..]) };
                    if k == ROWS {
                        kgroup::<T, ROWS, EXACT>(op, r, o, e);
                    } else {
                        kgroup::<T, 1, EXACT>(op, r, o, e);
                    }
                    r += k;
                }
                }
            }

            /// `R` rows from `r0`: steps 1-5 into `out`, or (`EXACT`) step 6 into `exact`
            /// (the loop structure of the x86 twin).
            #[inline]
            $(#[target_feature(enable = $feature)])?
            unsafe fn group<const T: u8, const R: usize, const EXACT: bool>(
                op: &Operands,
                r0: usize,
                sc: &mut [[f32; CHUNK]; ROWS],
                out: &mut [f32],
                exact: &mut [f64],
            ) {
                // SAFETY: the caller keeps this function's contract: every pointer it reads lies within
                // `op`'s rows and blocks (`operands` checks), and `sdot` runs only where `dot_rows`
                // checked for it.
                unsafe {
                let z = vdupq_n_f32(0.0);
                let mut acc = [[z; 4]; R];
                let mut ex = [[vdupq_n_f64(0.0); 2]; R];
                let unit = if EXACT { op.unit } else { op.nb };
                let span = span_for(unit);
                let mut c0 = 0;
                while c0 < op.nb {
                    let n = CHUNK.min(op.nb - c0).min(span - c0 % span);
                    for i in 0..R {
                        scales(op, r0 + i, c0, n, &mut sc[i]);
                    }
                    let mut u = c0;
                    while u < c0 + n {
                        let ue = (u - u % unit + unit).min(op.nb).min(c0 + n);
                        accumulate::<T, R>(op, r0, (u, ue - u, u - c0), sc, &mut acc);
                        if EXACT && (ue == op.nb || ue % unit == 0) {
                            for i in 0..R {
                                let a = &acc[i];
                                to_grid(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]), &mut ex[i]);
                                acc[i] = [z; 4];
                            }
                        }
                        u = ue;
                    }
                    c0 += n;
                }
                for i in 0..R {
                    if EXACT {
                        // (e0 + e2) + (e1 + e3).
                        let u = vaddq_f64(ex[i][0], ex[i][1]);
                        exact[i] = vgetq_lane_f64::<0>(u) + vgetq_lane_f64::<1>(u);
                        continue;
                    }
                    let a = &acc[i];
                    out[i] = hsum(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
                }
                }
            }

            /// All rows: groups of four, then one at a time; into `out`, or (`EXACT`) `exact`.
            $(#[target_feature(enable = $feature)])?
            pub(super) unsafe fn rows<const T: u8, const EXACT: bool>(op: &Operands, out: &mut [f32], exact: &mut [f64]) {
                // SAFETY: the caller keeps this function's contract: every pointer it reads lies within
                // `op`'s rows and blocks (`operands` checks), and `sdot` runs only where `dot_rows`
                // checked for it.
                unsafe {
                // Scale buffers, zeroed once per call rather than once per group.
                let mut sc = [[0f32; CHUNK]; ROWS];
                let n = if EXACT { exact.len() } else { out.len() };
                let mut r = 0;
                while r < n {
                    let k = if r + ROWS <= n { ROWS } else { 1 };
                    let (o, e) = if EXACT { (&mut [][..], &mut exact[r..r + k]) } else { (&mut out[r..r + k], &mut [][..]) };
                    if k == ROWS {
                        group::<T, ROWS, EXACT>(op, r, &mut sc, o, e);
                    } else {
                        group::<T, 1, EXACT>(op, r, &mut sc, o, e);
                    }
                    r += k;
                }
                }
            }
        }
    };
}

kernels!(smull, , dot_smull);
kernels!(sdot, "dotprod", dot_sdot);

/// Keeps `reduce8` (the portable statement of step 5) and `hsum` visibly the same formula.
#[cfg(test)]
#[test]
fn hsum_is_reduce8() {
    let t = [1e8f32, 3.0, -1e8, 7.5, 0.25, -3.0, 1.0, 1e-3];
    // SAFETY: Advanced SIMD is baseline on aarch64; the array holds 8 floats.
    let h = unsafe { hsum(vld1q_f32(t.as_ptr()), vld1q_f32(t.as_ptr().add(4))) };
    assert_eq!(h.to_bits(), super::reduce8(t).to_bits());
}
