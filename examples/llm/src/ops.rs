//! CPU kernels for single-token decode: f32, multi-threaded over output rows with rayon.

use rayon::prelude::*;

use crate::config::RopeStyle;
use crate::quant::QuantRows;

/// Row-major f32 matrix `[rows, cols]` (a linear layer's weight, `out x in`).
#[derive(Debug, Clone, Default)]
pub struct Mat {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Elements, row-major.
    pub data: Vec<f32>,
    /// Block-quantised storage; when set, `data` is empty and rows are decoded on the fly.
    pub quant: Option<QuantRows>,
    /// GPU-resident copy; when set, products run on the GPU.
    #[cfg(feature = "gpu")]
    pub gpu: Option<std::sync::Arc<crate::gpu::GpuMat>>,
}

impl Mat {
    /// Wraps data; panics if the size does not match (a loader bug, not user input).
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(rows * cols, data.len(), "matrix data size mismatch");
        Self {
            rows,
            cols,
            data,
            quant: None,
            #[cfg(feature = "gpu")]
            gpu: None,
        }
    }

    /// A matrix that stays in its quantised encoding.
    pub fn quantized(q: QuantRows) -> Self {
        Self {
            rows: q.rows(),
            cols: q.cols,
            data: Vec::new(),
            quant: Some(q),
            #[cfg(feature = "gpu")]
            gpu: None,
        }
    }

    /// Copies row `r` (decoded) into `out`.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        match &self.quant {
            Some(q) => q.dequantize_row(r, out),
            None => out.copy_from_slice(&self.data[r * self.cols..(r + 1) * self.cols]),
        }
    }

    /// Runs `f(row_index, row_values)` for rows `start..start + n`, decoding quantised rows
    /// into a scratch buffer.
    fn for_rows(&self, start: usize, n: usize, mut f: impl FnMut(usize, &[f32])) {
        match &self.quant {
            Some(q) => {
                let mut buf = vec![0f32; self.cols];
                for i in 0..n {
                    q.dequantize_row(start + i, &mut buf);
                    f(i, &buf);
                }
            }
            None => {
                let rows = &self.data[start * self.cols..(start + n) * self.cols];
                for (i, row) in rows.chunks_exact(self.cols).enumerate() {
                    f(i, row);
                }
            }
        }
    }

    /// Copies the matrix to the GPU; later products run there. Empty matrices (a rank with no
    /// heads) stay on the CPU path, which handles them trivially.
    #[cfg(feature = "gpu")]
    pub fn upload(&mut self, ctx: &std::sync::Arc<crate::gpu::GpuContext>, f16: bool) -> anyhow::Result<()> {
        self.gpu = self.upload_rows(ctx, 0..self.rows, f16)?.map(std::sync::Arc::new);
        Ok(())
    }

    /// Rows `r` as a separate GPU matrix (e.g. one rank's slice of the output head), leaving
    /// `self` on the CPU; `None` when the slice is empty. The GPU kernels are f32-only (or f16
    /// with `f16`): quantised rows are decoded for the upload.
    #[cfg(feature = "gpu")]
    pub fn upload_rows(
        &self,
        ctx: &std::sync::Arc<crate::gpu::GpuContext>,
        r: std::ops::Range<usize>,
        f16: bool,
    ) -> anyhow::Result<Option<crate::gpu::GpuMat>> {
        anyhow::ensure!(r.end <= self.rows, "rows {r:?} out of {}", self.rows);
        if r.is_empty() || self.cols == 0 {
            return Ok(None);
        }
        let dense;
        let data = match &self.quant {
            Some(q) => {
                let mut d = vec![0f32; r.len() * self.cols];
                for (i, row) in d.chunks_exact_mut(self.cols).enumerate() {
                    q.dequantize_row(r.start + i, row);
                }
                dense = d;
                &dense
            }
            None => &self.data[r.start * self.cols..r.end * self.cols],
        };
        Ok(Some(crate::gpu::GpuMat::upload_as(ctx, r.len(), self.cols, data, f16)?))
    }

    /// `out` (`t x rows`) = `xs` (`t x cols`) · selfᵀ, on the CPU.
    pub fn matmul(&self, xs: &[f32], t: usize, out: &mut [f32]) -> anyhow::Result<()> {
        let (rows, cols) = (self.rows, self.cols);
        anyhow::ensure!(xs.len() == t * cols && out.len() == t * rows, "matmul shape mismatch");
        if rows == 0 || cols == 0 {
            out.fill(0.0);
            return Ok(());
        }
        // Compute row-major by weight row ([rows][t]) so tasks own contiguous output, then
        // transpose into the token-major layout the caller wants.
        let mut tr = vec![0f32; rows * t];
        let rows_per_task = (16384 / cols).clamp(1, 64);
        if let Some(q) = &self.quant {
            let sums: Vec<Vec<f32>> = xs.chunks_exact(cols).map(|x| q.block_sums(x)).collect();
            tr.par_chunks_mut(rows_per_task * t).enumerate().for_each(|(ci, o)| {
                for (ri, orow) in o.chunks_exact_mut(t).enumerate() {
                    let r = ci * rows_per_task + ri;
                    for (tk, x) in xs.chunks_exact(cols).enumerate() {
                        orow[tk] = q.dot_row(r, x, &sums[tk]);
                    }
                }
            });
        } else {
            tr.par_chunks_mut(rows_per_task * t).enumerate().for_each(|(ci, o)| {
                self.for_rows(ci * rows_per_task, o.len() / t, |ri, row| {
                    for (tk, x) in xs.chunks_exact(cols).enumerate() {
                        o[ri * t + tk] = dot(row, x);
                    }
                });
            });
        }
        for (r, col) in tr.chunks_exact(t).enumerate() {
            for (tk, &v) in col.iter().enumerate() {
                out[tk * rows + r] = v;
            }
        }
        Ok(())
    }

    /// `out = self · x`.
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) -> anyhow::Result<()> {
        anyhow::ensure!(x.len() == self.cols, "matvec: input length {} != {}", x.len(), self.cols);
        anyhow::ensure!(out.len() == self.rows, "matvec: output length {} != {}", out.len(), self.rows);
        if self.rows == 0 || self.cols == 0 {
            out.fill(0.0);
            return Ok(());
        }
        #[cfg(feature = "gpu")]
        if let Some(g) = &self.gpu {
            return g.matvec(x, out);
        }
        self.matvec_rows(0..self.rows, x, out)
    }

    /// `out = self[r] · x`: the product with rows `r` only, on the CPU. Each output is computed
    /// exactly as [`Mat::matvec`] computes that row (same kernel, same summation order), so
    /// slices computed on different ranks concatenate to the bits of the whole product.
    pub fn matvec_rows(&self, r: std::ops::Range<usize>, x: &[f32], out: &mut [f32]) -> anyhow::Result<()> {
        anyhow::ensure!(r.start <= r.end && r.end <= self.rows, "matvec: rows {r:?} out of {}", self.rows);
        anyhow::ensure!(x.len() == self.cols, "matvec: input length {} != {}", x.len(), self.cols);
        anyhow::ensure!(out.len() == r.len(), "matvec: output length {} != {}", out.len(), r.len());
        if r.is_empty() || self.cols == 0 {
            out.fill(0.0);
            return Ok(());
        }
        // Chunks of rows per task keep rayon's overhead small relative to the dot products.
        let rows_per_task = (16384 / self.cols).clamp(1, 64);
        if let Some(q) = &self.quant {
            let sums = q.block_sums(x);
            out.par_chunks_mut(rows_per_task).enumerate().for_each(|(ci, o)| {
                for (i, oi) in o.iter_mut().enumerate() {
                    *oi = q.dot_row(r.start + ci * rows_per_task + i, x, &sums);
                }
            });
            return Ok(());
        }
        out.par_chunks_mut(rows_per_task).enumerate().for_each(|(ci, o)| {
            self.for_rows(r.start + ci * rows_per_task, o.len(), |i, row| o[i] = dot(row, x));
        });
        Ok(())
    }
}

/// Batched products for prefill: `outs[i]` (`t x rows_i`, row-major) = `xs` (`t x cols`) times
/// `mats[i]` transposed. On the CPU each weight row is read once for all `t` tokens (decode is
/// memory-bound, so this is where batching pays); on the GPU it is one round trip per token.
pub fn matmul_many(mats: &[&Mat], xs: &[f32], t: usize, outs: &mut [&mut [f32]]) -> anyhow::Result<()> {
    anyhow::ensure!(mats.len() == outs.len(), "matmul_many: arity mismatch");
    if t == 1 {
        return matvec_many(mats, xs, outs);
    }
    #[cfg(feature = "gpu")]
    if mats.iter().any(|m| m.gpu.is_some()) {
        for tok in 0..t {
            let x = &xs[tok * mats[0].cols..(tok + 1) * mats[0].cols];
            let mut o: Vec<&mut [f32]> =
                outs.iter_mut().zip(mats).map(|(o, m)| &mut o[tok * m.rows..(tok + 1) * m.rows]).collect();
            matvec_many(mats, x, &mut o)?;
        }
        return Ok(());
    }
    for (m, o) in mats.iter().zip(outs.iter_mut()) {
        m.matmul(xs, t, o)?;
    }
    Ok(())
}

/// `outs[i] = mats[i] · x` for matrices sharing an input. On the GPU this is one round trip
/// for all of them; on the CPU it is the plain loop.
pub fn matvec_many(mats: &[&Mat], x: &[f32], outs: &mut [&mut [f32]]) -> anyhow::Result<()> {
    anyhow::ensure!(mats.len() == outs.len(), "matvec_many: arity mismatch");
    #[cfg(feature = "gpu")]
    {
        let gpu: Option<Vec<&crate::gpu::GpuMat>> = mats.iter().map(|m| m.gpu.as_deref()).collect();
        if let Some(g) = gpu {
            return crate::gpu::matvec_many(&g, x, outs);
        }
    }
    for (m, o) in mats.iter().zip(outs.iter_mut()) {
        m.matvec(x, o)?;
    }
    Ok(())
}

/// Dot product with 8 independent accumulators (lets the compiler vectorise).
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

/// Rotates one head vector in place for position `pos`.
pub fn rope(v: &mut [f32], pos: usize, inv_freq: &[f32], style: RopeStyle) {
    let half = v.len() / 2;
    for (i, &f) in inv_freq.iter().enumerate() {
        // f64 angle: positions in the thousands times f32 frequencies lose digits otherwise.
        let ang = pos as f64 * f as f64;
        let (s, c) = (ang.sin() as f32, ang.cos() as f32);
        let (a, b) = match style {
            RopeStyle::NeoX => (i, i + half),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        let (x0, x1) = (v[a], v[b]);
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
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
