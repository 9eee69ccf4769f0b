//! Integer dot products of block-quantised weight rows ([`QuantRows`]) with Q8 activations
//! ([`super::Q8Act`]): the CPU's matrix-vector kernels.
//!
//! # The arithmetic, exactly
//!
//! Every implementation (the portable [`dot_row_scalar`], AVX2, AVX-VNNI, NEON, NEON with
//! `sdot`) returns the same bits, so a machine's choice of instructions never changes a token and
//! the SIMD paths can be tested bit for bit against the scalar one. For a row with blocks `j`:
//!
//! 1. Integers, exact: per block, eight lanes `L[j][k] = sum(w[i] * q[i])` over the block's
//!    elements `i = 4k..4k+3` (element order as in [`super::dequantize`]; `w` the block's
//!    integer weights: the nibble for Q4_1, `nibble - 8` for Q4_0, the i8 for Q8_0, the 5-bit
//!    value for Q5_1 and Q5_K, minus 16 for Q5_0, the nibble for Q4_K, the 6-bit value minus
//!    32 for Q6_K; `q` the activation quants). This grouping is what `pmaddubsw`+`pmaddwd`,
//!    `vpdpbusd` and `sdot` each produce natively.
//! 2. Scales: `c[j][k] = dw[j][k] * d_x[j]` (one rounding), with `dw` the weight scale of the
//!    lane's elements as an exact f32: `f32(d)` for the 32-element types; for the K-quants the
//!    super-block's `f32(d)` times the sub-block's integer scale (an f16 times an integer of at
//!    most 8 bits: exact), the same for all eight lanes except in Q6_K, whose lanes 0-3 and 4-7
//!    lie in two 16-element sub-blocks with scales of their own.
//! 3. Two sets of eight f32 accumulators, even blocks into `A`, odd into `B`, each step a fused
//!    multiply-add `A[k] = fma(c[j][k], f32(L[j][k]), A[k])` (two chains hide the FMA latency).
//! 4. Types with a minimum, right after each block's step 3 on the same accumulator:
//!    `A[0] = fma(mw[j], s_x[j], A[0])` (lane 0 only; a value `dw * w + mw` contributes
//!    `mw * sum(x)` per block), with `mw = f32(m)` for Q4_1 and Q5_1 and
//!    `mw = -(f32(dmin) * mn[t])` (exact) for sub-block `t` of Q4_K and Q5_K.
//! 5. `t[k] = A[k] + B[k]`, `u[k] = t[k] + t[k + 4]`, result `(u0 + u2) + (u1 + u3)`.
//!
//! Integer sums cannot overflow: |w| <= 128 and |q| <= 127 give at most 2 * 128 * 127 in an
//! i16 pair (`pmaddubsw` does not saturate) and 4 * 128 * 127 < 2^24 in a lane (exact in f32).
//!
//! # Tensor parallelism: exact sums for the row-parallel layers
//!
//! A row's value depends only on its own blocks, and [`super::Q8Act`] quantises each block on its
//! own, so a rank holding some blocks of a vector multiplies exactly the integers one rank
//! holding all of it would. Column-parallel layers (q/k/v, gate/up, the output head) compute
//! whole rows, so every TP gets the same bits. Row-parallel layers (o_proj, down_proj) give each
//! rank some *columns*, and their partial sums are added across ranks: in f32 that sum rounds
//! differently at every TP, and with 8-bit activations a last-bit difference can flip the
//! rounding of a quant in the next layer, so texts drift apart within a few dozen tokens. So
//! those layers use [`dot_rows_exact`]:
//!
//! 6. The columns are cut in units (an even number of blocks) that no tensor-parallel split
//!    divides: the fewest query heads making an even number of blocks for o_proj (one head of
//!    64 for SmolLM2; [`crate::shard::exact_head_unit`]), 128 MLP features for down_proj. Each unit
//!    runs steps 1-4 on its own blocks only (parity counted from the unit's first block); then
//!    every lane of `t = A + B` is rounded, ties to even, to a multiple of 2^-[`GRID_BITS`]
//!    (scaled to an integer-valued
//!    f64) and added to four f64 accumulators, lane `k` into `k % 4` (lanes 0-3, then 4-7),
//!    combined as `(e0 + e2) + (e1 + e3)`. Below 2^(53 - 30) = 8.4e6 in magnitude every one of
//!    these sums is exact, so the order does not matter (it is fixed only so that every
//!    instruction set agrees even past that bound); and so is the all_sum of the ranks'
//!    partials (in f64): it has the same bits whatever the split, and so does the model. TP = 1
//!    and TP = N decode bit-identically. The grid (9.3e-10) is far below f32's resolution of
//!    the residual stream these partials are added to.

use std::ops::Range;
use std::sync::OnceLock;

use super::rows::{block_terms, PlaneRefs};
use super::{GgmlType, Q8View, QuantRows, QK};

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;

/// An instruction set the kernels can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, one lane at a time (the reference).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C (`pmaddubsw`/`pmaddwd`).
    Avx2,
    /// x86-64 AVX2 with AVX-VNNI (`vpdpbusd` on 256-bit registers).
    AvxVnni,
    /// x86-64 AVX2 with AVX512-VNNI and AVX512VL (`vpdpbusd` on 256-bit registers, EVEX).
    Avx512Vnni,
    /// aarch64 Advanced SIMD (`smull` + pairwise adds).
    Neon,
    /// aarch64 Advanced SIMD with the dot-product extension (`sdot`; every Apple M-series chip).
    NeonDot,
}

impl Isa {
    /// Every instruction set this machine can run, the portable one first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx2() {
                v.push(Isa::Avx2);
            }
            if x86::has_avx512_vnni() {
                v.push(Isa::Avx512Vnni);
            }
            if x86::has_avx_vnni() {
                v.push(Isa::AvxVnni);
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            v.push(Isa::Neon);
            if aarch64::has_dotprod() {
                v.push(Isa::NeonDot);
            }
        }
        v
    }

    /// The fastest available (detected once). `BOLTCCL_LLM_ISA=scalar|avx2|avxvnni|avx512vnni|neon|neondot`
    /// picks another available one (for comparisons); unknown or unavailable names are ignored.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let avail = Isa::available();
            let wanted = std::env::var("BOLTCCL_LLM_ISA").ok().and_then(|s| Isa::parse(&s));
            wanted.filter(|w| avail.contains(w)).unwrap_or(*avail.last().expect("scalar is always there"))
        })
    }

    /// The x86 kernels' integer dot product for an x86 instruction set.
    #[cfg(target_arch = "x86_64")]
    fn x86_dot(self) -> x86::Dot {
        match self {
            Isa::AvxVnni => x86::Dot::AvxVnni,
            Isa::Avx512Vnni => x86::Dot::Avx512Vnni,
            _ => x86::Dot::Avx2,
        }
    }

    fn parse(s: &str) -> Option<Isa> {
        Some(match s.to_ascii_lowercase().as_str() {
            "scalar" => Isa::Scalar,
            "avx2" => Isa::Avx2,
            "avxvnni" => Isa::AvxVnni,
            "avx512vnni" => Isa::Avx512Vnni,
            "neon" => Isa::Neon,
            "neondot" => Isa::NeonDot,
            _ => return None,
        })
    }
}

/// Unit lane values of [`dot_rows_exact`] are rounded to multiples of `2^-GRID_BITS`.
pub const GRID_BITS: i32 = 30;

/// One call's operands, validated: `rows` consecutive weight rows of `nb` blocks and the
/// activation blocks they multiply.
pub(crate) struct Operands<'a> {
    pub ty: GgmlType,
    pub nb: usize,
    /// Blocks per unit of [`dot_rows_exact`] (ignored by [`dot_rows`]).
    pub unit: usize,
    /// Quants of the rows, row after row.
    pub qs: &'a [u8],
    /// High bits of the rows (Q5_0, Q5_1, Q5_K, Q6_K), else empty.
    pub qh: &'a [u8],
    /// Sub-block scales of the rows (K-quants), else empty.
    pub sc: &'a [u8],
    /// f16 scale bits, one per scale group (block, or K-quant super-block) of each row.
    pub d: &'a [u16],
    /// f16 minimum bits, one per group (Q4_1, Q5_1, Q4_K, Q5_K), else empty.
    pub m: &'a [u16],
    pub aq: &'a [i8],
    pub ad: &'a [f32],
    pub as_: &'a [f32],
}

/// `out[i] = row (rows.start + i) · a`, with steps 1-5 above, on the [`Isa::best`] kernels.
pub fn dot_rows(w: &QuantRows, rows: Range<usize>, a: Q8View, out: &mut [f32]) {
    dot_rows_with(Isa::best(), w, rows, a, out)
}

/// [`dot_rows`] on the given instruction set. Panics if this machine lacks it (see
/// [`Isa::available`]) or the shapes do not match.
pub fn dot_rows_with(isa: Isa, w: &QuantRows, rows: Range<usize>, a: Q8View, out: &mut [f32]) {
    assert!(out.len() == rows.len(), "dot_rows: {} outputs for rows {rows:?}", out.len());
    let op = operands(isa, w, rows, a, w.blocks_per_row());
    match isa {
        Isa::Scalar => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = scalar_row(&op, i);
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => x86::dot_rows(&op, isa.x86_dot(), out, &mut []),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonDot => aarch64::dot_rows(&op, isa == Isa::NeonDot, out, &mut []),
        #[allow(unreachable_patterns)] // every other arm is compiled out on this target
        _ => unreachable!("checked against Isa::available"),
    }
}

/// `out[i]` = row `rows.start + i` times `a` with step 6 above, in units of `unit` blocks: an
/// exact sum in multiples of 2^-[`GRID_BITS`], returned scaled up by 2^[`GRID_BITS`] (an
/// integer-valued f64, which all_sum adds exactly; scale it back after).
pub fn dot_rows_exact(w: &QuantRows, rows: Range<usize>, a: Q8View, unit: usize, out: &mut [f64]) {
    dot_rows_exact_with(Isa::best(), w, rows, a, unit, out)
}

/// [`dot_rows_exact`] on the given instruction set. `unit` must be even (the kernels take
/// blocks in pairs) or cover the whole row.
pub fn dot_rows_exact_with(isa: Isa, w: &QuantRows, rows: Range<usize>, a: Q8View, unit: usize, out: &mut [f64]) {
    assert!(out.len() == rows.len(), "dot_rows_exact: {} outputs for rows {rows:?}", out.len());
    assert!(unit > 0 && (unit.is_multiple_of(2) || unit >= w.blocks_per_row()), "dot_rows_exact: odd unit {unit}");
    let op = operands(isa, w, rows, a, unit);
    match isa {
        Isa::Scalar => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = scalar_row_exact(&op, i);
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => x86::dot_rows(&op, isa.x86_dot(), &mut [], out),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonDot => aarch64::dot_rows(&op, isa == Isa::NeonDot, &mut [], out),
        #[allow(unreachable_patterns)] // every other arm is compiled out on this target
        _ => unreachable!("checked against Isa::available"),
    }
}

/// Checks shapes and the instruction set, and borrows the rows' planes.
fn operands<'a>(isa: Isa, w: &'a QuantRows, rows: Range<usize>, a: Q8View<'a>, unit: usize) -> Operands<'a> {
    let nb = w.blocks_per_row();
    assert!(rows.end <= w.rows(), "dot_rows: rows {rows:?} of {}", w.rows());
    assert!(a.blocks() == nb, "dot_rows: {} activation blocks for rows of {nb}", a.blocks());
    assert!(Isa::available().contains(&isa), "{isa:?} is not available on this machine");
    let p = w.planes_rows(rows);
    Operands {
        ty: w.ty,
        nb,
        unit: unit.min(nb).max(1),
        qs: p.qs,
        qh: p.qh,
        sc: p.sc,
        d: p.d,
        m: p.m,
        aq: a.qs,
        ad: a.d,
        as_: a.s,
    }
}

/// The reference: row `r` of `w` times `a`, one lane at a time.
pub fn dot_row_scalar(w: &QuantRows, r: usize, a: Q8View) -> f32 {
    let mut out = [0f32];
    dot_rows_with(Isa::Scalar, w, r..r + 1, a, &mut out);
    out[0]
}

/// The reference for [`dot_rows_exact`].
pub fn dot_row_exact_scalar(w: &QuantRows, r: usize, a: Q8View, unit: usize) -> f64 {
    let mut out = [0f64];
    dot_rows_exact_with(Isa::Scalar, w, r..r + 1, a, unit, &mut out);
    out[0]
}

/// Step 6's rounding of one lane value to the grid, scaled up by 2^GRID_BITS.
#[inline]
pub(crate) fn to_grid(v: f32) -> f64 {
    (v as f64 * (1u64 << GRID_BITS) as f64).round_ties_even()
}

/// Steps 2 and 4's weight terms for block `b` of a Q5_0 or Q5_1 row, for kernels without a
/// vector f16 conversion: the scales `c` of lanes 0-3 and 4-7 (times the activation scale
/// `dx`) and the minimum `mw` (0 for Q5_0).
#[allow(dead_code)] // used by the aarch64 kernels
#[inline]
pub(crate) fn kscales(op: &Operands, row: usize, b: usize, dx: f32) -> ([f32; 2], f32) {
    use super::rows::h2f;
    let blk = row * op.nb + b;
    let c = h2f(op.d[blk]) * dx;
    ([c; 2], if op.ty == GgmlType::Q5_1 { h2f(op.m[blk]) } else { 0.0 })
}

/// The same terms for the eight blocks of super-block `s` of row `row` of a K-quant type (the
/// super-block's `f32(d)` times the sub-block's integer scale, Q6_K's two per block), one f16
/// conversion a super-block.
#[allow(dead_code)] // used by the aarch64 kernels
#[inline]
pub(crate) fn kscales_super(op: &Operands, row: usize, s: usize) -> [([f32; 2], f32); 8] {
    use super::rows::h2f;
    let g = row * (op.nb / 8) + s;
    let d = h2f(op.d[g]);
    let sc = &op.sc[g * 16..g * 16 + 16];
    let dx = &op.ad[8 * s..8 * s + 8];
    if op.ty == GgmlType::Q6_K {
        std::array::from_fn(|t| ([(d * sc[2 * t] as i8 as f32) * dx[t], (d * sc[2 * t + 1] as i8 as f32) * dx[t]], 0.0))
    } else {
        let dmin = h2f(op.m[g]);
        std::array::from_fn(|t| ([(d * sc[t] as f32) * dx[t]; 2], -(dmin * sc[8 + t] as f32)))
    }
}

/// Step 5.
#[inline]
pub(crate) fn reduce8(t: [f32; 8]) -> f32 {
    let u = [t[0] + t[4], t[1] + t[5], t[2] + t[6], t[3] + t[7]];
    (u[0] + u[2]) + (u[1] + u[3])
}

/// Steps 1-4 over blocks `b` of row `i`: the lanes `t = A + B`.
fn scalar_lanes(op: &Operands, i: usize, b: Range<usize>) -> [f32; 8] {
    let p = PlaneRefs { qs: op.qs, qh: op.qh, sc: op.sc, d: op.d, m: op.m };
    let mut acc = [[0f32; 8]; 2];
    for (jj, j) in b.enumerate() {
        let bt = block_terms(op.ty, p, op.nb, i, j);
        let q = &op.aq[j * QK..][..QK];
        let a = &mut acc[jj % 2];
        for (k, ak) in a.iter_mut().enumerate() {
            let l: i32 = (4 * k..4 * k + 4).map(|e| bt.w[e] * q[e] as i32).sum();
            let c = bt.dw[k / 4] * op.ad[j];
            *ak = c.mul_add(l as f32, *ak);
        }
        if let Some(m) = bt.mw {
            a[0] = m.mul_add(op.as_[j], a[0]);
        }
    }
    std::array::from_fn(|k| acc[0][k] + acc[1][k])
}

fn scalar_row(op: &Operands, i: usize) -> f32 {
    reduce8(scalar_lanes(op, i, 0..op.nb))
}

fn scalar_row_exact(op: &Operands, i: usize) -> f64 {
    let mut e = [0f64; 4];
    for u0 in (0..op.nb).step_by(op.unit) {
        let t = scalar_lanes(op, i, u0..(u0 + op.unit).min(op.nb));
        for (k, &v) in t.iter().enumerate() {
            e[k % 4] += to_grid(v);
        }
    }
    (e[0] + e[2]) + (e[1] + e[3])
}
