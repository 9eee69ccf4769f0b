//! Safetensors loader: f16 / bf16 files decode to the rounded values, and config.json drives
//! the config (defaults, Qwen flags).

mod common;

use boltccl_llm::loader::safetensors::StoreDtype;
use common::{open, tensors, write_checkpoint, Spec};
use half::{bf16, f16};

#[test]
fn half_precision_files_round_trip() {
    let s = Spec::odd();
    let ts = tensors(&s);
    for (dtype, round) in [
        (StoreDtype::F16, (|x: f32| f16::from_f32(x).to_f32()) as fn(f32) -> f32),
        (StoreDtype::BF16, |x: f32| bf16::from_f32(x).to_f32()),
        (StoreDtype::F32, |x: f32| x),
    ] {
        let dir = write_checkpoint(&s, &ts, dtype);
        let src = open(&dir);
        for (name, t) in &ts {
            let got = src.tensor(name).unwrap();
            assert_eq!(got.shape, t.shape, "{name}");
            let want: Vec<f32> = t.data.iter().map(|&x| round(x)).collect();
            assert_eq!(got.data, want, "{dtype:?} {name}");
        }
        // The loader reads config.json: Spec::odd is untied and llama (no bias, no q/k norm).
        let c = src.config();
        assert!(!c.tie_embeddings && !c.qkv_bias && !c.qk_norm);
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (9, 3, 8));
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn qwen_flags_and_missing_tensors() {
    let s = Spec { model_type: "qwen2", ..Spec::odd() };
    let mut ts = tensors(&s);
    let dir = write_checkpoint(&s, &ts, StoreDtype::F32);
    assert!(open(&dir).config().qkv_bias);
    let _ = std::fs::remove_dir_all(dir);
    // A checkpoint missing a weight must fail to load with the tensor's name in the error.
    ts.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight");
    let dir = write_checkpoint(&s, &ts, StoreDtype::F32);
    let src = open(&dir);
    let plan = boltccl_llm::shard::ShardPlan::new(src.config(), 0, 1).unwrap();
    let err = boltccl_llm::model::Model::load(src.as_ref(), plan).err().unwrap();
    assert!(format!("{err:#}").contains("up_proj"), "{err:#}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn unsupported_rope_scaling_is_refused() {
    let s = Spec::odd();
    let dir = write_checkpoint(&s, &tensors(&s), StoreDtype::F32);
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let err = boltccl_llm::loader::open(&dir).err().expect("rope_scaling accepted");
    assert!(format!("{err:#}").contains("rope_scaling"), "{err:#}");
    let _ = std::fs::remove_dir_all(dir);
}
