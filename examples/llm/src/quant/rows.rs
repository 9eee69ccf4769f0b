//! Weight matrices kept in their GGML blocks.

use std::ops::Range;
use std::sync::Arc;

use half::f16;

use super::{GgmlType, QuantError, QK, QK_K};

/// A matrix kept block-quantised and multiplied without expanding it: the file's bytes (4-7x
/// less memory and memory traffic than f32), rearranged into planes.
///
/// Stored planar: all quants row after row, then the types' other planes (see `Layout` in
/// `rows.rs`): the fifth/sixth bits, the K-quants' sub-block scales, one f16 scale (and one f16
/// minimum) per block or super-block; so the SIMD kernels load 16 or 32 bytes of quants per block and
/// convert eight scales with one instruction, instead of picking 18- to 210-byte blocks apart.
#[derive(Debug, Clone)]
pub struct QuantRows {
    /// Encoding (one of the block-quantised [`GgmlType`]s).
    pub ty: GgmlType,
    /// Elements per row.
    pub cols: usize,
    rows: usize,
    planes: Planes,
}

/// Bytes of each plane per scale group: a block of 32 (legacy types) or a super-block of 256
/// (K-quants), which has one f16 scale `d` (and one f16 minimum `m`, where the type has one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Elements per group.
    pub group: usize,
    /// Quant bytes (low bits) per group: the file's `qs` (`ql` for Q6_K), in file order.
    pub qs: usize,
    /// High-bit bytes per group (Q5_0/Q5_1: the `u32`; Q5_K, Q6_K: `qh`), in file order.
    pub qh: usize,
    /// Sub-block scale bytes per group: Q4_K/Q5_K eight 6-bit scales then eight 6-bit minimums,
    /// unpacked to a byte each; Q6_K its sixteen i8 scales.
    pub sc: usize,
    /// Whether there is a minimum plane (Q4_1, Q5_1: `m`; Q4_K, Q5_K: `dmin`).
    pub min: bool,
}

/// The planes of `ty` (a block-quantised type).
pub(crate) fn layout(ty: GgmlType) -> Layout {
    let l = |group, qs, qh, sc, min| Layout { group, qs, qh, sc, min };
    match ty {
        GgmlType::Q8_0 => l(QK, QK, 0, 0, false),
        GgmlType::Q4_0 => l(QK, QK / 2, 0, 0, false),
        GgmlType::Q4_1 => l(QK, QK / 2, 0, 0, true),
        GgmlType::Q5_0 => l(QK, QK / 2, 4, 0, false),
        GgmlType::Q5_1 => l(QK, QK / 2, 4, 0, true),
        GgmlType::Q4_K => l(QK_K, QK_K / 2, 0, 16, true),
        GgmlType::Q5_K => l(QK_K, QK_K / 2, QK_K / 8, 16, true),
        GgmlType::Q6_K => l(QK_K, QK_K / 2, QK_K / 4, 16, false),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("{ty:?} is not block-quantised"),
    }
}

/// Borrowed planes (of a whole matrix or of some rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneRefs<'a> {
    /// Low-bit quants.
    pub qs: &'a [u8],
    /// High bits (Q5_*, Q5_K, Q6_K), else empty.
    pub qh: &'a [u8],
    /// Sub-block scales (K-quants), else empty.
    pub sc: &'a [u8],
    /// f16 scale bits, one per group.
    pub d: &'a [u16],
    /// f16 minimum bits, one per group (types with a minimum), else empty.
    pub m: &'a [u16],
}

/// Where a matrix's planes live (see [`Layout`]).
#[derive(Debug, Clone)]
enum Planes {
    /// Vectors of its own, as built.
    Own { qs: Vec<u8>, qh: Vec<u8>, sc: Vec<u8>, d: Vec<u16>, m: Vec<u16> },
    /// Copied into a [`Packer`] that has not finished: not readable yet.
    Pending { chunk: usize, at: [Range<usize>; 5] },
    /// Ranges of the mappings that hold a whole model's matrices.
    Packed { maps: Arc<[memmap2::Mmap]>, chunk: usize, at: [Range<usize>; 5] },
}

impl Planes {
    fn get(&self) -> PlaneRefs<'_> {
        match self {
            Planes::Own { qs, qh, sc, d, m } => PlaneRefs { qs, qh, sc, d, m },
            Planes::Pending { .. } => unreachable!("a matrix was read before its Packer finished"),
            Planes::Packed { maps, chunk, at } => {
                let map = &maps[*chunk];
                PlaneRefs {
                    qs: &map[at[0].clone()],
                    qh: &map[at[1].clone()],
                    sc: &map[at[2].clone()],
                    d: bytemuck::cast_slice(&map[at[3].clone()]),
                    m: bytemuck::cast_slice(&map[at[4].clone()]),
                }
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
        let Planes::Own { qs, qh, sc, d, m } = &q.planes else { return Ok(()) };
        let parts: [&[u8]; 5] = [qs, qh, sc, bytemuck::cast_slice(d), bytemuck::cast_slice(m)];
        let need: usize = parts.iter().map(|p| padded(p.len())).sum();
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
        let at = parts.map(|bytes| {
            let r = self.at..self.at + bytes.len();
            map[r.clone()].copy_from_slice(bytes);
            self.at += padded(bytes.len());
            r
        });
        q.planes = Planes::Pending { chunk, at };
        Ok(())
    }

    /// Hands the mappings, read-only, to the matrices put in (`rows` may hold others too).
    pub fn finish(self, rows: &mut [&mut QuantRows]) -> std::io::Result<()> {
        let maps = self.chunks.into_iter().map(|c| c.make_read_only()).collect::<std::io::Result<Vec<_>>>()?;
        let maps: Arc<[memmap2::Mmap]> = maps.into();
        for q in rows.iter_mut() {
            if let Planes::Pending { chunk, at } = &q.planes {
                q.planes = Planes::Packed { maps: maps.clone(), chunk: *chunk, at: at.clone() };
            }
        }
        Ok(())
    }
}

/// Bytes of quants per 32-element block.
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

/// One 32-element block's terms: integer weights `w` (element order), the f32 weight scale of
/// its lanes 0-3 and 4-7 (elements 0..15 and 16..31; different only for Q6_K), and the
/// minimum per unit of activation sum, if the type has one. Its values are `dw * w (+ mw)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockTerms {
    pub w: [i32; QK],
    pub dw: [f32; 2],
    pub mw: Option<f32>,
}

/// The terms of block `b` of row `i`, from planes `p` of rows with `nb` blocks each (`p`
/// starts at row 0 of those rows). Every scale product here is exact in f32 (an f16 times an
/// integer of at most 8 bits).
#[inline]
pub(crate) fn block_terms(ty: GgmlType, p: PlaneRefs, nb: usize, i: usize, b: usize) -> BlockTerms {
    let lay = layout(ty);
    let per = lay.group / QK; // blocks per group
    let (g, t) = (i * nb / per + b / per, b % per); // group (global), block within it
    let qs = &p.qs[g * lay.qs..][..lay.qs];
    let mut w = [0i32; QK];
    let d = h2f(p.d[g]);
    let nib = |q: &[u8], e: usize| (if e < QK / 2 { q[e] & 0x0F } else { q[e - QK / 2] >> 4 }) as i32;
    match ty {
        GgmlType::Q8_0 => {
            for (o, &v) in w.iter_mut().zip(qs) {
                *o = v as i8 as i32;
            }
            BlockTerms { w, dw: [d; 2], mw: None }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let off = if ty == GgmlType::Q4_0 { 8 } else { 0 };
            for (e, o) in w.iter_mut().enumerate() {
                *o = nib(qs, e) - off;
            }
            BlockTerms { w, dw: [d; 2], mw: lay.min.then(|| h2f(p.m[g])) }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let qh = u32::from_le_bytes(p.qh[g * 4..g * 4 + 4].try_into().expect("4 bytes"));
            let off = if ty == GgmlType::Q5_0 { 16 } else { 0 };
            for (e, o) in w.iter_mut().enumerate() {
                *o = (nib(qs, e) | ((qh >> e) as i32 & 1) << 4) - off;
            }
            BlockTerms { w, dw: [d; 2], mw: lay.min.then(|| h2f(p.m[g])) }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let q = &qs[(t / 2) * QK..][..QK];
            let sc = &p.sc[g * 16..][..16];
            for (l, o) in w.iter_mut().enumerate() {
                *o = (if t % 2 == 0 { q[l] & 0x0F } else { q[l] >> 4 }) as i32;
                if ty == GgmlType::Q5_K {
                    *o |= ((p.qh[g * 32 + l] >> t) as i32 & 1) << 4;
                }
            }
            let dw = d * sc[t] as f32;
            BlockTerms { w, dw: [dw; 2], mw: Some(-(h2f(p.m[g]) * sc[8 + t] as f32)) }
        }
        GgmlType::Q6_K => {
            let (half, qq) = (t / 4, t % 4);
            let ql = &qs[64 * half + 32 * (qq % 2)..][..QK];
            let qh = &p.qh[g * 64 + 32 * half..][..QK];
            for (l, o) in w.iter_mut().enumerate() {
                let lo = if qq < 2 { ql[l] & 0x0F } else { ql[l] >> 4 };
                *o = (lo | ((qh[l] >> (2 * qq)) & 3) << 4) as i32 - 32;
            }
            let sc = &p.sc[g * 16 + 2 * t..][..2];
            BlockTerms { w, dw: [d * sc[0] as i8 as f32, d * sc[1] as i8 as f32], mw: None }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("not block-quantised"),
    }
}

/// Q4_K/Q5_K's twelve bytes of 6-bit scales and minimums, unpacked (llama.cpp's
/// `get_scale_min_k4`): eight scales, then eight minimums.
fn unpack_k4_scales(q: &[u8]) -> [u8; 16] {
    let mut o = [0u8; 16];
    for j in 0..8 {
        (o[j], o[8 + j]) = if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
        };
    }
    o
}

impl QuantRows {
    /// Parses rows of `cols` elements stored in the GGML block encoding `ty`.
    pub fn new(ty: GgmlType, cols: usize, bytes: Vec<u8>) -> Result<Self, QuantError> {
        if !ty.is_block_quantized() {
            return Err(QuantError::NotBlockQuantized(ty));
        }
        let row_bytes = ty.bytes_for(cols)?;
        if row_bytes == 0 || !bytes.len().is_multiple_of(row_bytes) {
            return Err(QuantError::Short { ty, need: row_bytes, have: bytes.len() % row_bytes.max(1) });
        }
        let ng = bytes.len() / ty.block_bytes();
        let lay = layout(ty);
        let mut qs = Vec::with_capacity(ng * lay.qs);
        let mut qh = Vec::with_capacity(ng * lay.qh);
        let mut sc = Vec::with_capacity(ng * lay.sc);
        let mut d = Vec::with_capacity(ng);
        let mut m = Vec::with_capacity(if lay.min { ng } else { 0 });
        let h = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
        for blk in bytes.chunks_exact(ty.block_bytes()) {
            match ty {
                GgmlType::Q8_0 | GgmlType::Q4_0 => {
                    d.push(h(blk));
                    qs.extend_from_slice(&blk[2..]);
                }
                GgmlType::Q4_1 => {
                    d.push(h(blk));
                    m.push(h(&blk[2..]));
                    qs.extend_from_slice(&blk[4..]);
                }
                GgmlType::Q5_0 => {
                    d.push(h(blk));
                    qh.extend_from_slice(&blk[2..6]);
                    qs.extend_from_slice(&blk[6..]);
                }
                GgmlType::Q5_1 => {
                    d.push(h(blk));
                    m.push(h(&blk[2..]));
                    qh.extend_from_slice(&blk[4..8]);
                    qs.extend_from_slice(&blk[8..]);
                }
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    d.push(h(blk));
                    m.push(h(&blk[2..]));
                    sc.extend_from_slice(&unpack_k4_scales(&blk[4..16]));
                    let q = if ty == GgmlType::Q5_K {
                        qh.extend_from_slice(&blk[16..48]);
                        &blk[48..]
                    } else {
                        &blk[16..]
                    };
                    qs.extend_from_slice(q);
                }
                GgmlType::Q6_K => {
                    qs.extend_from_slice(&blk[..128]);
                    qh.extend_from_slice(&blk[128..192]);
                    sc.extend_from_slice(&blk[192..208]);
                    d.push(h(&blk[208..]));
                }
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("checked above"),
            }
        }
        Ok(Self { ty, cols, rows: bytes.len() / row_bytes, planes: Planes::Own { qs, qh, sc, d, m } })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// 32-element blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// Scale groups (blocks, or K-quant super-blocks) per row.
    fn groups_per_row(&self) -> usize {
        self.cols / layout(self.ty).group
    }

    /// Bytes held (quants, high bits, sub-block scales, scales, minimums): the file's bytes for
    /// these rows (plus 4 bytes per K-quant super-block, whose 6-bit scales are unpacked).
    pub fn size_bytes(&self) -> usize {
        let p = self.planes.get();
        p.qs.len() + p.qh.len() + p.sc.len() + 2 * (p.d.len() + p.m.len())
    }

    /// The planes of rows `r`.
    pub(crate) fn planes_rows(&self, r: Range<usize>) -> PlaneRefs<'_> {
        let (lay, ng) = (layout(self.ty), self.groups_per_row());
        let p = self.planes.get();
        let sl = |s: &[u8], per: usize| -> Range<usize> {
            if s.is_empty() {
                0..0
            } else {
                r.start * ng * per..r.end * ng * per
            }
        };
        PlaneRefs {
            qs: &p.qs[sl(p.qs, lay.qs)],
            qh: &p.qh[sl(p.qh, lay.qh)],
            sc: &p.sc[sl(p.sc, lay.sc)],
            d: &p.d[r.start * ng..r.end * ng],
            m: if p.m.is_empty() { &[] } else { &p.m[r.start * ng..r.end * ng] },
        }
    }

    /// Quants of rows `r` (contiguous, `blocks_per_row() * 16` or `* 32` bytes a row).
    pub(crate) fn qs_rows(&self, r: Range<usize>) -> &[u8] {
        self.planes_rows(r).qs
    }

    /// f16 scale bits of rows `r`, one per block (legacy types) or super-block (K-quants).
    pub(crate) fn d_rows(&self, r: Range<usize>) -> &[u16] {
        self.planes_rows(r).d
    }

    /// f16 minimum bits of rows `r` (Q4_1, Q5_1; Q4_K/Q5_K's `dmin`), one per group; empty
    /// for the other types.
    pub(crate) fn m_rows(&self, r: Range<usize>) -> &[u16] {
        self.planes_rows(r).m
    }

    /// Raw planar storage, e.g. for a GPU upload.
    pub fn planes(&self) -> PlaneRefs<'_> {
        self.planes.get()
    }

    /// Decodes row `r` into `out` (`cols` elements), with the same formulas as
    /// [`super::dequantize`] (and gguf-py's).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        let p = self.planes.get();
        for (j, o) in out.chunks_exact_mut(QK).enumerate().take(nb) {
            let bt = block_terms(self.ty, p, nb, r, j);
            for (e, x) in o.iter_mut().enumerate() {
                let v = bt.dw[e / (QK / 2)] * bt.w[e] as f32;
                *x = match bt.mw {
                    Some(m) => v + m,
                    None => v,
                };
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
        if !matches!(self.ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1) {
            // The 5- and 6-bit types: each block decoded, then multiplied (a reference mode).
            let (nb, p) = (self.blocks_per_row(), self.planes.get());
            let mut v = [0f32; QK];
            let mut acc = 0f32;
            for (j, xb) in x.chunks_exact(QK).enumerate() {
                let bt = block_terms(self.ty, p, nb, r, j);
                for (e, o) in v.iter_mut().enumerate() {
                    *o = bt.w[e] as f32;
                }
                let (lo, hi) = (block_dot16(&v[..16], &xb[..16]), block_dot16(&v[16..], &xb[16..]));
                acc += bt.dw[0] * lo + bt.dw[1] * hi + bt.mw.map_or(0.0, |m| m * xsum[j]);
            }
            return acc;
        }
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

    /// Columns `c` of every row, if `c` falls on scale-group boundaries (32 elements, 256 for
    /// the K-quants): the shard of a row-parallel layer; `None` otherwise, and the caller falls
    /// back to f32.
    pub fn slice_cols(&self, c: Range<usize>) -> Option<QuantRows> {
        let lay = layout(self.ty);
        let gsz = lay.group;
        if !c.start.is_multiple_of(gsz) || !c.end.is_multiple_of(gsz) || c.end > self.cols || c.is_empty() {
            return None;
        }
        let ng = self.groups_per_row();
        let (g0, g1) = (c.start / gsz, c.end / gsz);
        let p = self.planes.get();
        let take = |v: &[u8], per: usize| -> Vec<u8> {
            let mut out = Vec::with_capacity(self.rows * (g1 - g0) * per);
            if per > 0 {
                for r in 0..self.rows {
                    out.extend_from_slice(&v[(r * ng + g0) * per..(r * ng + g1) * per]);
                }
            }
            out
        };
        let take16 = |v: &[u16]| -> Vec<u16> {
            let mut out = Vec::with_capacity(self.rows * (g1 - g0));
            if !v.is_empty() {
                for r in 0..self.rows {
                    out.extend_from_slice(&v[r * ng + g0..r * ng + g1]);
                }
            }
            out
        };
        let planes = Planes::Own {
            qs: take(p.qs, lay.qs),
            qh: take(p.qh, lay.qh),
            sc: take(p.sc, lay.sc),
            d: take16(p.d),
            m: take16(p.m),
        };
        Some(QuantRows { ty: self.ty, cols: c.len(), rows: self.rows, planes })
    }
}

/// Dot product of 16 elements with 8 independent accumulators.
#[inline]
fn block_dot16(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            s[l] += x[l] * y[l];
        }
    }
    (s[0] + s[4]) + (s[1] + s[5]) + ((s[2] + s[6]) + (s[3] + s[7]))
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
        assert_eq!(unpack_k4_scales(&[1, 2, 3, 4, 5, 6, 7, 8, 0x21, 0x43, 0x65, 0x87])[..8], [1, 2, 3, 4, 1, 3, 5, 7]);
        assert_eq!(q.m_rows(0..1), &[f16::from_f32(-0.5).to_bits()]);
        let mut row = [0f32; 32];
        q.dequantize_row(1, &mut row);
        assert_eq!(row[3], 2.5);
        assert_eq!(row[16], 14.5);
    }
}
