//! Model hyper-parameters, independent of the file format they came from.

use serde::Deserialize;

/// How RoPE pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotate-half (GPT-NeoX, Hugging Face `transformers`): dimension `i` pairs with `i + d/2`.
    NeoX,
    /// Interleaved (GPT-J, llama.cpp `llama` GGUF, llama2.c): dimension `2i` pairs with `2i+1`.
    /// GGUF converters permute the Q/K rows inside each head so this equals NeoX on HF weights.
    Interleaved,
}

/// Architecture hyper-parameters of a Llama/Qwen-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention: `num_heads` is a multiple of it).
    pub num_kv_heads: usize,
    /// Per-head width (`hidden_size / num_heads` unless the config says otherwise, e.g. Qwen3).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RoPE pairing convention.
    pub rope_style: RopeStyle,
    /// Per-pair divisors of the RoPE frequencies (`head_dim / 2` of them), or empty for none:
    /// llama.cpp's `rope_freqs` factors (Llama 3 scaling) times its linear scaling factor.
    pub rope_freq_divisors: Vec<f32>,
    /// Maximum sequence length (bounds the KV cache).
    pub max_seq_len: usize,
    /// Output head shares the embedding matrix.
    pub tie_embeddings: bool,
    /// Qwen2-style bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Qwen3-style per-head RMSNorm on q and k (before RoPE).
    pub qk_norm: bool,
    /// Columns a tensor-parallel shard of o_proj must start and end on: the quantisation block
    /// of its file encoding, [`crate::quant::QK`] (32) for the legacy types and float weights,
    /// 256 for the K-quants' super-blocks. The plan splits query heads in units that keep it.
    pub o_proj_block: usize,
    /// The same for down_proj's columns (the MLP features).
    pub down_proj_block: usize,
    /// Mixture-of-experts MLP (Qwen3-MoE), or `None` for the dense SwiGLU MLP. With experts,
    /// [`Self::intermediate_size`] is one expert's width.
    pub moe: Option<MoeConfig>,
}

/// The routed-experts MLP of a Qwen3-MoE layer: a router picks `used` of `experts` SwiGLU
/// experts per token (softmax over all experts, the top `used` kept and their weights
/// renormalised to sum to one, as llama.cpp's `qwen3moe` graph does), and the layer's output
/// is the weighted sum of the chosen experts' outputs. No shared expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token is routed to (top-k).
    pub used: usize,
}

impl ModelConfig {
    /// Checks internal consistency; every loader calls it.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.num_heads > 0 && self.num_kv_heads > 0, "zero heads");
        anyhow::ensure!(
            self.num_heads.is_multiple_of(self.num_kv_heads),
            "num_heads ({}) must be a multiple of num_kv_heads ({})",
            self.num_heads,
            self.num_kv_heads
        );
        anyhow::ensure!(self.head_dim.is_multiple_of(2), "RoPE needs an even head_dim");
        anyhow::ensure!(
            self.rope_freq_divisors.is_empty() || self.rope_freq_divisors.len() == self.head_dim / 2,
            "{} RoPE frequency factors for head_dim {} (need head_dim / 2)",
            self.rope_freq_divisors.len(),
            self.head_dim
        );
        anyhow::ensure!(
            self.rope_freq_divisors.iter().all(|&f| f.is_finite() && f > 0.0),
            "RoPE frequency factors must be positive and finite"
        );
        anyhow::ensure!(self.hidden_size > 0 && self.intermediate_size > 0, "zero width");
        anyhow::ensure!(self.num_layers > 0 && self.vocab_size > 0, "empty model");
        if let Some(m) = self.moe {
            anyhow::ensure!(
                m.used >= 1 && m.used <= m.experts,
                "{} experts used per token out of {}: need 1 to the expert count",
                m.used,
                m.experts
            );
        }
        Ok(())
    }

    /// RoPE inverse frequencies: `theta^(-2i/d)`, divided by [`Self::rope_freq_divisors`].
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let mut f = crate::ops::rope_inv_freq(self.head_dim, self.rope_theta);
        for (f, d) in f.iter_mut().zip(&self.rope_freq_divisors) {
            *f /= d;
        }
        f
    }

    /// Query heads that share one KV head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}

/// The subset of a Hugging Face `config.json` we read (Llama, Qwen2, Qwen3, SmolLM, ...).
#[derive(Debug, Deserialize)]
pub struct HfConfig {
    /// `LlamaForCausalLM`, `Qwen2ForCausalLM`, ...
    #[serde(default)]
    pub architectures: Vec<String>,
    /// `llama`, `qwen2`, `qwen3`, ...
    #[serde(default)]
    pub model_type: String,
    /// See [`ModelConfig::vocab_size`].
    pub vocab_size: usize,
    /// See [`ModelConfig::hidden_size`].
    pub hidden_size: usize,
    /// See [`ModelConfig::intermediate_size`].
    pub intermediate_size: usize,
    /// See [`ModelConfig::num_layers`].
    pub num_hidden_layers: usize,
    /// See [`ModelConfig::num_heads`].
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (plain multi-head attention).
    pub num_key_value_heads: Option<usize>,
    /// Defaults to `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// Defaults to 1e-6.
    pub rms_norm_eps: Option<f32>,
    /// Defaults to 10000.
    pub rope_theta: Option<f32>,
    /// Defaults to 2048.
    pub max_position_embeddings: Option<usize>,
    /// Defaults to false.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama's `attention_bias` flag (Qwen2 has bias without this flag).
    #[serde(default)]
    pub attention_bias: bool,
    /// Non-standard extension used by our own test fixtures: `"neox"` or `"interleaved"`.
    pub rope_style: Option<String>,
    /// RoPE scaling (Llama 3, YaRN, ...): not implemented, so its presence is an error rather
    /// than silently wrong long-context output.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
}

impl HfConfig {
    /// Converts to a [`ModelConfig`], applying the per-family defaults.
    pub fn to_model_config(&self) -> anyhow::Result<ModelConfig> {
        if let Some(v) = self.rope_scaling.as_ref().filter(|v| !v.is_null()) {
            anyhow::bail!("rope_scaling {v} is not supported by this example");
        }
        let family = self.model_type.to_ascii_lowercase();
        let heads = self.num_attention_heads;
        let rope_style = match self.rope_style.as_deref() {
            None | Some("neox") => RopeStyle::NeoX,
            Some("interleaved") => RopeStyle::Interleaved,
            Some(s) => anyhow::bail!("unknown rope_style {s:?}"),
        };
        let cfg = ModelConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(heads),
            head_dim: self.head_dim.unwrap_or(self.hidden_size / heads.max(1)),
            rms_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: self.rope_theta.unwrap_or(10_000.0),
            rope_style,
            rope_freq_divisors: Vec::new(),
            max_seq_len: self.max_position_embeddings.unwrap_or(2048),
            tie_embeddings: self.tie_word_embeddings,
            qkv_bias: self.attention_bias || family == "qwen2",
            qk_norm: family == "qwen3",
            o_proj_block: crate::quant::QK,
            down_proj_block: crate::quant::QK,
            moe: None,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}
