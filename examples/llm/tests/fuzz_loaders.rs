//! Fuzzing the model loaders with the mutators of `boltccl/tests/fuzz.rs`: a small valid GGUF
//! file (every tensor type the loader decodes: F32, F16, Q8_0, Q4_0, Q4_1) and a valid
//! safetensors checkpoint (its `config.json` too), mutated — bits, extreme integers (counts,
//! dimensions, offsets, types, string lengths), inserted, removed, repeated and truncated
//! bytes; mutations aimed at the header half the time — and raw bytes. Each case writes the
//! file, opens it, and when it opens, reads every tensor whole, by rows and (GGUF) quantised.
//!
//! Never a panic, and never an allocation out of proportion to the file (bounded by a
//! counting allocator: what the file's tensors decode to is at most 8 f32 bytes per file byte).
//! `BOLTCCL_FUZZ_CASES` cases per target (CI: 2,000; `scripts/fuzz.sh`: 100,000).

mod common;

#[path = "../../../boltccl/tests/common/fuzz.rs"]
mod fuzzing;

use boltccl_llm::config::RopeStyle;
use boltccl_llm::loader::gguf::GgufModel;
use boltccl_llm::loader::safetensors::{write_safetensors, SafetensorsModel, StoreDtype};
use boltccl_llm::loader::{self, WeightSource};
use common::gguf_writer::{self as gw, Meta, RawTensor};
use common::{temp_dir, tensors, write_config, Spec};
use fuzzing::*;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use std::path::Path;

#[global_allocator]
static ALLOC: Counting = Counting;

fn spec() -> Spec {
    Spec {
        vocab: 8,
        hidden: 32,
        ffn: 32,
        layers: 1,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        tie: false,
        model_type: "llama",
        rope: RopeStyle::Interleaved,
        seed: 3,
    }
}

/// The tensors' Hugging Face names.
fn names() -> Vec<String> {
    tensors(&spec()).into_iter().map(|(n, _)| n).collect()
}

/// A valid GGUF file of [`spec`]; and where its tensor data starts (the header before it).
fn valid_gguf() -> (Vec<u8>, usize) {
    let s = spec();
    let mut raw = Vec::new();
    for (i, (name, t)) in tensors(&s).into_iter().enumerate() {
        let g = loader::gguf::gguf_name(&name).unwrap();
        let (ty, (bytes, _)) = match i % 5 {
            _ if name.contains("norm") => (0, gw::f32s(&t.data)),
            0 => (8, gw::q8_0(&t.data)),
            1 => (3, gw::q4_1(&t.data)),
            2 => (2, gw::q4_0(&t.data)),
            3 => (1, gw::f16s(&t.data)),
            _ => (0, gw::f32s(&t.data)),
        };
        raw.push(RawTensor { name: g, shape: t.shape.clone(), ty, bytes });
    }
    let meta = gw::llama_meta(&s);
    let bytes = gw::write(&meta, &raw);
    let data: usize = raw.iter().map(|t| t.bytes.len().div_ceil(32) * 32).sum();
    let header = bytes.len() - data;
    (bytes, header)
}

/// Mutations anywhere, or (half the time) only in the first `header` bytes.
fn mutated_in(base: Vec<u8>, header: usize) -> impl Strategy<Value = Vec<u8>> {
    (proptest::collection::vec(mutation(), 1..8), any::<bool>()).prop_map(move |(mut m, aim)| {
        if aim {
            for x in &mut m {
                let p = match x {
                    Mutation::Flip(p, _)
                    | Mutation::Set(p, _)
                    | Mutation::Insert(p, _)
                    | Mutation::Remove(p, _)
                    | Mutation::Repeat(p, _)
                    | Mutation::Truncate(p)
                    | Mutation::Integer(p, _, _) => p,
                };
                *p %= header.max(1);
            }
        }
        mutate(&base, &m)
    })
}

/// Everything the rest of the program reads from a loaded model.
fn read_all(m: &dyn WeightSource) {
    let _ = m.config();
    for name in names() {
        if !m.contains(&name) {
            continue;
        }
        if let Ok(t) = m.tensor(&name) {
            let rows = t.shape.first().copied().unwrap_or(0);
            let _ = m.tensor_rows(&name, 0..rows);
            let _ = m.tensor_rows(&name, rows / 2..rows);
            let _ = m.tensor_rows(&name, rows..rows + 1);
            let _ = m.quant_rows(&name, 0..rows.min(2));
        }
        let _ = m.tensor_rows(&name, 0..usize::MAX);
        let _ = m.quant_rows(&name, 1..usize::MAX);
    }
}

fn run<S: Strategy>(name: &str, s: S, body: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let n = std::cell::Cell::new(0u64);
    let r = TestRunner::new(config()).run(&s, |v| {
        n.set(n.get() + 1);
        body(v)
    });
    println!("fuzz {name}: {} cases", n.get());
    if let Err(e) = r {
        panic!("fuzz {name}: {e}");
    }
}

fn gguf_case(dir: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    let path = dir.join("fuzz.gguf");
    std::fs::write(&path, bytes).unwrap();
    let ((), peak) = peak_of(|| {
        if let Ok(m) = GgufModel::open(&path) {
            read_all(&m);
            let _ = m.tokenizer();
            let _ = m.chat_template();
        }
    });
    prop_assert!(peak <= 8 * bytes.len() + (1 << 20), "{} bytes at once for a {}-byte file", peak, bytes.len());
    Ok(())
}

#[test]
fn gguf_loader() {
    let dir = temp_dir("fuzz-gguf");
    let (valid, header) = valid_gguf();
    gguf_case(&dir, &valid).unwrap();
    assert!(GgufModel::open(&dir.join("fuzz.gguf")).is_ok(), "the valid file must open");
    run("gguf/mutated", mutated_in(valid.clone(), header), |b| gguf_case(&dir, &b));
    // Raw bytes behind a valid magic and version (raw bytes alone stop at the magic).
    run("gguf/raw", proptest::collection::vec(any::<u8>(), 0..400), |b| {
        let mut v = valid[..8].to_vec();
        v.extend(b);
        gguf_case(&dir, &v)
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// Metadata arrays nested 200,000 deep (12 bytes a level): an error, not a stack overflow.
#[test]
fn deeply_nested_metadata_arrays_are_an_error() {
    let dir = temp_dir("fuzz-gguf-nested");
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata entries
    b.extend(1u64.to_le_bytes());
    b.push(b'k');
    b.extend(9u32.to_le_bytes()); // an array ...
    for _ in 0..200_000 {
        b.extend(9u32.to_le_bytes()); // ... of arrays ...
        b.extend(1u64.to_le_bytes()); // ... of one element
    }
    b.extend(0u32.to_le_bytes());
    let path = dir.join("nested.gguf");
    std::fs::write(&path, &b).unwrap();
    let e = GgufModel::open(&path).err().expect("refused");
    assert!(format!("{e:#}").contains("nested"), "{e:#}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A tensor whose offset is u64::MAX (data_start + offset overflows): an error.
#[test]
fn tensor_offset_beyond_the_address_space_is_an_error() {
    let dir = temp_dir("fuzz-gguf-offset");
    let (mut b, _) = valid_gguf();
    // After the first tensor's name: dims count (u32), its dims (u64 each), type (u32), offset.
    let name = b"token_embd.weight";
    let at = b.windows(name.len()).position(|w| w == name).expect("the name") + name.len();
    let nd = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let off = at + 4 + 8 * nd + 4;
    b[off..off + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let path = dir.join("offset.gguf");
    std::fs::write(&path, &b).unwrap();
    let e = GgufModel::open(&path).err().expect("refused");
    assert!(format!("{e:#}").contains("past end"), "{e:#}");
    let _ = std::fs::remove_dir_all(dir);
}

/// An embedding table with no dimensions (a scalar): an error, not an index out of bounds.
#[test]
fn embedding_without_dimensions_is_an_error() {
    let dir = temp_dir("fuzz-gguf-embd");
    let s = spec();
    let mut raw: Vec<RawTensor> = tensors(&s)
        .into_iter()
        .map(|(name, t)| RawTensor {
            name: loader::gguf::gguf_name(&name).unwrap(),
            shape: t.shape.clone(),
            ty: 0,
            bytes: gw::f32s(&t.data).0,
        })
        .collect();
    let e = raw.iter_mut().find(|t| t.name == "token_embd.weight").unwrap();
    (e.shape, e.bytes) = (vec![], 1.0f32.to_le_bytes().to_vec());
    let meta = [
        ("general.architecture", Meta::Str("llama".into())),
        ("llama.embedding_length", Meta::U32(s.hidden as u32)),
        ("llama.block_count", Meta::U32(s.layers as u32)),
        ("llama.feed_forward_length", Meta::U32(s.ffn as u32)),
        ("llama.attention.head_count", Meta::U32(s.heads as u32)),
    ];
    let path = dir.join("scalar.gguf");
    std::fs::write(&path, gw::write(&meta, &raw)).unwrap();
    let e = GgufModel::open(&path).err().expect("refused");
    assert!(format!("{e:#}").contains("token_embd.weight"), "{e:#}");
    let _ = std::fs::remove_dir_all(dir);
}

fn safetensors_case(dir: &Path, file: &[u8], config: Option<&[u8]>) -> Result<(), TestCaseError> {
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
    if let Some(c) = config {
        std::fs::write(dir.join("config.json"), c).unwrap();
    }
    let size = file.len() + config.map_or(0, <[u8]>::len);
    let ((), peak) = peak_of(|| {
        if let Ok(m) = SafetensorsModel::open(dir) {
            read_all(&m);
        }
    });
    prop_assert!(peak <= 8 * size + (1 << 20), "{} bytes at once for {} bytes of files", peak, size);
    Ok(())
}

#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn safetensors_loader() {
    let dir = temp_dir("fuzz-safetensors");
    let s = spec();
    write_config(&dir, &s);
    let config = std::fs::read(dir.join("config.json")).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &tensors(&s), StoreDtype::F16).unwrap();
    let valid = std::fs::read(dir.join("model.safetensors")).unwrap();
    assert!(SafetensorsModel::open(&dir).is_ok(), "the valid checkpoint must open");
    let header = 8 + u64::from_le_bytes(valid[..8].try_into().unwrap()) as usize;
    run("safetensors/mutated", mutated_in(valid.clone(), header), |b| safetensors_case(&dir, &b, None));
    run("safetensors/raw", proptest::collection::vec(any::<u8>(), 0..400), |b| safetensors_case(&dir, &b, None));
    let cfg: serde_json::Value = serde_json::from_slice(&config).unwrap();
    run("safetensors/config-json", json_mutated(cfg), |c| safetensors_case(&dir, &valid, Some(&c)));
    run("safetensors/config-mutated", mutated(config.clone()), |c| safetensors_case(&dir, &valid, Some(&c)));
    let _ = std::fs::remove_dir_all(dir);
}
