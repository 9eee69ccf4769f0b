//! Minimal GGUF v3 writer plus reference block encoders, for tests only. The encoders return the
//! values a correct decoder must produce (computed here with `half`, not with the crate).

use half::f16;

/// A metadata value to write.
#[derive(Clone)]
pub enum Meta {
    U32(u32),
    F32(f32),
    Str(String),
    /// A value read from another file, written with 32-bit integers and floats (the widths
    /// llama.cpp expects of the tokenizer keys).
    Value(boltccl_llm::loader::gguf::Value),
}

/// Writes `v` after its type id (`put_ty`: also the type, false inside an array, which states
/// its element type once).
fn put_value(o: &mut Vec<u8>, v: &boltccl_llm::loader::gguf::Value, put_ty: bool) {
    use boltccl_llm::loader::gguf::Value as V;
    let ty: u32 = match v {
        V::U64(_) => 4,
        V::I64(_) => 5,
        V::F64(_) => 6,
        V::Bool(_) => 7,
        V::Str(_) => 8,
        V::Array(_) => 9,
    };
    if put_ty {
        o.extend(ty.to_le_bytes());
    }
    match v {
        V::U64(x) => o.extend((*x as u32).to_le_bytes()),
        V::I64(x) => o.extend((*x as i32).to_le_bytes()),
        V::F64(x) => o.extend((*x as f32).to_le_bytes()),
        V::Bool(x) => o.push(u8::from(*x)),
        V::Str(x) => put_str(o, x),
        V::Array(a) => {
            let et: u32 = match a.first() {
                Some(V::U64(_)) => 4,
                Some(V::I64(_)) => 5,
                Some(V::F64(_)) => 6,
                Some(V::Bool(_)) => 7,
                Some(V::Array(_)) => 9,
                _ => 8,
            };
            o.extend(et.to_le_bytes());
            o.extend((a.len() as u64).to_le_bytes());
            for x in a {
                put_value(o, x, false);
            }
        }
    }
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
            Meta::Value(v) => put_value(&mut o, v, true),
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

/// Decoded values of `bytes` by the crate (for the 5/6-bit and K-quant encoders below, whose
/// decoding `tests/quant.rs` checks bit for bit against gguf-py's).
fn decoded(ty: u32, bytes: Vec<u8>, n: usize) -> (Vec<u8>, Vec<f32>) {
    let mut v = vec![0f32; n];
    boltccl_llm::quant::dequantize(boltccl_llm::quant::GgmlType::from_id(ty).unwrap(), &bytes, &mut v).unwrap();
    (bytes, v)
}

fn round_clamp(v: f32, lo: i32, hi: i32) -> i32 {
    if v.is_finite() {
        (v.round() as i32).clamp(lo, hi)
    } else {
        lo.max(0).min(hi)
    }
}

/// Q5_0 (`q5 - 16`) or Q5_1 (`q5` plus a minimum) encode.
pub fn q5(x: &[f32], with_min: bool) -> (Vec<u8>, Vec<f32>) {
    let mut b = Vec::new();
    for blk in x.chunks(32) {
        let (lo, hi) = blk.iter().fold((0f32, 0f32), |(l, h), &a| (l.min(a), h.max(a)));
        let q: Vec<i32> = if with_min {
            let (d16, d) = h((hi - lo) / 31.0);
            let (m16, m) = h(lo);
            b.extend(d16.to_le_bytes());
            b.extend(m16.to_le_bytes());
            blk.iter().map(|&a| round_clamp((a - m) / d, 0, 31)).collect()
        } else {
            let (d16, d) = h(lo.abs().max(hi) / 15.0);
            b.extend(d16.to_le_bytes());
            blk.iter().map(|&a| round_clamp(a / d, -16, 15) + 16).collect()
        };
        let qh: u32 = q.iter().enumerate().map(|(e, &v)| ((v as u32 >> 4) & 1) << e).sum();
        b.extend(qh.to_le_bytes());
        b.extend((0..16).map(|j| (q[j] & 15) as u8 | ((q[j + 16] & 15) as u8) << 4));
    }
    decoded(if with_min { 7 } else { 6 }, b, x.len())
}

/// Q4_K (`bits` 4) or Q5_K (`bits` 5) encode: per 32-element sub-block a 6-bit scale and minimum.
pub fn qk(x: &[f32], bits: u32) -> (Vec<u8>, Vec<f32>) {
    let nmax = (1 << bits) - 1;
    let mut b = Vec::new();
    for sb in x.chunks(256) {
        let subs: Vec<(f32, f32)> = sb
            .chunks(32)
            .map(|s| {
                let (lo, hi) = s.iter().fold((0f32, f32::MIN), |(l, h), &a| (l.min(a), h.max(a)));
                ((hi - lo) / nmax as f32, -lo)
            })
            .collect();
        let (d16, d) = h(subs.iter().fold(0f32, |m, s| m.max(s.0)) / 63.0);
        let (m16, dmin) = h(subs.iter().fold(0f32, |m, s| m.max(s.1)) / 63.0);
        let sc: Vec<u8> = subs.iter().map(|s| round_clamp(s.0 / d, 0, 63) as u8).collect();
        let mn: Vec<u8> = subs.iter().map(|s| round_clamp(s.1 / dmin, 0, 63) as u8).collect();
        let q: Vec<i32> = sb
            .iter()
            .enumerate()
            .map(|(e, &a)| {
                let t = e / 32;
                round_clamp((a + dmin * mn[t] as f32) / (d * sc[t] as f32), 0, nmax)
            })
            .collect();
        b.extend(d16.to_le_bytes());
        b.extend(m16.to_le_bytes());
        let mut s = [0u8; 12];
        for t in 0..4 {
            s[t] = sc[t] | (sc[t + 4] >> 4) << 6;
            s[t + 4] = mn[t] | (mn[t + 4] >> 4) << 6;
            s[t + 8] = (sc[t + 4] & 0x0F) | (mn[t + 4] & 0x0F) << 4;
        }
        b.extend(s);
        if bits == 5 {
            b.extend((0..32).map(|l| (0..8).map(|t| (((q[32 * t + l] >> 4) & 1) as u8) << t).sum::<u8>()));
        }
        for p in 0..4 {
            b.extend((0..32).map(|l| (q[64 * p + l] & 15) as u8 | ((q[64 * p + 32 + l] & 15) as u8) << 4));
        }
    }
    decoded(if bits == 4 { 12 } else { 13 }, b, x.len())
}

/// Q6_K encode: sixteen 16-element sub-blocks with i8 scales, quants `q6 - 32`.
pub fn q6_k(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut b = Vec::new();
    for sb in x.chunks(256) {
        let scales: Vec<f32> = sb.chunks(16).map(|s| s.iter().fold(0f32, |m, a| m.max(a.abs())) / 31.0).collect();
        let (d16, d) = h(scales.iter().fold(0f32, |m, &s| m.max(s)) / 127.0);
        let sc: Vec<i8> = scales.iter().map(|&s| round_clamp(s / d, -128, 127) as i8).collect();
        let q: Vec<i32> =
            sb.iter().enumerate().map(|(e, &a)| round_clamp(a / (d * sc[e / 16] as f32), -32, 31) + 32).collect();
        let (mut ql, mut qh) = (vec![0u8; 128], vec![0u8; 64]);
        for n in 0..2 {
            for l in 0..32 {
                let [q1, q2, q3, q4] = [0, 32, 64, 96].map(|o| q[128 * n + o + l] as u8);
                ql[64 * n + l] = (q1 & 15) | (q3 & 15) << 4;
                ql[64 * n + 32 + l] = (q2 & 15) | (q4 & 15) << 4;
                qh[32 * n + l] = (q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6;
            }
        }
        b.extend(ql);
        b.extend(qh);
        b.extend(sc.iter().map(|&v| v as u8));
        b.extend(d16.to_le_bytes());
    }
    decoded(14, b, x.len())
}

/// Encodes `data` as GGML type `ty` (any type the writer has an encoder for).
pub fn encode_as(ty: u32, data: &[f32]) -> (Vec<u8>, Vec<f32>) {
    match ty {
        0 => f32s(data),
        1 => f16s(data),
        2 => q4_0(data),
        3 => q4_1(data),
        6 => q5(data, false),
        7 => q5(data, true),
        8 => q8_0(data),
        12 => qk(data, 4),
        13 => qk(data, 5),
        14 => q6_k(data),
        _ => panic!("no encoder for type {ty}"),
    }
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

/// The metadata of a GGUF file of architecture `s.model_type` (llama, qwen2, qwen3): the
/// llama keys under that prefix, and for qwen3 the head width (not hidden / heads there).
pub fn arch_meta(s: &super::Spec) -> Vec<(String, Meta)> {
    let arch = s.model_type;
    let mut meta: Vec<(String, Meta)> = llama_meta(s)
        .into_iter()
        .map(|(k, v)| match k {
            "general.architecture" => (k.to_string(), Meta::Str(arch.into())),
            _ => (k.replacen("llama.", &format!("{arch}."), 1), v),
        })
        .collect();
    if arch == "qwen3" {
        meta.push(("qwen3.attention.key_length".into(), Meta::U32(s.head_dim as u32)));
    }
    meta
}

/// A GGUF file (architecture `s.model_type`) for `s`'s seeded weights (quantised per [`encode`]) and its dequantised
/// safetensors twin: (GGUF path, safetensors directory).
pub fn build_with(s: &super::Spec) -> (std::path::PathBuf, std::path::PathBuf) {
    build_typed(s, &|hf, data| encode(hf, data))
}

/// [`build_with`] with the GGML type of each tensor chosen by `types(hf name)`.
pub fn build_typed_by(s: &super::Spec, types: &dyn Fn(&str) -> u32) -> (std::path::PathBuf, std::path::PathBuf) {
    build_typed(s, &|hf, data| {
        let g = boltccl_llm::loader::gguf::gguf_name(hf).unwrap();
        let ty = if hf.contains("norm") { 0 } else { types(hf) };
        (g, ty, encode_as(ty, data))
    })
}

type Encoder<'a> = dyn Fn(&str, &[f32]) -> (String, u32, (Vec<u8>, Vec<f32>)) + 'a;

fn build_typed(s: &super::Spec, encode: &Encoder) -> (std::path::PathBuf, std::path::PathBuf) {
    use boltccl_llm::loader::safetensors::StoreDtype;
    use boltccl_llm::loader::Tensor;
    let mut raw = Vec::new();
    let mut dense = Vec::new();
    for (name, t) in super::tensors(s) {
        let (g, ty, (bytes, values)) = encode(&name, &t.data);
        raw.push(RawTensor { name: g, shape: t.shape.clone(), ty, bytes });
        dense.push((name, Tensor { shape: t.shape, data: values }));
    }
    let meta = arch_meta(s);
    let dir = super::temp_dir("gguf");
    let path = dir.join("tiny.gguf");
    let meta: Vec<(&str, Meta)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    std::fs::write(&path, write(&meta, &raw)).unwrap();
    let st = super::write_checkpoint(s, &dense, StoreDtype::F32);
    (path, st)
}

/// Writes `s`'s seeded weights, all f32, with `meta`, as the GGUF file `path`.
pub fn write_f32_model(s: &super::Spec, meta: &[(String, Meta)], path: &std::path::Path) {
    let raw: Vec<RawTensor> = super::tensors(s)
        .into_iter()
        .map(|(name, t)| RawTensor {
            name: boltccl_llm::loader::gguf::gguf_name(&name).unwrap(),
            shape: t.shape,
            ty: 0,
            bytes: f32s(&t.data).0,
        })
        .collect();
    let meta: Vec<(&str, Meta)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    std::fs::write(path, write(&meta, &raw)).unwrap();
}
