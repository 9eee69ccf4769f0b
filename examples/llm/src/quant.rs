//! Dequantisation of the GGML tensor encodings we support (F32, F16, BF16, Q8_0, Q4_0, Q4_1).
//!
//! Block layouts (little-endian), each block covering 32 consecutive elements of a row:
//! - Q8_0: `d: f16`, `qs: [i8; 32]`                      -> `x[i] = d * qs[i]`            (34 bytes)
//! - Q4_0: `d: f16`, `qs: [u8; 16]`                      -> `x[i] = d * (nib(i) - 8)`     (18 bytes)
//! - Q4_1: `d: f16`, `m: f16`, `qs: [u8; 16]`            -> `x[i] = d * nib(i) + m`       (20 bytes)
//!
//! where `nib(i)` is the low nibble of `qs[i]` for `i < 16` and the high nibble of `qs[i - 16]`
//! for `i >= 16` (the first half of the block lives in the low nibbles).

use std::ops::Range;

use half::{bf16, f16};
use thiserror::Error;

/// Elements per quantisation block.
pub const QK: usize = 32;

/// Errors from decoding tensor data.
#[derive(Debug, Error)]
pub enum QuantError {
    /// The GGML type id is not one we decode.
    #[error("unsupported GGML tensor type {0}")]
    Unsupported(u32),
    /// Element count not a multiple of the block size.
    #[error("{n} elements is not a multiple of the {block}-element block of {ty:?}")]
    Ragged {
        /// Type being decoded.
        ty: GgmlType,
        /// Element count requested.
        n: usize,
        /// Block size of the type.
        block: usize,
    },
    /// A float type where a block-quantised one is required.
    #[error("{0:?} is not a block-quantised type")]
    NotBlockQuantized(GgmlType),
    /// Not enough bytes for the requested element count.
    #[error("{ty:?}: need {need} bytes for the elements, have {have}")]
    Short {
        /// Type being decoded.
        ty: GgmlType,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// GGML tensor element types this crate understands (ids as in the GGUF spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float (id 0).
    F32,
    /// IEEE half (id 1).
    F16,
    /// 4-bit, symmetric, one scale per block (id 2).
    Q4_0,
    /// 4-bit, scale + minimum per block (id 3).
    Q4_1,
    /// 8-bit, one scale per block (id 8).
    Q8_0,
    /// bfloat16 (id 30).
    BF16,
}

impl GgmlType {
    /// Maps a GGUF type id.
    pub fn from_id(id: u32) -> Result<Self, QuantError> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            30 => Self::BF16,
            other => return Err(QuantError::Unsupported(other)),
        })
    }

    /// Elements per block (1 for the float types).
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q8_0 => QK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 2 + QK / 2,
            Self::Q4_1 => 4 + QK / 2,
            Self::Q8_0 => 2 + QK,
        }
    }

    /// Bytes needed to store `n` elements (`n` must be a multiple of the block size).
    pub fn bytes_for(self, n: usize) -> Result<usize, QuantError> {
        let b = self.block_elems();
        if n % b != 0 {
            return Err(QuantError::Ragged { ty: self, n, block: b });
        }
        Ok(n / b * self.block_bytes())
    }
}

fn rd_f16(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Decodes `out.len()` elements of type `ty` from `src` into `out`.
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let need = ty.bytes_for(out.len())?;
    if src.len() < need {
        return Err(QuantError::Short { ty, need, have: src.len() });
    }
    let src = &src[..need];
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = rd_f16(c);
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (o, blk) in out.chunks_exact_mut(QK).zip(src.chunks_exact(ty.block_bytes())) {
                let d = rd_f16(&blk[0..2]);
                for (x, &q) in o.iter_mut().zip(&blk[2..]) {
                    *x = d * (q as i8) as f32;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (o, blk) in out.chunks_exact_mut(QK).zip(src.chunks_exact(ty.block_bytes())) {
                let d = rd_f16(&blk[0..2]);
                let qs = &blk[2..];
                for j in 0..QK / 2 {
                    o[j] = d * ((qs[j] & 0x0F) as i32 - 8) as f32;
                    o[j + QK / 2] = d * ((qs[j] >> 4) as i32 - 8) as f32;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, blk) in out.chunks_exact_mut(QK).zip(src.chunks_exact(ty.block_bytes())) {
                let d = rd_f16(&blk[0..2]);
                let m = rd_f16(&blk[2..4]);
                let qs = &blk[4..];
                for j in 0..QK / 2 {
                    o[j] = d * (qs[j] & 0x0F) as f32 + m;
                    o[j + QK / 2] = d * (qs[j] >> 4) as f32 + m;
                }
            }
        }
    }
    Ok(())
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

/// A matrix kept block-quantised (Q8_0, Q4_0 or Q4_1) and multiplied without expanding it:
/// 4-8x less memory and memory traffic than f32. Stored planar — quants, then one f32 scale
/// (and minimum, Q4_1) per block — so the hot loop does no f16 conversion.
#[derive(Debug, Clone)]
pub struct QuantRows {
    /// Encoding (Q8_0, Q4_0 or Q4_1).
    pub ty: GgmlType,
    /// Elements per row.
    pub cols: usize,
    rows: usize,
    /// Q8_0: one i8 per element; Q4_*: 16 bytes per block in GGML nibble order.
    qs: Vec<u8>,
    scales: Vec<f32>,
    mins: Vec<f32>,
}

fn qs_per_block(ty: GgmlType) -> usize {
    if ty == GgmlType::Q8_0 {
        QK
    } else {
        QK / 2
    }
}

impl QuantRows {
    /// Parses rows of `cols` elements stored in the GGML block encoding `ty`.
    pub fn new(ty: GgmlType, cols: usize, bytes: Vec<u8>) -> Result<Self, QuantError> {
        if !matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1) {
            return Err(QuantError::NotBlockQuantized(ty));
        }
        let row_bytes = ty.bytes_for(cols)?;
        if row_bytes == 0 || bytes.len() % row_bytes != 0 {
            return Err(QuantError::Short { ty, need: row_bytes, have: bytes.len() % row_bytes.max(1) });
        }
        let nblocks = bytes.len() / ty.block_bytes();
        let (qb, header) = (qs_per_block(ty), ty.block_bytes() - qs_per_block(ty));
        let mut q = Self {
            ty,
            cols,
            rows: bytes.len() / row_bytes,
            qs: Vec::with_capacity(nblocks * qb),
            scales: Vec::with_capacity(nblocks),
            mins: Vec::new(),
        };
        for blk in bytes.chunks_exact(ty.block_bytes()) {
            q.scales.push(rd_f16(&blk[0..2]));
            if ty == GgmlType::Q4_1 {
                q.mins.push(rd_f16(&blk[2..4]));
            }
            q.qs.extend_from_slice(&blk[header..]);
        }
        Ok(q)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes held (quants + scales + minimums).
    pub fn size_bytes(&self) -> usize {
        self.qs.len() + 4 * (self.scales.len() + self.mins.len())
    }

    /// Decodes row `r` into `out` (`cols` elements), with the same formulas as [`dequantize`].
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.cols / QK;
        let qb = qs_per_block(self.ty);
        for (j, o) in out.chunks_exact_mut(QK).enumerate().take(nb) {
            let b = r * nb + j;
            let d = self.scales[b];
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
                    let m = self.mins[b];
                    for i in 0..QK / 2 {
                        o[i] = d * (qs[i] & 0x0F) as f32 + m;
                        o[i + QK / 2] = d * (qs[i] >> 4) as f32 + m;
                    }
                }
            }
        }
    }

    /// Decodes everything (for the GPU upload or the f32 fallback).
    pub fn dequantize_all(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, o) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, o);
        }
        out
    }

    /// Per-block sums of `x`, needed by [`QuantRows::dot_row`] for the Q4 types (whose offset
    /// term factors out of each block: `sum((d*n + m) * x) = d*sum(n*x) + m*sum(x)`).
    pub fn block_sums(&self, x: &[f32]) -> Vec<f32> {
        if self.ty == GgmlType::Q8_0 {
            return Vec::new();
        }
        x.chunks_exact(QK).map(|c| c.iter().sum()).collect()
    }

    /// Dot product of row `r` with `x`, decoding on the fly; `xsum` from
    /// [`QuantRows::block_sums`]. Rounds differently from decode-then-dot (the scale is
    /// applied per block), well within the f32 tolerance the tests use.
    pub fn dot_row(&self, r: usize, x: &[f32], xsum: &[f32]) -> f32 {
        let nb = self.cols / QK;
        let qb = qs_per_block(self.ty);
        let qs_row = &self.qs[r * nb * qb..(r + 1) * nb * qb];
        let sc = &self.scales[r * nb..(r + 1) * nb];
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
            acc += match self.ty {
                GgmlType::Q8_0 => sc[j] * sn,
                GgmlType::Q4_0 => sc[j] * (sn - 8.0 * xsum[j]),
                _ => sc[j] * sn + self.mins[r * nb + j] * xsum[j],
            };
        }
        acc
    }

    /// Columns `c` of every row, if `c` falls on block boundaries (the shard of a row-parallel
    /// layer); `None` otherwise, and the caller falls back to f32.
    pub fn slice_cols(&self, c: Range<usize>) -> Option<QuantRows> {
        if c.start % QK != 0 || c.end % QK != 0 || c.end > self.cols || c.is_empty() {
            return None;
        }
        let nb = self.cols / QK;
        let (b0, b1) = (c.start / QK, c.end / QK);
        let qb = qs_per_block(self.ty);
        let mut out = QuantRows {
            ty: self.ty,
            cols: c.len(),
            rows: self.rows,
            qs: Vec::new(),
            scales: Vec::new(),
            mins: Vec::new(),
        };
        for r in 0..self.rows {
            let (s, e) = (r * nb + b0, r * nb + b1);
            out.qs.extend_from_slice(&self.qs[s * qb..e * qb]);
            out.scales.extend_from_slice(&self.scales[s..e]);
            if !self.mins.is_empty() {
                out.mins.extend_from_slice(&self.mins[s..e]);
            }
        }
        Some(out)
    }
}
