//! Weight loading. Every format is exposed through [`WeightSource`] using the Hugging Face
//! tensor names (`model.layers.0.self_attn.q_proj.weight`, ...), dequantised to f32.

pub mod gguf;
pub mod safetensors;

use std::ops::Range;
use std::path::Path;

use anyhow::Context;

use crate::config::ModelConfig;
use crate::quant::QuantRows;
use crate::tokenizer::Tokenizer;

/// A dense row-major f32 tensor. For a linear layer `shape == [out_features, in_features]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Elements, row-major.
    pub data: Vec<f32>,
}

impl Tensor {
    /// Rows (outermost dimension); 1-D tensors are one row.
    pub fn rows(&self) -> usize {
        if self.shape.len() <= 1 {
            1
        } else {
            self.shape[0]
        }
    }
    /// Elements per row.
    pub fn cols(&self) -> usize {
        self.data.len() / self.rows().max(1)
    }
    /// Copies rows `r` of a 2-D tensor (column-parallel shard).
    pub fn slice_rows(&self, r: Range<usize>) -> Tensor {
        let c = self.cols();
        Tensor { shape: vec![r.len(), c], data: self.data[r.start * c..r.end * c].to_vec() }
    }
    /// Copies columns `r` of a 2-D tensor (row-parallel shard).
    pub fn slice_cols(&self, r: Range<usize>) -> Tensor {
        let c = self.cols();
        let mut data = Vec::with_capacity(self.rows() * r.len());
        for row in self.data.chunks_exact(c) {
            data.extend_from_slice(&row[r.clone()]);
        }
        Tensor { shape: vec![self.rows(), r.len()], data }
    }
}

/// Source of named f32 tensors plus the hyper-parameters that describe them.
pub trait WeightSource: Send + Sync {
    /// The model's hyper-parameters.
    fn config(&self) -> &ModelConfig;
    /// Whether a tensor with this (Hugging Face) name exists.
    fn contains(&self, name: &str) -> bool;
    /// The whole tensor, dequantised.
    fn tensor(&self, name: &str) -> anyhow::Result<Tensor>;
    /// Rows `r` of a 2-D tensor. Formats that store rows contiguously override this so a rank
    /// only decodes its own shard.
    fn tensor_rows(&self, name: &str, r: Range<usize>) -> anyhow::Result<Tensor> {
        let t = self.tensor(name)?;
        anyhow::ensure!(r.end <= t.rows(), "{name}: rows {r:?} out of {}", t.rows());
        Ok(t.slice_rows(r))
    }
    /// Rows `r` of a 2-D tensor in its block-quantised file encoding, when the file stores it
    /// that way (GGUF Q8_0 / Q4_0 / Q4_1). `None` means: use the f32 path.
    fn quant_rows(&self, _name: &str, _r: Range<usize>) -> anyhow::Result<Option<QuantRows>> {
        Ok(None)
    }
}

/// A loaded checkpoint: weights plus, when the format carries one, a tokenizer.
pub struct Checkpoint {
    /// Weights and config.
    pub weights: Box<dyn WeightSource>,
    /// Tokenizer from the file's metadata (GGUF), if any.
    pub tokenizer: Option<Tokenizer>,
    /// Chat template text from the metadata, if any.
    pub chat_template: Option<String>,
}

/// Opens a `.gguf` file, or a directory / `.safetensors` file with a `config.json` beside it.
pub fn open(path: &Path) -> anyhow::Result<Checkpoint> {
    let is_gguf = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if is_gguf {
        let g = gguf::GgufModel::open(path).with_context(|| format!("reading GGUF {}", path.display()))?;
        let tokenizer = g.tokenizer()?;
        let chat_template = g.chat_template();
        Ok(Checkpoint { weights: Box::new(g), tokenizer, chat_template })
    } else {
        let s = safetensors::SafetensorsModel::open(path)
            .with_context(|| format!("reading safetensors checkpoint {}", path.display()))?;
        Ok(Checkpoint { weights: Box::new(s), tokenizer: None, chat_template: None })
    }
}

/// Hugging Face tensor names for layer `i`.
pub mod names {
    /// Token embedding.
    pub const EMBED: &str = "model.embed_tokens.weight";
    /// Final RMSNorm.
    pub const FINAL_NORM: &str = "model.norm.weight";
    /// Output head (absent when tied).
    pub const LM_HEAD: &str = "lm_head.weight";

    /// Qwen3-MoE router (`[experts, hidden]`), as a layer suffix.
    pub const ROUTER: &str = "mlp.gate.weight";
    /// Qwen3-MoE experts' gate projections, stacked: `[experts, expert_ffn, hidden]`.
    pub const EXPERTS_GATE: &str = "mlp.experts.gate_proj.weight";
    /// The experts' up projections, stacked like [`EXPERTS_GATE`].
    pub const EXPERTS_UP: &str = "mlp.experts.up_proj.weight";
    /// The experts' down projections, stacked: `[experts, hidden, expert_ffn]`.
    pub const EXPERTS_DOWN: &str = "mlp.experts.down_proj.weight";

    /// `model.layers.{i}.{suffix}`.
    pub fn layer(i: usize, suffix: &str) -> String {
        format!("model.layers.{i}.{suffix}")
    }
}
