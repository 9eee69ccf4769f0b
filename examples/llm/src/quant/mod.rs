//! GGML block quantisation: decoding (F32, F16, BF16, Q8_0, Q4_0, Q4_1), weights kept in their
//! blocks ([`QuantRows`]), activations quantised to 8-bit blocks ([`Q8Act`]) and the integer dot
//! products between the two ([`dot`]).
//!
//! Block layouts (little-endian), each block covering 32 consecutive elements of a row:
//! - Q8_0: `d: f16`, `qs: [i8; 32]`                      -> `x[i] = d * qs[i]`            (34 bytes)
//! - Q4_0: `d: f16`, `qs: [u8; 16]`                      -> `x[i] = d * (nib(i) - 8)`     (18 bytes)
//! - Q4_1: `d: f16`, `m: f16`, `qs: [u8; 16]`            -> `x[i] = d * nib(i) + m`       (20 bytes)
//!
//! where `nib(i)` is the low nibble of `qs[i]` for `i < 16` and the high nibble of `qs[i - 16]`
//! for `i >= 16` (the first half of the block lives in the low nibbles).

pub mod dot;
mod q8;
mod rows;

pub use q8::{quantize_block, Q8Act, Q8View};
pub use rows::{Packer, QuantRows};

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
        if !n.is_multiple_of(b) {
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
