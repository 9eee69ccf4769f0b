//! CPU kernels for decode: matrix products (`mat`) and the small per-token operations.

mod mat;
pub mod par;
mod pool;

pub use mat::{matmul_many, matvec_many, products, products_exact, Mat};

use crate::config::RopeStyle;

/// Dot product with 8 independent accumulators (lets the compiler vectorise).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `out = x / rms(x) * w`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * inv * wi;
    }
}

/// RMSNorm in place.
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for (xi, &wi) in x.iter_mut().zip(w) {
        *xi = *xi * inv * wi;
    }
}

/// Inverse frequencies `theta^(-2i/d)` for `i in 0..d/2`.
pub fn rope_inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2).map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64) as f32).collect()
}

/// `(cos, sin)` of `pos * inv_freq[i]` for every `i` into `out`: computed once per position
/// and shared by every head and layer (the angles are the same), instead of once per head.
pub fn rope_table(pos: usize, inv_freq: &[f32], out: &mut [(f32, f32)]) {
    for (o, &f) in out.iter_mut().zip(inv_freq) {
        // f64 angle: positions in the thousands times f32 frequencies lose digits otherwise.
        let ang = pos as f64 * f as f64;
        *o = (ang.cos() as f32, ang.sin() as f32);
    }
}

/// Rotates one head vector in place with a [`rope_table`] row.
pub fn rope_with(v: &mut [f32], cs: &[(f32, f32)], style: RopeStyle) {
    let half = v.len() / 2;
    for (i, &(c, s)) in cs.iter().enumerate().take(half) {
        let (a, b) = match style {
            RopeStyle::NeoX => (i, i + half),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        let (x0, x1) = (v[a], v[b]);
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

/// Rotates one head vector in place for position `pos`.
pub fn rope(v: &mut [f32], pos: usize, inv_freq: &[f32], style: RopeStyle) {
    let mut cs = vec![(0f32, 0f32); inv_freq.len()];
    rope_table(pos, inv_freq, &mut cs);
    rope_with(v, &cs, style);
}

/// Numerically stable softmax in place.
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// SiLU(x) = x * sigmoid(x).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}
