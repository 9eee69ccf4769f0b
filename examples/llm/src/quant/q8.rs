//! Activations quantised to 8-bit blocks, once per matrix-vector product, so that the products
//! with block-quantised weights are integer dot products (GGML's Q8_1 idea).

use super::QK;

/// An activation vector in blocks of 32: per block a scale `d = max|x| / 127`, 32 quants
/// `q = round(x * (1 / d))` in `-127..=127` (ties to even), and `s = d * sum(q)`, which the
/// Q4_1 kernels need for the weights' per-block minimum.
///
/// Each block is quantised on its own, so a rank that holds only some blocks of a vector (the
/// input columns of o_proj or down_proj) gets exactly the quants one rank holding all of it
/// would get for those blocks: that is what keeps tensor-parallel ranks on the same arithmetic.
#[derive(Debug, Clone, Default)]
pub struct Q8Act {
    pub(crate) qs: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
}

/// 1.5 * 2^23: adding it to any |v| < 2^22 rounds v to an integer (ties to even, in the default
/// rounding mode) held in the low bits of the sum, which stays in the binade [2^23, 2^24)
/// where one unit in the last place is 1: so `bits(v + ROUND) - bits(ROUND)` is that integer.
/// Plain float and integer adds, so the loop vectorises on every target (`round_ties_even`
/// becomes a libm call on baseline x86-64, and saturating float-to-int casts do not vectorise).
const ROUND: f32 = 12_582_912.0;

/// `v` rounded to the nearest integer, ties to even, for |v| <= 2^22 (see [`ROUND`]).
#[inline(always)]
fn round_small(v: f32) -> i32 {
    (v + ROUND).to_bits() as i32 - ROUND.to_bits() as i32
}

/// Quantises one block `x` (32 values) into `q`; returns `(d, s)`.
#[inline(always)]
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, f32) {
    let x: &[f32; QK] = x.try_into().expect("a block is 32 values");
    let q: &mut [i8; QK] = q.try_into().expect("a block is 32 quants");
    // max |x| in eight lanes (exact in any order; a NaN is skipped, and its quant is garbage).
    // Fixed-size arrays and separate passes keep every loop a plain vector loop.
    let mut m = [0f32; 8];
    for i in 0..QK {
        let a = x[i].abs();
        m[i % 8] = if a > m[i % 8] { a } else { m[i % 8] };
    }
    let amax = m.iter().fold(0f32, |a, &b| if b > a { b } else { a });
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    // |x * id| <= 127 (+ rounding), so every rounded value fits an i8.
    let v: [i32; QK] = std::array::from_fn(|i| round_small(x[i] * id));
    for i in 0..QK {
        q[i] = v[i] as i8;
    }
    (d, d * v.iter().sum::<i32>() as f32)
}

/// Borrowed blocks of a [`Q8Act`].
#[derive(Debug, Clone, Copy)]
pub struct Q8View<'a> {
    pub(crate) qs: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) s: &'a [f32],
}

impl Q8View<'_> {
    /// Number of 32-value blocks.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// Every block of `x` into `q` (sized by the caller).
#[inline(always)]
fn quantize_all(x: &[f32], q: &mut Q8Act) {
    for ((xb, qb), (d, s)) in x.chunks_exact(QK).zip(q.qs.chunks_exact_mut(QK)).zip(q.d.iter_mut().zip(q.s.iter_mut()))
    {
        (*d, *s) = quantize_block(xb, qb);
    }
}

/// [`quantize_all`] compiled for AVX2: the same source and the same results (plain float
/// arithmetic, no reassociation), in 8-wide instead of 4-wide vectors on x86-64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(x: &[f32], q: &mut Q8Act) {
    quantize_all(x, q)
}

impl Q8Act {
    /// An empty buffer; [`Q8Act::quantize`] sizes it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of 32-value blocks.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }

    /// Makes room for `blocks` blocks (contents unspecified until written).
    pub fn resize(&mut self, blocks: usize) {
        self.qs.resize(blocks * QK, 0);
        self.d.resize(blocks, 0.0);
        self.s.resize(blocks, 0.0);
    }

    /// Quantises `x` (a multiple of 32 values), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32]) {
        assert!(x.len().is_multiple_of(QK), "Q8 activations need whole blocks of {QK}, got {}", x.len());
        self.resize(x.len() / QK);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { quantize_avx2(x, self) };
        }
        quantize_all(x, self);
    }

    /// Mutable views `(quants, scales, sums)` for writers that fill disjoint blocks in
    /// parallel (each block with [`quantize_block`]).
    pub fn parts_mut(&mut self) -> (&mut [i8], &mut [f32], &mut [f32]) {
        (&mut self.qs, &mut self.d, &mut self.s)
    }

    /// The whole vector, for the kernels.
    pub fn view(&self) -> Q8View<'_> {
        Q8View { qs: &self.qs, d: &self.d, s: &self.s }
    }

    /// Blocks `b` only (one token's input in a batch, or the input columns one rank owns).
    pub fn blocks_view(&self, b: std::ops::Range<usize>) -> Q8View<'_> {
        Q8View { qs: &self.qs[b.start * QK..b.end * QK], d: &self.d[b.clone()], s: &self.s[b] }
    }

    /// The values the quants stand for (`d * q`), for tests and error bounds.
    pub fn dequantize(&self) -> Vec<f32> {
        self.qs.chunks_exact(QK).zip(&self.d).flat_map(|(q, &d)| q.iter().map(move |&v| d * v as f32)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_quantisation_by_hand() {
        // max |x| = 127 makes d = 1 exactly, so the ties below are exact ties.
        let mut x = [0f32; QK];
        x[..6].copy_from_slice(&[127.0, 2.5, -3.5, 0.5, 1.5, -127.0]);
        x[6] = 0.49;
        x[7] = -126.51;
        let mut q = [0i8; QK];
        let (d, s) = quantize_block(&x, &mut q);
        assert_eq!(d, 1.0);
        assert_eq!(&q[..8], &[127, 2, -4, 0, 2, -127, 0, -127]);
        // Scaled down, the same block quantises to the same values with a scale d / 1024 (a
        // power of two, so every product stays exact).
        let y: Vec<f32> = x.iter().map(|v| v / 1024.0).collect();
        let mut qy = [0i8; QK];
        assert_eq!(quantize_block(&y, &mut qy), (d / 1024.0, s / 1024.0));
        assert_eq!(qy, q);
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        assert_eq!(s, d * sum as f32);
        // A zero block has a zero scale and zero quants (no division by zero).
        let (d, s) = quantize_block(&[0.0; QK], &mut q);
        assert_eq!((d, s), (0.0, 0.0));
        assert!(q.iter().all(|&v| v == 0));
    }

    #[test]
    fn rounding_matches_round_ties_even_everywhere() {
        // The bit trick against the library rounding, over the whole quant range in quarter
        // steps (every tie included), and near-ties either side of each half.
        for i in -520..=520 {
            let v = i as f32 * 0.25;
            assert_eq!(round_small(v) as f32, v.round_ties_even(), "{v}");
            for w in [v.next_up(), v.next_down()] {
                assert_eq!(round_small(w) as f32, w.round_ties_even(), "{w}");
            }
        }
    }

    #[test]
    fn blocks_are_independent_of_their_neighbours() {
        let x: Vec<f32> = (0..4 * QK).map(|i| ((i * 37 % 101) as f32 - 50.0) * (1 + i / QK) as f32).collect();
        let mut all = Q8Act::new();
        all.quantize(&x);
        let mut part = Q8Act::new();
        part.quantize(&x[QK..3 * QK]);
        let s = all.blocks_view(1..3);
        assert_eq!((s.qs, s.d, s.s), (&part.qs[..], &part.d[..], &part.s[..]));
        // Dequantised values are within half a step of the input.
        for (b, (xb, yb)) in x.chunks(QK).zip(all.dequantize().chunks(QK)).enumerate() {
            for (a, y) in xb.iter().zip(yb) {
                assert!((a - y).abs() <= all.d[b] * 0.5 * 1.0001, "{a} vs {y}");
            }
        }
    }
}
