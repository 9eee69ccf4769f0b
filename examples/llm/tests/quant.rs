//! Dequantisation against blocks whose values were worked out by hand from the GGML layouts,
//! and against gguf-py's decoding of random blocks of every block type.

mod common;

use boltccl_llm::ops::Mat;
use boltccl_llm::quant::{dequantize, GgmlType, Packer, QuantError, QuantRows};
use boltccl_llm::sample::Rng;
use common::gguf_writer as gw;

fn f16_bits(bits: u16) -> [u8; 2] {
    bits.to_le_bytes()
}

#[test]
fn q8_0_block() {
    // d = 0.5 (f16 0x3800); q = -128, -1, 0, 1, 127, then i - 16 for the rest.
    let mut blk = f16_bits(0x3800).to_vec();
    let mut q: Vec<i8> = vec![-128, -1, 0, 1, 127];
    q.extend((5..32).map(|i| i as i8 - 16));
    blk.extend(q.iter().map(|&v| v as u8));
    assert_eq!(blk.len(), 34);
    let mut out = [0f32; 32];
    dequantize(GgmlType::Q8_0, &blk, &mut out).unwrap();
    assert_eq!(&out[..5], &[-64.0, -0.5, 0.0, 0.5, 63.5]);
    assert_eq!(out[5], -5.5); // (5 - 16) * 0.5
    assert_eq!(out[31], 7.5); // (31 - 16) * 0.5
}

#[test]
fn q4_0_block_nibble_order() {
    // d = 2.0 (0x4000). Byte j holds element j (low nibble) and element j + 16 (high nibble);
    // value = (nibble - 8) * d.
    let mut blk = f16_bits(0x4000).to_vec();
    let mut qs = [0x80u8; 16]; // low 0 -> -16, high 8 -> 0
    qs[0] = 0x3A; // low 0xA -> (10-8)*2 = 4 ; high 0x3 -> (3-8)*2 = -10
    qs[15] = 0xF7; // low 7 -> -2 ; high 15 -> 14
    blk.extend_from_slice(&qs);
    assert_eq!(blk.len(), 18);
    let mut out = [0f32; 32];
    dequantize(GgmlType::Q4_0, &blk, &mut out).unwrap();
    assert_eq!(out[0], 4.0);
    assert_eq!(out[16], -10.0);
    assert_eq!(out[15], -2.0);
    assert_eq!(out[31], 14.0);
    assert!(out[1..15].iter().all(|&v| v == -16.0));
    assert!(out[17..31].iter().all(|&v| v == 0.0));
}

#[test]
fn q4_1_block_scale_and_min() {
    // d = 0.25 (0x3400), m = -1.0 (0xBC00): value = nibble * d + m.
    let mut blk = f16_bits(0x3400).to_vec();
    blk.extend_from_slice(&f16_bits(0xBC00));
    let mut qs = [0x00u8; 16];
    qs[0] = 0xF0; // x0 = -1.0, x16 = 15*0.25 - 1 = 2.75
    qs[1] = 0x48; // x1 = 8*0.25 - 1 = 1.0, x17 = 4*0.25 - 1 = 0.0
    blk.extend_from_slice(&qs);
    assert_eq!(blk.len(), 20);
    let mut out = [0f32; 32];
    dequantize(GgmlType::Q4_1, &blk, &mut out).unwrap();
    assert_eq!(out[0], -1.0);
    assert_eq!(out[16], 2.75);
    assert_eq!(out[1], 1.0);
    assert_eq!(out[17], 0.0);
    assert_eq!(out[2], -1.0);
}

#[test]
fn two_blocks_are_independent() {
    // Block 0: d = 1.0 (0x3C00), all q = 3; block 1: d = -2.0 (0xC000), all q = 1.
    let mut b = f16_bits(0x3C00).to_vec();
    b.extend([3u8; 32]);
    b.extend(f16_bits(0xC000));
    b.extend([1u8; 32]);
    let mut out = [0f32; 64];
    dequantize(GgmlType::Q8_0, &b, &mut out).unwrap();
    assert!(out[..32].iter().all(|&v| v == 3.0));
    assert!(out[32..].iter().all(|&v| v == -2.0));
}

#[test]
fn float_types() {
    let mut out = [0f32; 2];
    // f16: 1.0 = 0x3C00, -2.5 = 0xC100
    dequantize(GgmlType::F16, &[0x00, 0x3C, 0x00, 0xC1], &mut out).unwrap();
    assert_eq!(out, [1.0, -2.5]);
    // bf16: top half of the f32 bits. 1.0 = 0x3F80, -0.5 = 0xBF00
    dequantize(GgmlType::BF16, &[0x80, 0x3F, 0x00, 0xBF], &mut out).unwrap();
    assert_eq!(out, [1.0, -0.5]);
    let mut b = 1.5f32.to_le_bytes().to_vec();
    b.extend(7.25f32.to_le_bytes());
    dequantize(GgmlType::F32, &b, &mut out).unwrap();
    assert_eq!(out, [1.5, 7.25]);
}

#[test]
fn errors_instead_of_panics() {
    let mut out = [0f32; 32];
    assert!(matches!(
        dequantize(GgmlType::Q4_1, &[0u8; 19], &mut out),
        Err(QuantError::Short { need: 20, have: 19, .. })
    ));
    let mut odd = [0f32; 31];
    assert!(matches!(dequantize(GgmlType::Q8_0, &[0u8; 34], &mut odd), Err(QuantError::Ragged { .. })));
    assert!(matches!(GgmlType::from_id(10), Err(QuantError::Unsupported(10))));
    // The message names the type and what is supported.
    let msg = GgmlType::from_id(10).unwrap_err().to_string();
    assert!(msg.contains("Q2_K") && msg.contains("Q4_K, Q5_K, Q6_K"), "{msg}");
    assert_eq!(GgmlType::from_id(3).unwrap(), GgmlType::Q4_1);
    assert_eq!(GgmlType::from_id(12).unwrap(), GgmlType::Q4_K);
    assert_eq!(GgmlType::Q4_K.bytes_for(512).unwrap(), 288);
    assert!(matches!(GgmlType::Q6_K.bytes_for(288), Err(QuantError::Ragged { block: 256, .. })));
    assert_eq!(GgmlType::Q4_0.bytes_for(64).unwrap(), 36);
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
}

/// Products on quantised storage equal products on the decoded f32 matrix, for every block
/// type, for matvec and batched matmul, and for block-aligned column shards.
#[test]
fn quantized_matrices_multiply_like_their_f32_decoding() {
    let (rows, cols) = (37, 96);
    let mut rng = Rng::new(9);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.next_f32() * 2.0 - 1.0).collect();
    let xs: Vec<f32> = (0..3 * cols).map(|_| rng.next_f32() - 0.5).collect();
    type Enc = fn(&[f32]) -> (Vec<u8>, Vec<f32>);
    for (ty, enc) in
        [(GgmlType::Q8_0, gw::q8_0 as Enc), (GgmlType::Q4_0, gw::q4_0 as Enc), (GgmlType::Q4_1, gw::q4_1 as Enc)]
    {
        let (bytes, dense) = enc(&w);
        let q = QuantRows::new(ty, cols, bytes).unwrap();
        assert_eq!(q.rows(), rows);
        let qm = Mat::quantized(q.clone());
        let fm = Mat::new(rows, cols, dense.clone());
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        qm.matvec(&xs[..cols], &mut a).unwrap();
        fm.matvec(&xs[..cols], &mut b).unwrap();
        assert!(close(&a, &b), "{ty:?} matvec: {a:?} vs {b:?}");
        let (mut a, mut b) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
        qm.matmul(&xs, 3, &mut a).unwrap();
        fm.matmul(&xs, 3, &mut b).unwrap();
        assert!(close(&a, &b), "{ty:?} matmul");
        // Decoding a row gives exactly the encoder's values.
        let mut row = vec![0f32; cols];
        q.dequantize_row(5, &mut row);
        assert_eq!(&row[..], &dense[5 * cols..6 * cols]);
        // Column shards: aligned ones stay quantised and decode to the same columns.
        let s = q.slice_cols(32..96).unwrap();
        let sd = s.dequantize_all();
        for r in 0..rows {
            assert_eq!(&sd[r * 64..(r + 1) * 64], &dense[r * cols + 32..(r + 1) * cols]);
        }
        assert!(q.slice_cols(16..48).is_none(), "unaligned shard must fall back to f32");
    }
}

/// Packed matrices (one mapping for all, on huge pages where the kernel allows) hold the same
/// planes and give the same products, bit for bit, as the vectors they were built in; and
/// one matrix larger than a packing chunk gets a mapping of its own.
#[test]
fn packed_matrices_are_the_same_matrices() {
    let mut rng = Rng::new(17);
    type Enc = fn(&[f32]) -> (Vec<u8>, Vec<f32>);
    let shapes = [
        (GgmlType::Q4_1, 37, 96, gw::q4_1 as Enc),
        (GgmlType::Q8_0, 5, 64, gw::q8_0),
        (GgmlType::Q4_0, 9, 32, gw::q4_0),
    ];
    let built: Vec<QuantRows> = shapes
        .iter()
        .map(|&(ty, rows, cols, enc)| {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.next_f32() * 2.0 - 1.0).collect();
            QuantRows::new(ty, cols, enc(&w).0).unwrap()
        })
        .collect();
    let mut packed = built.clone();
    let mut packer = Packer::default();
    for q in packed.iter_mut() {
        packer.put(q).unwrap();
    }
    packer.finish(&mut packed.iter_mut().collect::<Vec<_>>()).unwrap();
    for (a, b) in built.iter().zip(&packed) {
        assert_eq!(a.planes(), b.planes(), "{:?}", a.ty);
        let x: Vec<f32> = (0..a.cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut ya, mut yb) = (vec![0f32; a.rows()], vec![0f32; b.rows()]);
        Mat::quantized_q8(a.clone()).matvec(&x, &mut ya).unwrap();
        Mat::quantized_q8(b.clone()).matvec(&x, &mut yb).unwrap();
        assert_eq!(
            ya.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            yb.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
    // 70 MiB of Q8_0 rows in one matrix: more than a packing chunk, so a mapping of its own.
    let (rows, cols) = (2112, 32 * 1024);
    let big = QuantRows::new(GgmlType::Q8_0, cols, vec![0u8; rows * cols / 32 * 34]).unwrap();
    let mut copy = big.clone();
    let mut packer = Packer::default();
    packer.put(&mut copy).unwrap();
    packer.finish(&mut [&mut copy]).unwrap();
    assert_eq!(big.planes(), copy.planes());
}

/// gguf-py's (`gguf.quants.dequantize`, package gguf 0.19.0) decoding of seeded random blocks
/// of every block type, generated by `tools/dequant_reference.py`: the crate must decode the
/// same bytes to the same bits, through [`dequantize`] and through [`QuantRows`] (the planes
/// the kernels read), whole and sliced into rows.
#[test]
fn every_block_type_decodes_like_gguf_py() {
    let data = include_bytes!("data/gguf_py_dequant.bin");
    let mut at = 0;
    let u32_at = |at: &mut usize| {
        let v = u32::from_le_bytes(data[*at..*at + 4].try_into().unwrap());
        *at += 4;
        v as usize
    };
    let mut seen = Vec::new();
    while at < data.len() {
        let (id, n, nbytes) = (u32_at(&mut at), u32_at(&mut at), u32_at(&mut at));
        let ty = GgmlType::from_id(id as u32).unwrap();
        let bytes = &data[at..at + nbytes];
        at += nbytes;
        let want: Vec<f32> =
            data[at..at + 4 * n].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        at += 4 * n;
        let mut got = vec![0f32; n];
        dequantize(ty, bytes, &mut got).unwrap();
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        eprintln!("{ty:?}: {n} values, max |crate - gguf-py| = {diff:e}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{ty:?} element {i}: {a} vs gguf-py {b}");
        }
        // The same bytes as rows of a matrix (two rows, or one when a row needs all of it).
        let cols = if n % (2 * ty.block_elems()) == 0 { n / 2 } else { n };
        let q = QuantRows::new(ty, cols, bytes.to_vec()).unwrap();
        assert_eq!(q.dequantize_all(), got, "{ty:?} rows");
        seen.push(ty);
    }
    for ty in [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q4_1] {
        assert!(seen.contains(&ty), "no reference vectors for {ty:?}");
    }
}

/// One Q4_K super-block and one Q6_K super-block decoded by hand from the layouts.
#[test]
fn k_quant_blocks_by_hand() {
    // Q4_K: d = 0.5, dmin = 0.25; sub-block t has scale t + 1 and minimum 2t (6-bit packing:
    // t < 4 in the low 6 bits of bytes t and t + 4, t >= 4 split across byte t + 4 and the top
    // bits of bytes t - 4 and t).
    let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8u8).map(|t| (t + 1, 2 * t)).unzip();
    let mut s = [0u8; 12];
    for t in 0..4 {
        s[t] = sc[t] | (sc[t + 4] >> 4) << 6;
        s[t + 4] = mn[t] | (mn[t + 4] >> 4) << 6;
        s[t + 8] = (sc[t + 4] & 0x0F) | (mn[t + 4] & 0x0F) << 4;
    }
    let mut blk = Vec::new();
    blk.extend(half::f16::from_f32(0.5).to_le_bytes());
    blk.extend(half::f16::from_f32(0.25).to_le_bytes());
    blk.extend(s);
    // Bytes 32p..32p+32 hold sub-block 2p in the low nibbles and 2p + 1 in the high ones.
    blk.extend((0..128).map(|i: usize| (i % 16) as u8 | (15 - (i % 16) as u8) << 4));
    let mut out = [0f32; 256];
    dequantize(GgmlType::Q4_K, &blk, &mut out).unwrap();
    for t in 0..8 {
        for l in [0, 5, 31] {
            let q = if t % 2 == 0 { l % 16 } else { 15 - l % 16 } as f32;
            let want = 0.5 * (t + 1) as f32 * q - 0.25 * (2 * t) as f32;
            assert_eq!(out[32 * t + l], want, "sub-block {t} element {l}");
        }
    }
    // Q6_K: every 6-bit quant 33 (value 1), scales[i] = i - 8, d = 2: element e is 2 * (e/16 - 8).
    let mut blk = vec![0x11u8; 128]; // low 4 bits 1 in both nibbles
    blk.extend([0xAAu8; 64]); // high 2 bits 0b10 in every pair: 1 + 32 = 33
    blk.extend((0..16).map(|i: i32| (i - 8) as i8 as u8));
    blk.extend(half::f16::from_f32(2.0).to_le_bytes());
    dequantize(GgmlType::Q6_K, &blk, &mut out).unwrap();
    for (e, &v) in out.iter().enumerate() {
        assert_eq!(v, 2.0 * (e as i32 / 16 - 8) as f32, "element {e}");
    }
}

#[test]
fn f16_fields_are_the_scales() {
    // Random bytes decode to something nonzero; with the f16 fields set to zero (scale and min
    // both), every element is zero: the offsets are where the scales are.
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let mut blk: Vec<u8> = (0..ty.block_bytes())
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 56) as u8
            })
            .collect();
        let mut out = vec![0f32; ty.block_elems()];
        for &at in ty.f16_fields() {
            blk[at..at + 2].copy_from_slice(&f16_bits(0x3c00)); // 1.0
        }
        dequantize(ty, &blk, &mut out).unwrap();
        assert!(out.iter().any(|&v| v != 0.0), "{ty:?}: random bytes decoded to zeros");
        for &at in ty.f16_fields() {
            blk[at..at + 2].copy_from_slice(&f16_bits(0));
        }
        dequantize(ty, &blk, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 0.0), "{ty:?}: {:?} are not all of its scales", ty.f16_fields());
    }
}
