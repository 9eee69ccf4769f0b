//! GGML block quantisation: decoding (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
//! Q5_K, Q6_K), weights kept in their blocks ([`QuantRows`]), activations quantised to 8-bit
//! blocks ([`Q8Act`]) and the integer dot products between the two ([`dot`]).
//!
//! Block layouts (little-endian), each block covering 32 consecutive elements of a row:
//! - Q8_0: `d: f16`, `qs: [i8; 32]`                      -> `x[i] = d * qs[i]`            (34 bytes)
//! - Q4_0: `d: f16`, `qs: [u8; 16]`                      -> `x[i] = d * (nib(i) - 8)`     (18 bytes)
//! - Q4_1: `d: f16`, `m: f16`, `qs: [u8; 16]`            -> `x[i] = d * nib(i) + m`       (20 bytes)
//! - Q5_0: `d: f16`, `qh: u32`, `qs: [u8; 16]`           -> `x[i] = d * (q5(i) - 16)`     (22 bytes)
//! - Q5_1: `d: f16`, `m: f16`, `qh: u32`, `qs: [u8; 16]` -> `x[i] = d * q5(i) + m`        (24 bytes)
//!
//! where `nib(i)` is the low nibble of `qs[i]` for `i < 16` and the high nibble of `qs[i - 16]`
//! for `i >= 16` (the first half of the block lives in the low nibbles), and `q5(i) = nib(i) |
//! (bit i of qh) << 4`.
//!
//! K-quants (llama.cpp's `Q4_K_M`, `Q5_K_M`, `Q6_K` files) group eight 32-element sub-blocks
//! (sixteen of 16 for Q6_K) into a super-block of 256 elements, with one f16 scale (and minimum)
//! per super-block and small integer scales per sub-block:
//! - Q4_K: `d, dmin: f16`, `scales: [u8; 12]` (eight 6-bit scales `sc[t]` and mins `mn[t]`),
//!   `qs: [u8; 128]` -> sub-block `t` (elements `32t..32t+32`) is `d*sc[t] * q - dmin*mn[t]`,
//!   `q` the low nibbles of `qs[32(t/2)..][..32]` for even `t`, the high nibbles for odd (144 bytes);
//! - Q5_K: the same plus `qh: [u8; 32]` before `qs`; bit `t` of `qh[l]` is the fifth bit of
//!   element `l` of sub-block `t` (176 bytes);
//! - Q6_K: `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16` -> element `e` is
//!   `d * scales[e / 16] * (q6 - 32)` (210 bytes; the bit layout is in `rows.rs`).
//!
//! The float formulas (order and rounding of every operation) are those of gguf-py's
//! `gguf.quants.dequantize`, so decoding matches it bit for bit (`tools/kquant_reference.py`).

pub mod dot;
mod q8;
mod rows;

pub use q8::{quantize_block, Q8Act, Q8View};
pub use rows::{Packer, PlaneRefs, QuantRows};

use half::{bf16, f16};
use thiserror::Error;

/// Elements per quantisation block.
pub const QK: usize = 32;

/// Errors from decoding tensor data.
#[derive(Debug, Error)]
pub enum QuantError {
    /// The GGML type id is not one we decode.
    #[error("GGML type {name} (id {id}) is not supported; this example reads {SUPPORTED}", id = .0, name = ggml_type_name(*.0))]
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
#[allow(non_camel_case_types)] // GGML's names
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
    /// 5-bit, symmetric, one scale per block (id 6).
    Q5_0,
    /// 5-bit, scale + minimum per block (id 7).
    Q5_1,
    /// 8-bit, one scale per block (id 8).
    Q8_0,
    /// 4-bit K-quant: 256-element super-blocks of eight scaled sub-blocks with minimums (id 12).
    Q4_K,
    /// 5-bit K-quant, laid out like Q4_K plus the fifth bits (id 13).
    Q5_K,
    /// 6-bit K-quant: 256-element super-blocks of sixteen signed-scaled sub-blocks (id 14).
    Q6_K,
    /// bfloat16 (id 30).
    BF16,
}

/// The GGML type names, by id (as in ggml.h), for messages about files this example cannot run.
pub fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

/// The tensor types [`GgmlType::from_id`] accepts, for error messages.
pub const SUPPORTED: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Maps a GGUF type id.
    pub fn from_id(id: u32) -> Result<Self, QuantError> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            30 => Self::BF16,
            other => return Err(QuantError::Unsupported(other)),
        })
    }

    /// Elements per block (1 for the float types).
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => QK,
            Self::Q4_K | Self::Q5_K | Self::Q6_K => QK_K,
        }
    }

    /// Whether the type is one of GGML's block quantisations (kept in its blocks by
    /// [`QuantRows`]), not a float type.
    pub fn is_block_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// The name GGML gives the type (`Q4_K`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::BF16 => "BF16",
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 2 + QK / 2,
            Self::Q4_1 => 4 + QK / 2,
            Self::Q5_0 => 2 + 4 + QK / 2,
            Self::Q5_1 => 4 + 4 + QK / 2,
            Self::Q8_0 => 2 + QK,
            Self::Q4_K => 4 + 12 + QK_K / 2,
            Self::Q5_K => 4 + 12 + QK_K / 8 + QK_K / 2,
            Self::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }

    /// Where a block keeps its f16 numbers (byte offsets): the scale `d`, then `m` or `dmin`
    /// where the type has one; the element itself for F16; none for F32 and BF16.
    pub fn f16_fields(self) -> &'static [usize] {
        match self {
            Self::F32 | Self::BF16 => &[],
            Self::F16 | Self::Q4_0 | Self::Q5_0 | Self::Q8_0 => &[0],
            Self::Q4_1 | Self::Q5_1 | Self::Q4_K | Self::Q5_K => &[0, 2],
            Self::Q6_K => &[QK_K / 2 + QK_K / 4 + QK_K / 16],
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
    if out.is_empty() {
        return Ok(());
    }
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
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            // Through the planar form the kernels use: one formula for both.
            let q = QuantRows::new(ty, out.len(), src.to_vec())?;
            q.dequantize_row(0, out);
        }
    }
    Ok(())
}
