//! Weight matrices kept in their GGML blocks.

use std::ops::Range;
use std::sync::Arc;

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
    planes: Planes,
}

/// Where a matrix's planes live: Q8_0 has one i8 quant per element and Q4_* 16 bytes per block
/// in GGML nibble order; then the f16 bits of each block's scale `d`, and of its minimum `m`
/// (Q4_1 only; empty otherwise).
#[derive(Debug, Clone)]
enum Planes {
    /// Vectors of its own, as built.
    Own { qs: Vec<u8>, d: Vec<u16>, m: Vec<u16> },
    /// Copied into a [`Packer`] that has not finished: not readable yet.
    Pending { chunk: usize, qs: Range<usize>, d: Range<usize>, m: Range<usize> },
    /// Ranges of the mappings that hold a whole model's matrices.
    Packed { maps: Arc<[memmap2::Mmap]>, chunk: usize, qs: Range<usize>, d: Range<usize>, m: Range<usize> },
}

impl Planes {
    fn get(&self) -> (&[u8], &[u16], &[u16]) {
        match self {
            Planes::Own { qs, d, m } => (qs, d, m),
            Planes::Pending { .. } => unreachable!("a matrix was read before its Packer finished"),
            Planes::Packed { maps, chunk, qs, d, m } => {
                let map = &maps[*chunk];
                (&map[qs.clone()], bytemuck::cast_slice(&map[d.clone()]), bytemuck::cast_slice(&map[m.clone()]))
            }
        }
    }
}

/// Moves matrices' planes, one matrix at a time (its vectors freed at once, so the heap never
/// holds more than one), into anonymous mappings advised onto transparent huge pages on Linux.
///
/// Why: a model's matrices are mostly smaller than a 2 MiB page each, so only together can
/// they fill huge pages, and on 4 KiB pages the products, which stream every weight once a
/// token, take a TLB miss every 4 KiB of each of their streams. Measured 2026-12-01 with
/// SmolLM2-135M Q4_1 on one core of the x86-64 dev VM: 68-72 tok/s before, 77-79 after, the
/// same tokens. Kernels without transparent huge pages keep small pages.
#[derive(Default)]
pub struct Packer {
    chunks: Vec<memmap2::MmapMut>,
    at: usize,
}

/// Bytes of each mapping (address space: only what is written becomes resident).
const PACK_CHUNK: usize = 64 << 20;

impl Packer {
    /// Moves `q`'s planes in; `q` must not be read until [`Packer::finish`] has run on it.
    pub fn put(&mut self, q: &mut QuantRows) -> std::io::Result<()> {
        // Every plane starts on a cache line (and so on a u16 boundary).
        let padded = |n: usize| n.next_multiple_of(64);
        let Planes::Own { qs, d, m } = &q.planes else { return Ok(()) };
        let need = padded(qs.len()) + padded(2 * d.len()) + padded(2 * m.len());
        if self.chunks.last().is_none_or(|c| self.at + need > c.len()) {
            let map = memmap2::MmapOptions::new().len(need.max(PACK_CHUNK)).map_anon()?;
            #[cfg(target_os = "linux")]
            if map.advise(memmap2::Advice::HugePage).is_err() {
                // Transparent huge pages compiled out or disabled: small pages, as before.
            }
            self.chunks.push(map);
            self.at = 0;
        }
        let (chunk, map) = (self.chunks.len() - 1, self.chunks.last_mut().expect("pushed above"));
        let mut put = |bytes: &[u8]| {
            let r = self.at..self.at + bytes.len();
            map[r.clone()].copy_from_slice(bytes);
            self.at += padded(bytes.len());
            r
        };
        let (qs, d, m) = (put(qs), put(bytemuck::cast_slice(d)), put(bytemuck::cast_slice(m)));
        q.planes = Planes::Pending { chunk, qs, d, m };
        Ok(())
    }

    /// Hands the mappings, read-only, to the matrices put in (`rows` may hold others too).
    pub fn finish(self, rows: &mut [&mut QuantRows]) -> std::io::Result<()> {
        let maps = self.chunks.into_iter().map(|c| c.make_read_only()).collect::<std::io::Result<Vec<_>>>()?;
        let maps: Arc<[memmap2::Mmap]> = maps.into();
        for q in rows.iter_mut() {
            if let Planes::Pending { chunk, qs, d, m } = &q.planes {
                let (chunk, qs, d, m) = (*chunk, qs.clone(), d.clone(), m.clone());
                q.planes = Planes::Packed { maps: maps.clone(), chunk, qs, d, m };
            }
        }
        Ok(())
    }
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
        let mut qs = Vec::with_capacity(nblocks * qb);
        let mut d = Vec::with_capacity(nblocks);
        let mut m = Vec::with_capacity(if ty == GgmlType::Q4_1 { nblocks } else { 0 });
        for blk in bytes.chunks_exact(ty.block_bytes()) {
            d.push(u16::from_le_bytes([blk[0], blk[1]]));
            if ty == GgmlType::Q4_1 {
                m.push(u16::from_le_bytes([blk[2], blk[3]]));
            }
            qs.extend_from_slice(&blk[header..]);
        }
        Ok(Self { ty, cols, rows: bytes.len() / row_bytes, planes: Planes::Own { qs, d, m } })
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
        let (qs, d, m) = self.planes.get();
        qs.len() + 2 * (d.len() + m.len())
    }

    /// Quants of rows `r` (contiguous, `blocks_per_row() * 16` or `* 32` bytes a row).
    pub(crate) fn qs_rows(&self, r: Range<usize>) -> &[u8] {
        let rb = self.blocks_per_row() * qs_per_block(self.ty);
        &self.planes.get().0[r.start * rb..r.end * rb]
    }

    /// f16 scale bits of rows `r`, one per block.
    pub(crate) fn d_rows(&self, r: Range<usize>) -> &[u16] {
        let nb = self.blocks_per_row();
        &self.planes.get().1[r.start * nb..r.end * nb]
    }

    /// f16 minimum bits of rows `r` (Q4_1), one per block; empty for the other types.
    pub(crate) fn m_rows(&self, r: Range<usize>) -> &[u16] {
        let nb = self.blocks_per_row();
        let m = self.planes.get().2;
        if m.is_empty() {
            &[]
        } else {
            &m[r.start * nb..r.end * nb]
        }
    }

    /// Raw planar storage `(quants, scale bits, minimum bits)`, e.g. for a GPU upload.
    pub fn planes(&self) -> (&[u8], &[u16], &[u16]) {
        self.planes.get()
    }

    /// Decodes row `r` into `out` (`cols` elements), with the same formulas as
    /// [`super::dequantize`].
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        let qb = qs_per_block(self.ty);
        let (all_qs, all_d, all_m) = self.planes.get();
        for (j, o) in out.chunks_exact_mut(QK).enumerate().take(nb) {
            let b = r * nb + j;
            let d = h2f(all_d[b]);
            let qs = &all_qs[b * qb..(b + 1) * qb];
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
                    let m = h2f(all_m[b]);
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
        let qb = qs_per_block(self.ty);
        let qs_row = self.qs_rows(r..r + 1);
        let (sc, mins) = (self.d_rows(r..r + 1), self.m_rows(r..r + 1));
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
                _ => d * sn + h2f(mins[j]) * xsum[j],
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
        let (all_qs, all_d, all_m) = self.planes.get();
        let mut qs = Vec::with_capacity(self.rows * (b1 - b0) * qb);
        let mut d = Vec::with_capacity(self.rows * (b1 - b0));
        let mut m = Vec::new();
        for r in 0..self.rows {
            let (s, e) = (r * nb + b0, r * nb + b1);
            qs.extend_from_slice(&all_qs[s * qb..e * qb]);
            d.extend_from_slice(&all_d[s..e]);
            if !all_m.is_empty() {
                m.extend_from_slice(&all_m[s..e]);
            }
        }
        Some(QuantRows { ty: self.ty, cols: c.len(), rows: self.rows, planes: Planes::Own { qs, d, m } })
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
