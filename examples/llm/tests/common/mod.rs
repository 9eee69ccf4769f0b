//! Test helpers: seeded synthetic checkpoints written through the real safetensors writer, a
//! multi-rank runner on in-process thread ranks, and an independent naive reference forward.
#![allow(dead_code)]

pub mod gguf_writer;
pub mod reference;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use boltccl_llm::config::RopeStyle;
use boltccl_llm::generate::{generate, GenOptions, GenOutput};
use boltccl_llm::loader::safetensors::{write_safetensors, StoreDtype};
use boltccl_llm::loader::{self, Tensor, WeightSource};
use boltccl_llm::model::{LoadOptions, Model};
use boltccl_llm::sample::{Rng, Sampler};
use boltccl_llm::shard::{MoeSplit, ShardPlan};

/// Shape and options of a synthetic model.
#[derive(Debug, Clone)]
pub struct Spec {
    pub vocab: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub tie: bool,
    /// "llama", "qwen2" (q/k/v bias) or "qwen3" (q/k norm).
    pub model_type: &'static str,
    pub rope: RopeStyle,
    pub seed: u64,
}

impl Spec {
    /// Heads divide by 2 and 4: hidden 64, 8 heads / 4 KV heads, FFN 176.
    pub fn even() -> Self {
        Spec {
            vocab: 96,
            hidden: 64,
            ffn: 176,
            layers: 3,
            heads: 8,
            kv_heads: 4,
            head_dim: 8,
            tie: true,
            model_type: "llama",
            rope: RopeStyle::NeoX,
            seed: 9,
        }
    }
    /// SmolLM2-like odd split: 9 heads / 3 KV heads, FFN 96 (TP=2 and 4 are uneven).
    pub fn odd() -> Self {
        Spec {
            vocab: 80,
            hidden: 72,
            ffn: 96,
            layers: 2,
            heads: 9,
            kv_heads: 3,
            head_dim: 8,
            tie: false,
            model_type: "llama",
            rope: RopeStyle::Interleaved,
            seed: 2,
        }
    }
}

pub fn randn(rng: &mut Rng, n: usize, std: f32) -> Vec<f32> {
    // Sum of uniforms: cheap, roughly Gaussian, deterministic.
    (0..n).map(|_| ((0..4).map(|_| rng.next_f32()).sum::<f32>() - 2.0) * std * 1.7).collect()
}

fn t(shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor { shape: shape.to_vec(), data }
}

/// Seeded tensors with Hugging Face names.
pub fn tensors(s: &Spec) -> Vec<(String, Tensor)> {
    let mut rng = Rng::new(s.seed);
    let (h, hd) = (s.hidden, s.head_dim);
    let w = |rng: &mut Rng, r: usize, c: usize| t(&[r, c], randn(rng, r * c, 1.0 / (c as f32).sqrt()));
    let norm = |rng: &mut Rng, n: usize| t(&[n], randn(rng, n, 0.1).into_iter().map(|x| 1.0 + x).collect());
    let mut v = vec![
        ("model.embed_tokens.weight".to_string(), t(&[s.vocab, h], randn(&mut rng, s.vocab * h, 0.25))),
        ("model.norm.weight".to_string(), norm(&mut rng, h)),
    ];
    if !s.tie {
        v.push(("lm_head.weight".into(), w(&mut rng, s.vocab, h)));
    }
    for i in 0..s.layers {
        let p = |x: &str| format!("model.layers.{i}.{x}");
        v.push((p("input_layernorm.weight"), norm(&mut rng, h)));
        v.push((p("post_attention_layernorm.weight"), norm(&mut rng, h)));
        v.push((p("self_attn.q_proj.weight"), w(&mut rng, s.heads * hd, h)));
        v.push((p("self_attn.k_proj.weight"), w(&mut rng, s.kv_heads * hd, h)));
        v.push((p("self_attn.v_proj.weight"), w(&mut rng, s.kv_heads * hd, h)));
        v.push((p("self_attn.o_proj.weight"), w(&mut rng, h, s.heads * hd)));
        v.push((p("mlp.gate_proj.weight"), w(&mut rng, s.ffn, h)));
        v.push((p("mlp.up_proj.weight"), w(&mut rng, s.ffn, h)));
        v.push((p("mlp.down_proj.weight"), w(&mut rng, h, s.ffn)));
        if s.model_type == "qwen2" {
            v.push((p("self_attn.q_proj.bias"), t(&[s.heads * hd], randn(&mut rng, s.heads * hd, 0.5))));
            v.push((p("self_attn.k_proj.bias"), t(&[s.kv_heads * hd], randn(&mut rng, s.kv_heads * hd, 0.5))));
            v.push((p("self_attn.v_proj.bias"), t(&[s.kv_heads * hd], randn(&mut rng, s.kv_heads * hd, 0.5))));
        }
        if s.model_type == "qwen3" {
            v.push((p("self_attn.q_norm.weight"), norm(&mut rng, hd)));
            v.push((p("self_attn.k_norm.weight"), norm(&mut rng, hd)));
        }
    }
    v
}

/// A fresh, empty directory under the system temp dir (unique per process and call). A test
/// process has no teardown to remove its directories, so the first call of each process removes
/// those of test processes that are gone (Linux: a pid without `/proc/PID`); at most the
/// latest runs' files stay.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(remove_dead_processes_dirs);
    let d = std::env::temp_dir().join(format!(
        "boltccl-llm-test-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Removes the `temp_dir`s of test processes that no longer run.
fn remove_dead_processes_dirs() {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("boltccl-llm-test-").and_then(|r| r.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Writes `config.json` + `model.safetensors` for `s` into a new temp dir.
pub fn write_checkpoint(s: &Spec, tensors: &[(String, Tensor)], dtype: StoreDtype) -> PathBuf {
    let dir = temp_dir(s.model_type);
    write_config(&dir, s);
    write_safetensors(&dir.join("model.safetensors"), tensors, dtype).unwrap();
    dir
}

pub fn write_config(dir: &Path, s: &Spec) {
    let rope = match s.rope {
        RopeStyle::NeoX => "neox",
        RopeStyle::Interleaved => "interleaved",
    };
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": s.model_type,
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.ffn,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": s.tie,
        "rope_style": rope,
    });
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
}

/// Runs `rank` on each of `tp` in-process ranks (threads over `boltccl::Group::local_world`);
/// their results in rank order. A rank that panics fails the caller.
pub fn on_ranks<T: Send>(tp: usize, rank: impl Fn(boltccl::Group) -> T + Sync) -> Vec<T> {
    let rank = &rank;
    std::thread::scope(|s| {
        let hs: Vec<_> = boltccl::Group::local_world(tp).into_iter().map(|c| s.spawn(move || rank(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs greedy generation on `tp` in-process ranks; returns rank 0's output (tokens + logits)
/// and checks every rank produced the same tokens, and the same again when no logits are
/// recorded (the ranks then choose each token together, without gathering the logits).
pub fn run_tp(src: &dyn WeightSource, tp: usize, prompt: &[u32], n: usize) -> GenOutput {
    run_tp_with(src, tp, prompt, n, LoadOptions::default())
}

/// [`run_tp`] with explicit weight storage options.
pub fn run_tp_with(src: &dyn WeightSource, tp: usize, prompt: &[u32], n: usize, opts: LoadOptions) -> GenOutput {
    run_tp_split(src, tp, prompt, n, opts, MoeSplit::default())
}

/// [`run_tp_with`], splitting a mixture-of-experts model's experts as `split` says.
pub fn run_tp_split(
    src: &dyn WeightSource,
    tp: usize,
    prompt: &[u32],
    n: usize,
    opts: LoadOptions,
    split: MoeSplit,
) -> GenOutput {
    let outs = on_ranks(tp, |c| {
        let plan = ShardPlan::with_moe(src.config(), c.rank(), c.size(), split).unwrap();
        let model = Model::load_with(src, plan, opts).unwrap();
        let opts = GenOptions { max_tokens: n, stop_tokens: Vec::new(), record_logits: true, check_sync: true };
        let out = generate(&model, &c, prompt, &mut Sampler::greedy(), &opts, |_| {}).unwrap();
        let opts = GenOptions { record_logits: false, ..opts };
        let chosen = generate(&model, &c, prompt, &mut Sampler::greedy(), &opts, |_| {}).unwrap();
        assert_eq!(chosen.tokens, out.tokens, "rank {}: tokens chosen together differ", c.rank());
        out
    });
    for o in &outs[1..] {
        assert_eq!(o.tokens, outs[0].tokens, "ranks disagree on tokens");
    }
    outs.into_iter().next().unwrap()
}

/// The bits of each value (for exact comparisons that also tell -0 from +0).
pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// [`Model::logits`] split over `tp` ranks must give rank 0 exactly the bits of the whole head
/// computed on one rank, for a few random final hidden states, and `None` on the other ranks.
/// `prepare` runs on every loaded model first (e.g. a GPU upload).
pub fn check_split_head_bits(
    src: &dyn WeightSource,
    tps: &[usize],
    opts: LoadOptions,
    prepare: &(dyn Fn(&mut Model) + Sync),
) {
    let cfg = src.config();
    let mut rng = Rng::new(21);
    let hiddens: Vec<Vec<f32>> = (0..3).map(|_| randn(&mut rng, cfg.hidden_size, 1.0)).collect();
    let mut one = Model::load_with(src, ShardPlan::new(cfg, 0, 1).unwrap(), opts).unwrap();
    prepare(&mut one);
    let comm = boltccl_llm::comm::SingleRank;
    let want: Vec<Vec<u32>> = hiddens.iter().map(|x| bits(&one.logits(x, &comm).unwrap().unwrap())).collect();
    assert!(want.iter().all(|w| w.len() == cfg.vocab_size));
    assert_ne!(want[0], want[1], "degenerate fixture: logits do not depend on the hidden state");
    for &tp in tps {
        let outs: Vec<Vec<Option<Vec<f32>>>> = std::thread::scope(|s| {
            let hs: Vec<_> = boltccl::Group::local_world(tp)
                .into_iter()
                .map(|c| {
                    let hiddens = &hiddens;
                    s.spawn(move || {
                        let plan = ShardPlan::new(cfg, c.rank(), c.size()).unwrap();
                        let mut model = Model::load_with(src, plan, opts).unwrap();
                        prepare(&mut model);
                        hiddens.iter().map(|x| model.logits(x, &c).unwrap()).collect()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, w) in want.iter().enumerate() {
            let got = bits(outs[0][i].as_ref().expect("rank 0 gets the logits"));
            let n = got.iter().zip(w).filter(|(a, b)| a != b).count();
            assert!(got == *w, "TP={tp}, hidden state {i}: {n} of {} logits differ from one rank's head", w.len());
        }
        assert!(outs[1..].iter().flatten().all(Option::is_none), "TP={tp}: only rank 0 gets logits");
    }
}

/// Opens a checkpoint written by [`write_checkpoint`].
pub fn open(dir: &Path) -> Box<dyn WeightSource> {
    loader::open(dir).unwrap().weights
}

/// Largest absolute difference between two logit sequences.
pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0.0, f32::max)
}

/// Path of the SmolLM2 GGUF if present (fetching it with `fetch-model.sh` when allowed).
/// Prints a visible skip message and returns `None` otherwise.
pub fn smollm2_path() -> Option<PathBuf> {
    let name = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cache = root.join("../../target/models");
    let p = std::env::var_os("BOLTCCL_LLM_MODEL").map(PathBuf::from).unwrap_or_else(|| cache.join(name));
    if p.is_file() {
        return Some(p);
    }
    if std::env::var_os("BOLTCCL_LLM_FETCH").is_some() {
        let ok =
            std::process::Command::new(root.join("fetch-model.sh")).arg(&cache).status().is_ok_and(|s| s.success());
        if ok && p.is_file() {
            return Some(p);
        }
    }
    let why = format!(
        "{} not found (run examples/llm/fetch-model.sh, or set BOLTCCL_LLM_FETCH=1 \
         to let the test download it, or BOLTCCL_LLM_MODEL=path)",
        p.display()
    );
    prerequisite_missing(&why);
    None
}

/// SmolLM2-135M-Instruct requantised to Q4_K_M by llama.cpp (`make-q4km.sh`; Q5_0, Q4_K,
/// Q6_K and Q8_0 tensors), or `BOLTCCL_LLM_Q4KM`; with `BOLTCCL_LLM_FETCH` the test makes it.
/// Missing: skipped with a message, or a failure in CI.
pub fn smollm2_q4km_path() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cache = root.join("../../target/models");
    let p = std::env::var_os("BOLTCCL_LLM_Q4KM")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("SmolLM2-135M-Instruct.Q4_K_M.gguf"));
    if p.is_file() {
        return Some(p);
    }
    if std::env::var_os("BOLTCCL_LLM_FETCH").is_some() {
        let ok = std::process::Command::new(root.join("make-q4km.sh")).arg(&cache).status().is_ok_and(|s| s.success());
        if ok && p.is_file() {
            return Some(p);
        }
    }
    let why = format!(
        "{} not found (run examples/llm/make-q4km.sh, or set BOLTCCL_LLM_FETCH=1 to let the \
         test make it, or BOLTCCL_LLM_Q4KM=path)",
        p.display()
    );
    prerequisite_missing(&why);
    None
}

/// True when running in CI (`CI` set and not "false" or "0"), where a missing prerequisite
/// (the model file, a GPU driver) fails a test instead of skipping it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// A test cannot run here because `why`: outside CI it says so and the caller returns; in CI
/// it fails, so CI cannot go green without running it.
pub fn prerequisite_missing(why: &str) {
    assert!(!in_ci(), "{why}, and CI is set: in CI this test must run");
    eprintln!("SKIPPED: {why}");
}

/// A python that imports llama_cpp: `LLAMA_PY`, or target/llama-venv's.
pub fn llama_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let py =
        std::env::var_os("LLAMA_PY").map(PathBuf::from).unwrap_or_else(|| root.join("target/llama-venv/bin/python"));
    let ok =
        std::process::Command::new(&py).args(["-c", "import llama_cpp"]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    prerequisite_missing(&format!(
        "{} cannot import llama_cpp (run scripts/llama-venv.sh, or set LLAMA_PY)",
        py.display()
    ));
    None
}

/// The tokenizer keys of a GGUF file (SmolLM2's, for the synthetic files llama.cpp must load),
/// sorted by name.
pub fn tokenizer_meta(gguf: &Path) -> Vec<(String, boltccl_llm::loader::gguf::Value)> {
    let src = boltccl_llm::loader::gguf::GgufModel::open(gguf).unwrap();
    let mut t: Vec<_> =
        src.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")).map(|(k, v)| (k.clone(), v.clone())).collect();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

/// llama.cpp's run on `model` (`tools/llama_cpp_logits.py`, f32 KV cache): its `steps` greedy
/// tokens after `prompt` and the logits that chose the first `keep` of them.
pub fn llama_cpp_greedy(
    py: &Path,
    model: &Path,
    prompt: &[u32],
    steps: usize,
    keep: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let dump = model.with_extension("logits.f32");
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/llama_cpp_logits.py");
    let out = std::process::Command::new(py)
        .arg(&tool)
        .arg(model)
        .arg(ids.join(","))
        .args([steps.to_string(), keep.to_string()])
        .arg(&dump)
        .arg("f32-kv")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "llama.cpp failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let tokens = json["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let vocab = json["vocab"].as_u64().unwrap() as usize;
    let bytes = std::fs::read(&dump).unwrap();
    let values: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    (tokens, values.chunks(vocab).map(<[f32]>::to_vec).collect())
}

/// GPT-2's byte -> char table, written out independently of the crate's implementation.
pub fn gpt2_byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut n = 0;
    (0..256u32)
        .map(|b| {
            if printable.contains(&b) {
                char::from_u32(b).unwrap()
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap()
            }
        })
        .collect()
}

/// Our greedy run against llama.cpp's ([`llama_cpp_greedy`]): each of the `keep` logit rows
/// within `tolerance` (largest absolute difference, printed), then the same tokens.
pub fn assert_agrees_with_llama_cpp(
    label: &str,
    ours: &GenOutput,
    theirs: &[u32],
    rows: &[Vec<f32>],
    keep: usize,
    tolerance: f32,
) {
    eprintln!("{label}: boltccl-llm {:?}, llama.cpp {theirs:?}", ours.tokens);
    assert_eq!(rows.len(), keep);
    for (step, (a, b)) in ours.logits.iter().zip(rows).enumerate() {
        assert_eq!(a.len(), b.len(), "vocabulary sizes differ");
        let d = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        let top = b.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
        eprintln!("{label} position {step}: max |logit - llama.cpp's| = {d:.2e} (largest |logit| {top:.1})");
        assert!(d <= tolerance, "{label} position {step}: logits differ from llama.cpp's by up to {d}");
    }
    assert_eq!(ours.tokens, theirs, "{label}: the greedy tokens differ from llama.cpp's");
}
