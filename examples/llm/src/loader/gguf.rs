//! GGUF (version 2/3) reader for the `llama`, `qwen2`, `qwen3` and `qwen3moe` architectures: metadata, tensor directory, and
//! tensor data in F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K
//! (see [`crate::quant`]).

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::Path;

use anyhow::{bail, ensure, Context};
use memmap2::Mmap;

use super::{names, Tensor, WeightSource};
use crate::config::{ModelConfig, MoeConfig, RopeStyle};
use crate::quant::{dequantize, GgmlType, QuantRows};
use crate::tokenizer::{PreTokenizer, Tokenizer};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// f32 or f64.
    F64(f64),
    /// bool.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Array of values.
    Array(Vec<Value>),
}

impl Value {
    /// Integer value, if this is a non-negative integer.
    pub fn as_usize(&self) -> Option<usize> {
        match *self {
            Value::U64(v) => usize::try_from(v).ok(),
            Value::I64(v) => usize::try_from(v).ok(),
            _ => None,
        }
    }
    /// Float value (integers convert).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F64(v) => Some(v),
            Value::U64(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => None,
        }
    }
    /// String value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    /// Array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Directory entry for one tensor.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Shape, outermost first (GGUF stores it innermost first; we reverse it).
    pub shape: Vec<usize>,
    /// Element encoding.
    pub ty: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: usize,
}

/// Deepest nesting of metadata arrays accepted.
const MAX_ARRAY_DEPTH: usize = 8;

/// Bounds-checked little-endian cursor over the file bytes.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
        let end = self.pos.checked_add(n).context("offset overflow")?;
        ensure!(end <= self.b.len(), "truncated GGUF file at byte {}", self.pos);
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> anyhow::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> anyhow::Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into()?))
    }
    fn u32(&mut self) -> anyhow::Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into()?))
    }
    fn u64(&mut self) -> anyhow::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into()?))
    }
    fn len(&mut self) -> anyhow::Result<usize> {
        let n = self.u64()?;
        // Every element takes at least one byte, so a count beyond the file size is corrupt;
        // checking here stops a hostile header from triggering a huge allocation.
        ensure!(n as usize <= self.b.len(), "implausible GGUF length {n}");
        Ok(n as usize)
    }
    fn string(&mut self) -> anyhow::Result<String> {
        let n = self.len()?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    fn value(&mut self, ty: u32) -> anyhow::Result<Value> {
        self.value_at(ty, 0)
    }
    fn value_at(&mut self, ty: u32, depth: usize) -> anyhow::Result<Value> {
        Ok(match ty {
            0 => Value::U64(self.u8()? as u64),
            1 => Value::I64(self.u8()? as i8 as i64),
            2 => Value::U64(self.u16()? as u64),
            3 => Value::I64(self.u16()? as i16 as i64),
            4 => Value::U64(self.u32()? as u64),
            5 => Value::I64(self.u32()? as i32 as i64),
            6 => Value::F64(f32::from_bits(self.u32()?) as f64),
            7 => Value::Bool(self.u8()? != 0),
            8 => Value::Str(self.string()?),
            9 => {
                // Arrays of arrays recurse: bound the depth, or a file of nested array headers
                // would overflow the stack.
                ensure!(depth < MAX_ARRAY_DEPTH, "GGUF arrays nested deeper than {MAX_ARRAY_DEPTH}");
                let et = self.u32()?;
                let n = self.len()?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value_at(et, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.u64()? as i64),
            12 => Value::F64(f64::from_bits(self.u64()?)),
            other => bail!("unknown GGUF metadata type {other}"),
        })
    }
}

/// A memory-mapped GGUF model.
pub struct GgufModel {
    map: Mmap,
    data_start: usize,
    /// All metadata key/values.
    pub metadata: HashMap<String, Value>,
    /// Tensor directory, by GGUF name (`blk.0.attn_q.weight`, ...).
    pub tensors: HashMap<String, TensorInfo>,
    config: ModelConfig,
}

/// Maps a Hugging Face tensor name to the llama.cpp GGUF name.
pub fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        names::EMBED => return Some("token_embd.weight".into()),
        names::FINAL_NORM => return Some("output_norm.weight".into()),
        names::LM_HEAD => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (idx, suffix) = rest.split_once('.')?;
    let mapped = match suffix {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        // Qwen3-MoE: the router, and the experts stacked in 3-D tensors ([expert][row][col]),
        // which the row accessors treat as `experts * rows` rows.
        names::ROUTER => "ffn_gate_inp.weight",
        names::EXPERTS_GATE => "ffn_gate_exps.weight",
        names::EXPERTS_UP => "ffn_up_exps.weight",
        names::EXPERTS_DOWN => "ffn_down_exps.weight",
        _ => return None,
    };
    Some(format!("blk.{idx}.{mapped}"))
}

impl GgufModel {
    /// Maps and parses the file.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = File::open(path)?;
        // SAFETY: read-only mapping; we assume the file is not truncated while mapped.
        let map = unsafe { Mmap::map(&file)? };
        let mut r = Reader { b: &map, pos: 0 };
        ensure!(r.take(4)? == b"GGUF", "not a GGUF file (bad magic)");
        let version = r.u32()?;
        ensure!(version == 2 || version == 3, "GGUF version {version} unsupported (need 2 or 3)");
        let n_tensors = r.len()?;
        let n_kv = r.len()?;
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let k = r.string()?;
            let ty = r.u32()?;
            let v = r.value(ty).with_context(|| format!("metadata key {k}"))?;
            metadata.insert(k, v);
        }
        let mut tensors = HashMap::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let nd = r.u32()? as usize;
            ensure!(nd <= 4, "tensor {name}: {nd} dimensions");
            let mut dims = Vec::with_capacity(nd);
            for _ in 0..nd {
                dims.push(r.u64()? as usize);
            }
            dims.reverse();
            let ty = GgmlType::from_id(r.u32()?).with_context(|| format!("tensor {name}"))?;
            let shape_ok = ty.block_elems() == 1 || dims.last().is_some_and(|&c| c % ty.block_elems() == 0);
            ensure!(
                shape_ok,
                "tensor {name}: rows of {} elements are not whole {}-element {} blocks",
                dims.last().copied().unwrap_or(0),
                ty.block_elems(),
                ty.name()
            );
            let offset = r.u64()? as usize;
            tensors.insert(name, TensorInfo { shape: dims, ty, offset });
        }
        let align = metadata.get("general.alignment").and_then(Value::as_usize).unwrap_or(32);
        ensure!(align > 0, "zero alignment");
        let data_start = r.pos.div_ceil(align) * align;
        // Validate every tensor's extent now, so later reads cannot go out of bounds. The
        // dimensions and offset come from the file: every product and sum is checked (no type
        // stores more than 2 elements a byte, so a larger count cannot fit in the file).
        for (name, t) in &tensors {
            let n = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            let n = n
                .filter(|&n| n / 2 <= map.len())
                .with_context(|| format!("tensor {name}: shape {:?} too large", t.shape))?;
            let bytes = t.ty.bytes_for(n).with_context(|| format!("tensor {name}"))?;
            let end = data_start.checked_add(t.offset).and_then(|s| s.checked_add(bytes));
            ensure!(end.is_some_and(|e| e <= map.len()), "tensor {name} extends past end of file");
        }
        // Llama 3's RoPE scaling: per-pair factors that divide the frequencies.
        let rope_freqs = match tensors.get(ROPE_FREQS) {
            Some(t) => {
                let n: usize = t.shape.iter().product();
                ensure!(t.shape.len() == 1, "{ROPE_FREQS} has shape {:?}, not one dimension", t.shape);
                let mut v = vec![0f32; n];
                dequantize(t.ty, &map[data_start + t.offset..], &mut v).context(ROPE_FREQS)?;
                Some(v)
            }
            None => None,
        };
        let config = config_from_metadata(&metadata, &tensors, rope_freqs)?;
        Ok(Self { map, data_start, metadata, tensors, config })
    }

    fn info(&self, hf_name: &str) -> anyhow::Result<(&TensorInfo, String)> {
        let g = gguf_name(hf_name).with_context(|| format!("no GGUF name for {hf_name}"))?;
        let t = self.tensors.get(&g).with_context(|| format!("tensor {g} ({hf_name}) not in GGUF"))?;
        Ok((t, g))
    }

    /// Builds the byte-level BPE tokenizer from `tokenizer.ggml.*` metadata, if present.
    pub fn tokenizer(&self) -> anyhow::Result<Option<Tokenizer>> {
        let Some(tokens) = self.metadata.get("tokenizer.ggml.tokens") else {
            return Ok(None);
        };
        let model = self.metadata.get("tokenizer.ggml.model").and_then(Value::as_str).unwrap_or("");
        ensure!(model == "gpt2", "tokenizer model {model:?} unsupported (only byte-level BPE 'gpt2')");
        let tokens: Vec<String> = tokens
            .as_array()
            .context("tokenizer.ggml.tokens is not an array")?
            .iter()
            .map(|v| v.as_str().unwrap_or("").to_string())
            .collect();
        let merges: Vec<String> = self
            .metadata
            .get("tokenizer.ggml.merges")
            .and_then(Value::as_array)
            .context("byte-level BPE needs tokenizer.ggml.merges")?
            .iter()
            .map(|v| v.as_str().unwrap_or("").to_string())
            .collect();
        let types: Vec<u32> = self
            .metadata
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_usize().unwrap_or(1) as u32).collect())
            .unwrap_or_default();
        let id = |k: &str| self.metadata.get(k).and_then(Value::as_usize).map(|v| v as u32);
        let tok = Tokenizer::from_parts(
            tokens,
            &merges,
            &types,
            id("tokenizer.ggml.bos_token_id"),
            id("tokenizer.ggml.eos_token_id"),
        )?;
        // How text is cut into words, as llama.cpp decides it: a file without the key gets
        // llama.cpp's fallback (with its warning); a value neither knows is an error.
        let pre = match self.metadata.get("tokenizer.ggml.pre") {
            None => {
                eprintln!(
                    "warning: the GGUF has no tokenizer.ggml.pre: text is split with llama.cpp's 'default' \
                     pre-tokenizer, which may not be the one the model was trained with"
                );
                PreTokenizer::Default
            }
            Some(v) => {
                let name = v.as_str().context("tokenizer.ggml.pre is not a string")?;
                PreTokenizer::from_name(name)?
            }
        };
        let mut tok = tok.with_pre_tokenizer(pre);
        // Follow the file when it says whether prompts start with BOS, else the pre-tokenizer's
        // default (on for Llama 3, off for the other byte-level BPE models).
        tok.add_bos = match self.metadata.get("tokenizer.ggml.add_bos_token") {
            Some(Value::Bool(b)) => *b,
            _ => pre.adds_bos_by_default(),
        };
        tok.eot = id("tokenizer.ggml.eot_token_id").filter(|&e| (e as usize) < tok.vocab_size());
        Ok(Some(tok))
    }

    /// The Jinja chat template string, if the file has one.
    pub fn chat_template(&self) -> Option<String> {
        self.metadata.get("tokenizer.chat_template").and_then(Value::as_str).map(str::to_string)
    }

    fn bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.map[self.data_start + t.offset..]
    }
}

/// The `general.architecture` values the loader runs.
pub const SUPPORTED_ARCHS: [&str; 4] = ["llama", "qwen2", "qwen3", "qwen3moe"];

/// llama.cpp's tensor of Llama 3 RoPE frequency factors.
const ROPE_FREQS: &str = "rope_freqs.weight";

fn config_from_metadata(
    md: &HashMap<String, Value>,
    tensors: &HashMap<String, TensorInfo>,
    rope_freqs: Option<Vec<f32>>,
) -> anyhow::Result<ModelConfig> {
    let arch = md.get("general.architecture").and_then(Value::as_str).context("missing general.architecture")?;
    // The families verified end-to-end against llama.cpp. Others change the RoPE convention,
    // add tensors or mix experts, so refuse rather than produce plausible-looking garbage.
    let rope_style = match arch {
        // llama.cpp's converter permutes Q/K rows so that adjacent-pair RoPE is correct.
        "llama" => RopeStyle::Interleaved,
        // Unpermuted Hugging Face rows: rotate-half (llama.cpp's NEOX rope type). Qwen2 adds
        // q/k/v biases, Qwen3 per-head q/k RMSNorms: both found by their tensors below.
        "qwen2" | "qwen3" | "qwen3moe" => RopeStyle::NeoX,
        // Mixture-of-experts families whose routing differs from Qwen3-MoE's (shared experts,
        // sigmoid gating, expert groups...): named, so the refusal says what is missing.
        "qwen2moe" | "qwen3next" | "qwen3vlmoe" | "mixtral" | "deepseek2" | "olmoe" | "granitemoe" | "llama4"
        | "gpt-oss" | "dbrx" | "grok" | "arctic" | "bailingmoe" | "dots1" | "ernie4_5-moe" | "hunyuan-moe" => bail!(
            "GGUF architecture {arch:?} (a mixture of experts) is not supported: of the MoE families only \
             qwen3moe is (supported: {})",
            SUPPORTED_ARCHS.join(", ")
        ),
        _ => bail!("GGUF architecture {arch:?} unsupported (supported: {})", SUPPORTED_ARCHS.join(", ")),
    };
    let get = |k: &str| md.get(&format!("{arch}.{k}"));
    let req = |k: &str| get(k).and_then(Value::as_usize).with_context(|| format!("missing/invalid {arch}.{k}"));
    // Linear scaling, as llama.cpp reads it: a factor (under either key name) divides every
    // frequency unless the type is "none" (then it is ignored). YaRN and LongRoPE are not
    // implemented.
    let scaling = get("rope.scaling.type").map(|v| v.as_str().context("rope.scaling.type is not a string"));
    let scaling = scaling.transpose()?.unwrap_or("linear");
    ensure!(
        matches!(scaling, "none" | "linear"),
        "RoPE scaling {scaling:?} is not supported by this example (only linear, and Llama 3's rope_freqs)"
    );
    let factor = get("rope.scaling.factor").or_else(|| get("rope.scale_linear")).and_then(Value::as_f64);
    let factor = factor.filter(|&f| f != 0.0 && scaling == "linear").unwrap_or(1.0) as f32;
    let hidden = req("embedding_length")?;
    let heads = req("attention.head_count")?;
    let kv_heads = get("attention.head_count_kv").and_then(Value::as_usize).unwrap_or(heads);
    let embd = tensors.get("token_embd.weight").context("missing token_embd.weight")?;
    ensure!(embd.shape.len() == 2, "token_embd.weight has {} dimensions, not 2", embd.shape.len());
    let vocab = get("vocab_size").and_then(Value::as_usize).unwrap_or(embd.shape[0]);
    let head_dim = get("attention.key_length")
        .and_then(Value::as_usize)
        .or_else(|| get("rope.dimension_count").and_then(Value::as_usize))
        .unwrap_or(hidden / heads.max(1));
    // The model rotates whole heads and reads keys and values of one width.
    for k in ["attention.value_length", "rope.dimension_count"] {
        if let Some(n) = get(k).and_then(Value::as_usize) {
            ensure!(n == head_dim, "{arch}.{k} = {n} differs from the head width {head_dim}: not supported");
        }
    }
    let moe = moe_config(arch, md, tensors)?;
    // An expert's width: llama.cpp's `expert_feed_forward_length` for Qwen3-MoE.
    let ffn = if moe.is_some() { req("expert_feed_forward_length")? } else { req("feed_forward_length")? };
    if let Some(m) = moe {
        // The loader reads one expert's rows at `expert * rows`: the stacks must be the shape
        // the metadata says.
        for (suffix, want) in
            [("gate", [m.experts, ffn, hidden]), ("up", [m.experts, ffn, hidden]), ("down", [m.experts, hidden, ffn])]
        {
            for (name, t) in tensors.iter().filter(|(n, _)| n.ends_with(&format!("ffn_{suffix}_exps.weight"))) {
                ensure!(t.shape == want, "{name}: shape {:?}, expected {want:?} (experts, rows, columns)", t.shape);
            }
        }
        let router = tensors.iter().filter(|(n, _)| n.ends_with("ffn_gate_inp.weight"));
        for (name, t) in router {
            ensure!(t.shape == [m.experts, hidden], "{name}: shape {:?}, expected [{}, {hidden}]", t.shape, m.experts);
        }
    }
    let cfg = ModelConfig {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: ffn,
        num_layers: req("block_count")?,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        rms_eps: get("attention.layer_norm_rms_epsilon").and_then(Value::as_f64).unwrap_or(1e-5) as f32,
        rope_theta: get("rope.freq_base").and_then(Value::as_f64).unwrap_or(10_000.0) as f32,
        rope_style,
        rope_freq_divisors: rope_freq_divisors(rope_freqs, head_dim, factor)?,
        max_seq_len: get("context_length").and_then(Value::as_usize).unwrap_or(2048),
        tie_embeddings: !tensors.contains_key("output.weight"),
        qkv_bias: tensors.contains_key("blk.0.attn_q.bias"),
        qk_norm: tensors.contains_key("blk.0.attn_q_norm.weight"),
        o_proj_block: shard_block(tensors, "attn_output.weight"),
        down_proj_block: shard_block(tensors, "ffn_down.weight").max(shard_block(tensors, "ffn_down_exps.weight")),
        moe,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// The experts of a `qwen3moe` file (`None` for the dense families). Refuses what llama.cpp's
/// Qwen3-MoE graph does not run either: shared experts, and a dense family with expert
/// tensors or an expert count (e.g. Mixtral, stored as `llama`).
fn moe_config(
    arch: &str,
    md: &HashMap<String, Value>,
    tensors: &HashMap<String, TensorInfo>,
) -> anyhow::Result<Option<MoeConfig>> {
    let get = |k: &str| md.get(&format!("{arch}.{k}")).and_then(Value::as_usize);
    let has_experts = tensors.keys().any(|n| n.contains("_exps.") || n.contains("ffn_gate_inp"));
    if arch != "qwen3moe" {
        ensure!(
            !has_experts && get("expert_count").unwrap_or(0) == 0,
            "GGUF architecture {arch:?} with experts (a mixture of experts, e.g. Mixtral) is not supported: \
             of the MoE families only qwen3moe is"
        );
        return Ok(None);
    }
    let experts = get("expert_count").context("missing/invalid qwen3moe.expert_count")?;
    let used = get("expert_used_count").context("missing/invalid qwen3moe.expert_used_count")?;
    ensure!(experts > 0, "qwen3moe.expert_count is 0");
    ensure!(
        get("expert_shared_count").unwrap_or(0) == 0 && !tensors.keys().any(|n| n.contains("shexp")),
        "qwen3moe with shared experts is not supported (Qwen3-MoE has none)"
    );
    for (name, t) in tensors.iter().filter(|(n, _)| n.contains("_exps.")) {
        ensure!(
            t.shape.len() == 3 && t.shape[0] == experts,
            "{name}: shape {:?} is not {experts} stacked experts",
            t.shape
        );
    }
    Ok(Some(MoeConfig { experts, used }))
}

/// What divides each RoPE frequency, as llama.cpp computes the angle: `pos * theta^(-2i/d)`
/// divided by `rope_freqs[i]` (when the file has them), times the linear `1 / factor`.
fn rope_freq_divisors(rope_freqs: Option<Vec<f32>>, head_dim: usize, factor: f32) -> anyhow::Result<Vec<f32>> {
    let Some(mut f) = rope_freqs else {
        return Ok(if factor == 1.0 { Vec::new() } else { vec![factor; head_dim / 2] });
    };
    ensure!(
        f.len() == head_dim / 2,
        "{ROPE_FREQS} has {} factors for head_dim {head_dim} (need {})",
        f.len(),
        head_dim / 2
    );
    f.iter_mut().for_each(|x| *x *= factor);
    Ok(f)
}

/// The largest quantisation block among every layer's `suffix` tensor (at least 32): where a
/// column shard of it may start and end and stay in its blocks.
fn shard_block(tensors: &HashMap<String, TensorInfo>, suffix: &str) -> usize {
    let blocks = tensors.iter().filter(|(n, _)| n.starts_with("blk.") && n.ends_with(suffix));
    blocks.map(|(_, t)| t.ty.block_elems()).fold(crate::quant::QK, usize::max)
}

/// A 2-D tensor as (rows, columns), or a 3-D stack of experts as `experts * rows` rows.
fn matrix_shape(t: &TensorInfo) -> Option<(usize, usize)> {
    match t.shape[..] {
        [r, c] => Some((r, c)),
        [e, r, c] => Some((e * r, c)),
        _ => None,
    }
}

impl WeightSource for GgufModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn contains(&self, name: &str) -> bool {
        gguf_name(name).is_some_and(|g| self.tensors.contains_key(&g))
    }
    fn tensor(&self, name: &str) -> anyhow::Result<Tensor> {
        let (t, g) = self.info(name)?;
        let n: usize = t.shape.iter().product();
        let mut data = vec![0f32; n];
        dequantize(t.ty, self.bytes(t), &mut data).with_context(|| format!("tensor {g}"))?;
        Ok(Tensor { shape: t.shape.clone(), data })
    }
    fn tensor_rows(&self, name: &str, r: Range<usize>) -> anyhow::Result<Tensor> {
        let (t, g) = self.info(name)?;
        let (nrows, cols) =
            matrix_shape(t).with_context(|| format!("{g}: row slice of a {}-D tensor", t.shape.len()))?;
        ensure!(r.end <= nrows, "{g}: rows {r:?} out of {nrows}");
        // Rows are stored contiguously and whole blocks never straddle rows.
        let row_bytes = t.ty.bytes_for(cols)?;
        let src = &self.bytes(t)[r.start * row_bytes..];
        let mut data = vec![0f32; r.len() * cols];
        dequantize(t.ty, src, &mut data).with_context(|| format!("tensor {g}"))?;
        Ok(Tensor { shape: vec![r.len(), cols], data })
    }
    fn quant_rows(&self, name: &str, r: Range<usize>) -> anyhow::Result<Option<QuantRows>> {
        let (t, g) = self.info(name)?;
        let Some((nrows, cols)) = matrix_shape(t).filter(|_| t.ty.is_block_quantized()) else {
            return Ok(None);
        };
        ensure!(r.end <= nrows, "{g}: rows {r:?} out of {nrows}");
        let row_bytes = t.ty.bytes_for(cols)?;
        // Only these rows' bytes are copied out of the mapping: a rank reads its own shard
        // (its experts, or its columns of each) and no more.
        let src = &self.bytes(t)[r.start * row_bytes..r.end * row_bytes];
        Ok(Some(QuantRows::new(t.ty, cols, src.to_vec())?))
    }
}
