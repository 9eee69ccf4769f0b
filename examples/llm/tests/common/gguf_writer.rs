//! Minimal GGUF v3 writer plus reference block encoders, for tests only. The encoders return the
//! values a correct decoder must produce (computed here with `half`, not with the crate).

use half::f16;

/// A metadata value to write.
pub enum Meta {
    U32(u32),
    F32(f32),
    Str(String),
}

/// Tensor to write: name, shape (outermost first), GGML type id, raw bytes.
pub struct RawTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub ty: u32,
    pub bytes: Vec<u8>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// Serialises a GGUF v3 file with 32-byte alignment.
pub fn write(meta: &[(&str, Meta)], tensors: &[RawTensor]) -> Vec<u8> {
    let mut o = b"GGUF".to_vec();
    o.extend(3u32.to_le_bytes());
    o.extend((tensors.len() as u64).to_le_bytes());
    o.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut o, k);
        match v {
            Meta::U32(x) => {
                o.extend(4u32.to_le_bytes());
                o.extend(x.to_le_bytes());
            }
            Meta::F32(x) => {
                o.extend(6u32.to_le_bytes());
                o.extend(x.to_le_bytes());
            }
            Meta::Str(s) => {
                o.extend(8u32.to_le_bytes());
                put_str(&mut o, s);
            }
        }
    }
    let mut offset = 0usize;
    let mut offsets = Vec::new();
    for t in tensors {
        put_str(&mut o, &t.name);
        o.extend((t.shape.len() as u32).to_le_bytes());
        for d in t.shape.iter().rev() {
            o.extend((*d as u64).to_le_bytes()); // GGUF lists the innermost dimension first
        }
        o.extend(t.ty.to_le_bytes());
        o.extend((offset as u64).to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.bytes.len()).div_ceil(32) * 32;
    }
    o.resize(o.len().div_ceil(32) * 32, 0);
    let base = o.len();
    for (t, off) in tensors.iter().zip(offsets) {
        o.resize(base + off, 0);
        o.extend(&t.bytes);
    }
    o
}

fn h(x: f32) -> (f16, f32) {
    let v = f16::from_f32(x);
    (v, v.to_f32())
}

/// Q8_0 encode; returns (bytes, decoded values).
pub fn q8_0(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let (mut b, mut v) = (Vec::new(), Vec::new());
    for blk in x.chunks(32) {
        let amax = blk.iter().fold(0f32, |m, a| m.max(a.abs()));
        let (d16, d) = h(amax / 127.0);
        b.extend(d16.to_le_bytes());
        for &a in blk {
            let q = if d == 0.0 { 0 } else { (a / d).round().clamp(-127.0, 127.0) as i8 };
            b.push(q as u8);
            v.push(d * q as f32);
        }
    }
    (b, v)
}

/// Q4_0 encode (low nibbles = first 16 elements).
pub fn q4_0(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let (mut b, mut v) = (Vec::new(), vec![0f32; x.len()]);
    for (bi, blk) in x.chunks(32).enumerate() {
        let amax = blk.iter().fold(0f32, |m, a| m.max(a.abs()));
        let (d16, d) = h(amax / 7.0);
        b.extend(d16.to_le_bytes());
        let q: Vec<u8> =
            blk.iter().map(|&a| if d == 0.0 { 8 } else { ((a / d).round() + 8.0).clamp(0.0, 15.0) as u8 }).collect();
        for j in 0..16 {
            b.push(q[j] | (q[j + 16] << 4));
        }
        for (j, &qj) in q.iter().enumerate() {
            v[bi * 32 + j] = (qj as f32 - 8.0) * d;
        }
    }
    (b, v)
}

/// Q4_1 encode (scale + minimum).
pub fn q4_1(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let (mut b, mut v) = (Vec::new(), vec![0f32; x.len()]);
    for (bi, blk) in x.chunks(32).enumerate() {
        let lo = blk.iter().cloned().fold(f32::MAX, f32::min);
        let hi = blk.iter().cloned().fold(f32::MIN, f32::max);
        let (d16, d) = h((hi - lo) / 15.0);
        let (m16, m) = h(lo);
        b.extend(d16.to_le_bytes());
        b.extend(m16.to_le_bytes());
        let q: Vec<u8> =
            blk.iter().map(|&a| if d == 0.0 { 0 } else { ((a - m) / d).round().clamp(0.0, 15.0) as u8 }).collect();
        for j in 0..16 {
            b.push(q[j] | (q[j + 16] << 4));
        }
        for (j, &qj) in q.iter().enumerate() {
            v[bi * 32 + j] = qj as f32 * d + m;
        }
    }
    (b, v)
}

/// F16 encode.
pub fn f16s(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let b = x.iter().flat_map(|a| f16::from_f32(*a).to_le_bytes()).collect();
    (b, x.iter().map(|a| h(*a).1).collect())
}

/// F32 encode.
pub fn f32s(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    (x.iter().flat_map(|a| a.to_le_bytes()).collect(), x.to_vec())
}

/// GGUF name and encoder for each HF tensor name: embedding Q8_0, attention Q4_1, MLP Q4_0,
/// head F16, norms F32.
fn encode(hf: &str, data: &[f32]) -> (String, u32, (Vec<u8>, Vec<f32>)) {
    let g = boltccl_llm::loader::gguf::gguf_name(hf).unwrap();
    let (ty, enc) = if hf.contains("norm") {
        (0, f32s(data))
    } else if hf.contains("embed") {
        (8, q8_0(data))
    } else if hf.contains("self_attn") {
        (3, q4_1(data))
    } else if hf.contains("mlp") {
        (2, q4_0(data))
    } else {
        (1, f16s(data))
    };
    (g, ty, enc)
}

/// The metadata of a llama GGUF file for the model `s` describes.
pub fn llama_meta(s: &super::Spec) -> [(&'static str, Meta); 11] {
    [
        ("general.architecture", Meta::Str("llama".into())),
        ("general.alignment", Meta::U32(32)),
        ("llama.embedding_length", Meta::U32(s.hidden as u32)),
        ("llama.block_count", Meta::U32(s.layers as u32)),
        ("llama.feed_forward_length", Meta::U32(s.ffn as u32)),
        ("llama.attention.head_count", Meta::U32(s.heads as u32)),
        ("llama.attention.head_count_kv", Meta::U32(s.kv_heads as u32)),
        ("llama.rope.dimension_count", Meta::U32(s.head_dim as u32)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.context_length", Meta::U32(256)),
    ]
}

/// A llama GGUF file for `s`'s seeded weights (quantised per [`encode`]) and its dequantised
/// safetensors twin: (GGUF path, safetensors directory).
pub fn build_with(s: &super::Spec) -> (std::path::PathBuf, std::path::PathBuf) {
    use boltccl_llm::loader::safetensors::StoreDtype;
    use boltccl_llm::loader::Tensor;
    let mut raw = Vec::new();
    let mut dense = Vec::new();
    for (name, t) in super::tensors(s) {
        let (g, ty, (bytes, values)) = encode(&name, &t.data);
        raw.push(RawTensor { name: g, shape: t.shape.clone(), ty, bytes });
        dense.push((name, Tensor { shape: t.shape, data: values }));
    }
    let meta = llama_meta(s);
    let dir = super::temp_dir("gguf");
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, write(&meta, &raw)).unwrap();
    let st = super::write_checkpoint(s, &dense, StoreDtype::F32);
    (path, st)
}
