//! Weight matrices kept in their GGML blocks.

use std::ops::Range;

use half::f16;

use super::{GgmlType, QuantError, QK};

/// A matrix kept block-quantised (Q8_0, Q4_0 or Q4_1) and multiplied without expanding it: the
/// same bytes as the file (4-7x less memory and memory traffic than f32).
///
/// Stored planar: all quants row after row, then one f16 scale (and one f16 minimum, Q4_1) per
/// block, so the SIMD kernels load 16 or 32 bytes of quants per block and convert eight scales
/// with one instruction, instead of picking 18-, 20- or 34-byte blocks apart.
#[derive(Debug, Clone)]
pub struct QuantRows {
    /// Encoding (Q8_0, Q4_0 or Q4_1).
    pub ty: GgmlType,
    /// Elements per row.
    pub cols: usize,
    rows: usize,
    /// Q8_0: one i8 per element; Q4_*: 16 bytes per block in GGML nibble order.
    qs: Vec<u8>,
    /// f16 bits of each block's scale `d`.
    d: Vec<u16>,
    /// f16 bits of each block's minimum `m` (Q4_1 only; empty otherwise).
    m: Vec<u16>,
}

/// Bytes of quants per block.
pub(crate) fn qs_per_block(ty: GgmlType) -> usize {
    if ty == GgmlType::Q8_0 {
        QK
    } else {
        QK / 2
    }
}

/// An f16 bit pattern as f32 (exact).
#[inline]
pub(crate) fn h2f(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

impl QuantRows {
    /// Parses rows of `cols` elements stored in the GGML block encoding `ty`.
    pub fn new(ty: GgmlType, cols: usize, bytes: Vec<u8>) -> Result<Self, QuantError> {
        if !matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1) {
            return Err(QuantError::NotBlockQuantized(ty));
        }
        let row_bytes = ty.bytes_for(cols)?;
        if row_bytes == 0 || !bytes.len().is_multiple_of(row_bytes) {
            return Err(QuantError::Short { ty, need: row_bytes, have: bytes.len() % row_bytes.max(1) });
        }
        let nblocks = bytes.len() / ty.block_bytes();
        let (qb, header) = (qs_per_block(ty), ty.block_bytes() - qs_per_block(ty));
        let mut q = Self {
            ty,
            cols,
            rows: bytes.len() / row_bytes,
            qs: Vec::with_capacity(nblocks * qb),
            d: Vec::with_capacity(nblocks),
            m: Vec::with_capacity(if ty == GgmlType::Q4_1 { nblocks } else { 0 }),
        };
        for blk in bytes.chunks_exact(ty.block_bytes()) {
            q.d.push(u16::from_le_bytes([blk[0], blk[1]]));
            if ty == GgmlType::Q4_1 {
                q.m.push(u16::from_le_bytes([blk[2], blk[3]]));
            }
            q.qs.extend_from_slice(&blk[header..]);
        }
        Ok(q)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// Bytes held (quants + scales + minimums): the file's bytes for these rows.
    pub fn size_bytes(&self) -> usize {
        self.qs.len() + 2 * (self.d.len() + self.m.len())
    }

    /// Quants of rows `r` (contiguous, `blocks_per_row() * 16` or `* 32` bytes a row).
    pub(crate) fn qs_rows(&self, r: Range<usize>) -> &[u8] {
        let rb = self.blocks_per_row() * qs_per_block(self.ty);
        &self.qs[r.start * rb..r.end * rb]
    }

    /// f16 scale bits of rows `r`, one per block.
    pub(crate) fn d_rows(&self, r: Range<usize>) -> &[u16] {
        let nb = self.blocks_per_row();
        &self.d[r.start * nb..r.end * nb]
    }

    /// f16 minimum bits of rows `r` (Q4_1), one per block; empty for the other types.
    pub(crate) fn m_rows(&self, r: Range<usize>) -> &[u16] {
        let nb = self.blocks_per_row();
        if self.m.is_empty() {
            &[]
        } else {
            &self.m[r.start * nb..r.end * nb]
        }
    }

    /// Raw planar storage `(quants, scale bits, minimum bits)`, e.g. for a GPU upload.
    pub fn planes(&self) -> (&[u8], &[u16], &[u16]) {
        (&self.qs, &self.d, &self.m)
    }

    /// Decodes row `r` into `out` (`cols` elements), with the same formulas as
    /// [`super::dequantize`].
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        let qb = qs_per_block(self.ty);
        for (j, o) in out.chunks_exact_mut(QK).enumerate().take(nb) {
            let b = r * nb + j;
            let d = h2f(self.d[b]);
            let qs = &self.qs[b * qb..(b + 1) * qb];
            match self.ty {
                GgmlType::Q8_0 => {
                    for (x, &v) in o.iter_mut().zip(qs) {
                        *x = d * (v as i8) as f32;
                    }
                }
                GgmlType::Q4_0 => {
                    for i in 0..QK / 2 {
                        o[i] = d * ((qs[i] & 0x0F) as i32 - 8) as f32;
                        o[i + QK / 2] = d * ((qs[i] >> 4) as i32 - 8) as f32;
                    }
                }
                _ => {
                    let m = h2f(self.m[b]);
                    for i in 0..QK / 2 {
                        o[i] = d * (qs[i] & 0x0F) as f32 + m;
                        o[i + QK / 2] = d * (qs[i] >> 4) as f32 + m;
                    }
                }
            }
        }
    }

    /// Decodes everything (for the f32 fallback).
    pub fn dequantize_all(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, o) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, o);
        }
        out
    }

    /// Per-block sums of `x` into `out` (one per block), needed by [`QuantRows::dot_row`] for
    /// the Q4 types, whose offset term factors out of each block:
    /// `sum((d*n + m) * x) = d*sum(n*x) + m*sum(x)`.
    pub fn block_sums_into(&self, x: &[f32], out: &mut Vec<f32>) {
        out.clear();
        if self.ty != GgmlType::Q8_0 {
            out.extend(x.chunks_exact(QK).map(|c| c.iter().sum::<f32>()));
        }
    }

    /// Dot product of row `r` with the f32 vector `x` (activations not quantised), decoding
    /// on the fly; `xsum` from [`QuantRows::block_sums_into`]. Rounds differently from
    /// decode-then-dot (the scale is applied per block), well within the f32 tolerance the
    /// tests use. The GPU backend's arithmetic; the CPU default is [`super::dot`]'s.
    pub fn dot_row(&self, r: usize, x: &[f32], xsum: &[f32]) -> f32 {
        let nb = self.blocks_per_row();
        let qb = qs_per_block(self.ty);
        let qs_row = self.qs_rows(r..r + 1);
        let sc = self.d_rows(r..r + 1);
        let mut acc = 0f32;
        // Integer quants are widened into a small f32 block first: two simple loops the
        // compiler vectorises, instead of one mixed integer/float loop it does not.
        let mut v = [0f32; QK];
        for (j, (qs, xb)) in qs_row.chunks_exact(qb).zip(x.chunks_exact(QK)).enumerate() {
            match self.ty {
                GgmlType::Q8_0 => {
                    for (o, &q) in v.iter_mut().zip(qs) {
                        *o = (q as i8) as f32;
                    }
                }
                _ => {
                    let (lo, hi) = v.split_at_mut(QK / 2);
                    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
                        *l = (q & 0x0F) as f32;
                        *h = (q >> 4) as f32;
                    }
                }
            }
            let sn = block_dot(&v, xb);
            let d = h2f(sc[j]);
            acc += match self.ty {
                GgmlType::Q8_0 => d * sn,
                GgmlType::Q4_0 => d * (sn - 8.0 * xsum[j]),
                _ => d * sn + h2f(self.m[r * nb + j]) * xsum[j],
            };
        }
        acc
    }

    /// Columns `c` of every row, if `c` falls on block boundaries (the shard of a row-parallel
    /// layer); `None` otherwise, and the caller falls back to f32.
    pub fn slice_cols(&self, c: Range<usize>) -> Option<QuantRows> {
        if !c.start.is_multiple_of(QK) || !c.end.is_multiple_of(QK) || c.end > self.cols || c.is_empty() {
            return None;
        }
        let nb = self.blocks_per_row();
        let (b0, b1) = (c.start / QK, c.end / QK);
        let qb = qs_per_block(self.ty);
        let mut out = QuantRows {
            ty: self.ty,
            cols: c.len(),
            rows: self.rows,
            qs: Vec::with_capacity(self.rows * (b1 - b0) * qb),
            d: Vec::with_capacity(self.rows * (b1 - b0)),
            m: Vec::new(),
        };
        for r in 0..self.rows {
            let (s, e) = (r * nb + b0, r * nb + b1);
            out.qs.extend_from_slice(&self.qs[s * qb..e * qb]);
            out.d.extend_from_slice(&self.d[s..e]);
            if !self.m.is_empty() {
                out.m.extend_from_slice(&self.m[s..e]);
            }
        }
        Some(out)
    }
}

/// Dot product of one 32-element block with 8 independent accumulators.
#[inline]
fn block_dot(a: &[f32; QK], b: &[f32]) -> f32 {
    let mut s = [0f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            s[l] += x[l] * y[l];
        }
    }
    (s[0] + s[4]) + (s[1] + s[5]) + ((s[2] + s[6]) + (s[3] + s[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planes_hold_the_file_bytes() {
        // Two Q4_1 rows of one block: d = 1.0, m = -0.5, nibbles 0..15.
        let mut bytes = Vec::new();
        for _ in 0..2 {
            bytes.extend(f16::from_f32(1.0).to_le_bytes());
            bytes.extend(f16::from_f32(-0.5).to_le_bytes());
            bytes.extend((0..16u8).map(|i| i | (15 - i) << 4));
        }
        let q = QuantRows::new(GgmlType::Q4_1, 32, bytes.clone()).unwrap();
        assert_eq!(q.size_bytes(), bytes.len());
        assert_eq!(q.d_rows(1..2), &[f16::from_f32(1.0).to_bits()]);
        assert_eq!(q.m_rows(0..1), &[f16::from_f32(-0.5).to_bits()]);
        let mut row = [0f32; 32];
        q.dequantize_row(1, &mut row);
        assert_eq!(row[3], 2.5);
        assert_eq!(row[16], 14.5);
    }
}
