//! Weight matrices and their products with activation vectors, on the CPU (or, feature `gpu`,
//! handed to the GPU when the matrix was uploaded).

use std::ops::Range;

use super::{dot, par};
use crate::quant::dot::{dot_rows, dot_rows_exact};
#[cfg(feature = "gpu")]
use crate::quant::GgmlType;
use crate::quant::{Q8Act, Q8View, QuantRows, QK};

/// Row-major matrix `[rows, cols]` (a linear layer's weight, `out x in`), stored as f32 or in
/// its GGML blocks.
#[derive(Debug, Clone, Default)]
pub struct Mat {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Elements, row-major (empty when `quant` is set).
    pub data: Vec<f32>,
    /// Block-quantised storage; when set, `data` is empty.
    pub quant: Option<QuantRows>,
    /// With `quant`: multiply with Q8-quantised activations ([`crate::quant::dot`], integer dot
    /// products) instead of decoding each block against f32 activations.
    pub q8: bool,
    /// With `q8`, for a row-parallel layer: [`products_exact`] sums the columns in units of this
    /// many blocks, exactly (see [`crate::quant::dot`], step 6).
    pub exact_unit: Option<usize>,
    /// GPU-resident copy; when set, products run on the GPU.
    #[cfg(feature = "gpu")]
    pub gpu: Option<std::sync::Arc<crate::gpu::GpuMat>>,
}

/// Rows of one product a task computes on the CPU at least (a multiple of the kernels' groups
/// of four); below this the hand-off to another thread costs more than it saves.
const MIN_ROWS_PER_TASK: usize = 16;

impl Mat {
    /// Wraps data; panics if the size does not match (a loader bug, not user input).
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(rows * cols, data.len(), "matrix data size mismatch");
        Self { rows, cols, data, ..Default::default() }
    }

    /// A matrix that stays in its quantised encoding, multiplied with f32 activations.
    pub fn quantized(q: QuantRows) -> Self {
        Self { rows: q.rows(), cols: q.cols, quant: Some(q), ..Default::default() }
    }

    /// A matrix that stays in its quantised encoding, multiplied with Q8 activations.
    pub fn quantized_q8(q: QuantRows) -> Self {
        Self { q8: true, ..Self::quantized(q) }
    }

    /// Whether products need the input quantised ([`Q8Act`]).
    pub fn uses_q8(&self) -> bool {
        self.q8 && self.quant.is_some()
    }

    /// Whether products run on the CPU (not uploaded to a GPU).
    pub fn on_cpu(&self) -> bool {
        #[cfg(feature = "gpu")]
        return self.gpu.is_none();
        #[cfg(not(feature = "gpu"))]
        true
    }

    /// Bytes of weights held on the CPU.
    pub fn size_bytes(&self) -> usize {
        self.quant.as_ref().map_or(4 * self.data.len(), QuantRows::size_bytes)
    }

    /// Copies row `r` (decoded) into `out`.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        match &self.quant {
            Some(q) => q.dequantize_row(r, out),
            None => out.copy_from_slice(&self.data[r * self.cols..(r + 1) * self.cols]),
        }
    }

    /// `out = self[r] · x` on this thread. `qx` is `x` quantised, required when
    /// [`Mat::uses_q8`]. Each output is one row's dot product, computed the same way whatever
    /// `r` is, so slices computed on different ranks or threads concatenate to the bits of the
    /// whole product.
    pub fn rows_into(&self, r: Range<usize>, x: &[f32], qx: Option<Q8View>, out: &mut [f32]) {
        debug_assert!(out.len() == r.len() && x.len() == self.cols);
        match &self.quant {
            Some(q) if self.q8 => dot_rows(q, r, qx.expect("a Q8 matrix needs its input quantised"), out),
            Some(q) => {
                // Block sums of x for the Q4 types' offsets: at most a few hundred values, on
                // the stack for every model this example runs.
                let mut stack = [0f32; 512];
                let mut heap = Vec::new();
                let sums = if x.len() / QK <= stack.len() {
                    let s = &mut stack[..x.len() / QK];
                    for (o, c) in s.iter_mut().zip(x.chunks_exact(QK)) {
                        *o = c.iter().sum();
                    }
                    &*s
                } else {
                    q.block_sums_into(x, &mut heap);
                    &heap[..]
                };
                for (i, o) in out.iter_mut().enumerate() {
                    *o = q.dot_row(r.start + i, x, sums);
                }
            }
            None => {
                let rows = &self.data[r.start * self.cols..r.end * self.cols];
                for (o, row) in out.iter_mut().zip(rows.chunks_exact(self.cols)) {
                    *o = dot(row, x);
                }
            }
        }
    }

    /// Rows `r` of the exact product (scaled by 2^GRID_BITS, see
    /// [`crate::quant::dot::dot_rows_exact`]), on this thread. Needs [`Mat::exact_unit`].
    pub fn rows_into_exact(&self, r: Range<usize>, qx: Q8View, out: &mut [f64]) {
        let (Some(q), Some(unit)) = (&self.quant, self.exact_unit) else {
            panic!("rows_into_exact on a matrix without exact units");
        };
        dot_rows_exact(q, r, qx, unit, out);
    }

    /// [`Mat::rows_into`] split across the CPU threads.
    pub fn rows_par(&self, r: Range<usize>, x: &[f32], qx: Option<Q8View>, out: &mut [f32]) {
        let chunk = par::per_task(r.len(), 4, MIN_ROWS_PER_TASK);
        par::for_each_chunk(out, chunk, |ci, o| {
            let s = r.start + ci * chunk;
            self.rows_into(s..s + o.len(), x, qx, o);
        });
    }

    /// Copies the matrix to the GPU; later products run there. Empty matrices (a rank with no
    /// heads) stay on the CPU path, which handles them trivially.
    #[cfg(feature = "gpu")]
    pub fn upload(&mut self, ctx: &std::sync::Arc<crate::gpu::GpuContext>, f16: bool) -> anyhow::Result<()> {
        self.gpu = self.upload_rows(ctx, 0..self.rows, f16)?.map(std::sync::Arc::new);
        Ok(())
    }

    /// Rows `r` as a separate GPU matrix (e.g. one rank's slice of the output head), leaving
    /// `self` on the CPU; `None` when the slice is empty. Quantised rows go up in their blocks
    /// (the shaders decode them; `f16` does not apply); f32 rows as f32, or f16 with `f16`.
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
        Ok(Some(match &self.quant {
            // The shaders decode the 32-element types; the 5/6-bit and K-quant types go up
            // decoded (f32, or f16 with `f16`).
            Some(q) if !matches!(q.ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) => {
                let mut data = vec![0f32; r.len() * self.cols];
                for (i, o) in data.chunks_exact_mut(self.cols).enumerate() {
                    q.dequantize_row(r.start + i, o);
                }
                crate::gpu::GpuMat::upload_as(ctx, r.len(), self.cols, &data, f16)?
            }
            Some(q) => crate::gpu::GpuMat::upload_quant(ctx, q, r)?,
            None => crate::gpu::GpuMat::upload_as(
                ctx,
                r.len(),
                self.cols,
                &self.data[r.start * self.cols..r.end * self.cols],
                f16,
            )?,
        }))
    }

    /// `out` (`t x rows`) = `xs` (`t x cols`) · selfᵀ, on the CPU: each task's rows are read
    /// once for all `t` tokens (prefill).
    pub fn matmul(&self, xs: &[f32], t: usize, out: &mut [f32]) -> anyhow::Result<()> {
        let (rows, cols) = (self.rows, self.cols);
        anyhow::ensure!(xs.len() == t * cols && out.len() == t * rows, "matmul shape mismatch");
        if rows == 0 || cols == 0 {
            out.fill(0.0);
            return Ok(());
        }
        let qxs = self.uses_q8().then(|| {
            let mut q = Q8Act::new();
            q.quantize(xs);
            q
        });
        let nb = cols / QK;
        // Row-major by weight row ([rows][t]) so tasks own contiguous output, then transposed
        // into the token-major layout the caller wants.
        const TASK: usize = 64;
        let mut tr = vec![0f32; rows * t];
        par::for_each_chunk(&mut tr, TASK * t, |ci, o| {
            let r0 = ci * TASK;
            let n = o.len() / t;
            let mut buf = [0f32; TASK];
            for (tk, x) in xs.chunks_exact(cols).enumerate() {
                let qx = qxs.as_ref().map(|q| q.blocks_view(tk * nb..(tk + 1) * nb));
                self.rows_into(r0..r0 + n, x, qx, &mut buf[..n]);
                for (ri, &v) in buf[..n].iter().enumerate() {
                    o[ri * t + tk] = v;
                }
            }
        });
        for (r, col) in tr.chunks_exact(t).enumerate() {
            for (tk, &v) in col.iter().enumerate() {
                out[tk * rows + r] = v;
            }
        }
        Ok(())
    }

    /// `out = self · x`.
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) -> anyhow::Result<()> {
        anyhow::ensure!(out.len() == self.rows, "matvec: output length {} != {}", out.len(), self.rows);
        #[cfg(feature = "gpu")]
        if let Some(g) = &self.gpu {
            anyhow::ensure!(x.len() == self.cols, "matvec: input length {} != {}", x.len(), self.cols);
            return g.matvec(x, out);
        }
        self.matvec_rows(0..self.rows, x, out)
    }

    /// `out = self[r] · x`: the product with rows `r` only, on the CPU, quantising `x` first
    /// when the matrix uses Q8 arithmetic. See [`Mat::rows_into`] for why slices concatenate
    /// to the whole product's bits.
    pub fn matvec_rows(&self, r: Range<usize>, x: &[f32], out: &mut [f32]) -> anyhow::Result<()> {
        let q = self.uses_q8().then(|| {
            let mut q = Q8Act::new();
            q.quantize(x);
            q
        });
        self.matvec_rows_q(r, x, q.as_ref(), out)
    }

    /// [`Mat::matvec_rows`] with `x` already quantised (`qx`, required when [`Mat::uses_q8`]).
    pub fn matvec_rows_q(&self, r: Range<usize>, x: &[f32], qx: Option<&Q8Act>, out: &mut [f32]) -> anyhow::Result<()> {
        anyhow::ensure!(r.start <= r.end && r.end <= self.rows, "matvec: rows {r:?} out of {}", self.rows);
        anyhow::ensure!(x.len() == self.cols, "matvec: input length {} != {}", x.len(), self.cols);
        anyhow::ensure!(out.len() == r.len(), "matvec: output length {} != {}", out.len(), r.len());
        anyhow::ensure!(!self.uses_q8() || qx.is_some(), "matvec: this matrix needs its input quantised");
        if r.is_empty() || self.cols == 0 {
            out.fill(0.0);
            return Ok(());
        }
        self.rows_par(r, x, qx.map(Q8Act::view), out);
        Ok(())
    }
}

/// Products of several matrices with one shared input, for `t` tokens: `out` holds the outputs
/// one matrix after the other, each `t x rows` (token-major). `qxs` is `xs` quantised (one
/// [`Q8Act`] over all `t` tokens), required when any matrix [`Mat::uses_q8`].
///
/// For one token on the CPU all the matrices' rows form a single parallel region (q/k/v or
/// gate/up are one hand-off to the threads, not three); on the GPU it is one round trip per
/// token; batches use [`Mat::matmul`] per matrix, which reads each weight row once for all
/// tokens.
pub fn products(mats: &[&Mat], xs: &[f32], qxs: Option<&Q8Act>, t: usize, out: &mut [f32]) -> anyhow::Result<()> {
    let total: usize = mats.iter().map(|m| m.rows).sum();
    anyhow::ensure!(out.len() == t * total, "products: output holds {} values, not {}", out.len(), t * total);
    anyhow::ensure!(mats.iter().all(|m| m.cols * t == xs.len()), "products: input width mismatch");
    anyhow::ensure!(!mats.iter().any(|m| m.uses_q8()) || qxs.is_some(), "products: input not quantised");
    #[cfg(feature = "gpu")]
    if mats.iter().any(|m| m.gpu.is_some()) {
        let cols = mats[0].cols;
        for tok in 0..t {
            let mut outs: Vec<&mut [f32]> = Vec::with_capacity(mats.len());
            let mut rest = &mut *out;
            for m in mats {
                let (seg, tail) = rest.split_at_mut(t * m.rows);
                rest = tail;
                outs.push(&mut seg[tok * m.rows..(tok + 1) * m.rows]);
            }
            matvec_many(mats, &xs[tok * cols..(tok + 1) * cols], &mut outs)?;
        }
        return Ok(());
    }
    if t > 1 {
        let mut rest = &mut *out;
        for m in mats {
            let (seg, tail) = rest.split_at_mut(t * m.rows);
            rest = tail;
            m.matmul(xs, t, seg)?;
        }
        return Ok(());
    }
    let qx = qxs.map(Q8Act::view);
    let chunk = par::per_task(total, 4, MIN_ROWS_PER_TASK);
    par::for_each_chunk(out, chunk, |ci, o| {
        // Global row g of the stacked matrices -> (matrix, row); a task may span two.
        let (mut g, mut done, mut base) = (ci * chunk, 0, 0);
        for m in mats {
            let end = base + m.rows;
            if done < o.len() && g < end {
                let n = (end - g).min(o.len() - done);
                m.rows_into(g - base..g - base + n, xs, qx, &mut o[done..done + n]);
                done += n;
                g += n;
            }
            base = end;
        }
    });
    Ok(())
}

/// The exact product of a row-parallel matrix ([`Mat::exact_unit`]) with `t` tokens' inputs:
/// `out` (`t x rows`, token-major) in multiples of 2^-GRID_BITS scaled up to integers, for an
/// f64 all_sum that has the same bits at every tensor-parallel degree.
pub fn products_exact(m: &Mat, qxs: &Q8Act, t: usize, out: &mut [f64]) -> anyhow::Result<()> {
    anyhow::ensure!(m.exact_unit.is_some() && m.on_cpu(), "products_exact: not an exact CPU matrix");
    anyhow::ensure!(out.len() == t * m.rows, "products_exact: output holds {} values, not {}", out.len(), t * m.rows);
    let nb = m.cols / QK;
    anyhow::ensure!(qxs.blocks() == t * nb, "products_exact: input width mismatch");
    let chunk = par::per_task(m.rows, 4, MIN_ROWS_PER_TASK);
    for (tok, o) in out.chunks_exact_mut(m.rows).enumerate() {
        let qx = qxs.blocks_view(tok * nb..(tok + 1) * nb);
        par::for_each_chunk(o, chunk, |ci, oc| {
            let s = ci * chunk;
            m.rows_into_exact(s..s + oc.len(), qx, oc);
        });
    }
    Ok(())
}

/// Batched products for prefill: `outs[i]` (`t x rows_i`, row-major) = `xs` (`t x cols`) times
/// `mats[i]` transposed (quantising `xs` when a matrix needs it).
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
