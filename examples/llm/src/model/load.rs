//! Loading one rank's shard, and how its weights are held.

use std::ops::Range;

use anyhow::{ensure, Context};

use super::moe::{Expert, MoeLayer};
use super::{Layer, Model};
use crate::loader::{names, WeightSource};
use crate::ops::Mat;
use crate::quant::{Packer, QuantRows, QK};
use crate::shard::{exact_head_unit, MoeSplit, ShardPlan};

/// How block-quantised GGUF weights (Q8_0, Q4_0, Q4_1) are held and multiplied on the CPU.
/// Float checkpoints (safetensors, F16/F32 GGUF tensors) are f32 in every mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WeightMode {
    /// Kept in their blocks; each product quantises its input vector to Q8 blocks once and
    /// takes integer dot products (llama.cpp's arithmetic, [`crate::quant::dot`]). Fastest and
    /// smallest, but rounds the activations to 8 bits, so logits differ slightly from the f32
    /// modes (and the greedy text can too).
    #[default]
    Q8,
    /// Kept in their blocks, decoded block by block against f32 activations: the f32
    /// arithmetic (to rounding), in a quarter of the memory. What the GPU backend computes.
    Quant,
    /// Expanded to f32 at load (4-7x the memory and memory traffic of the blocks).
    F32,
}

/// down_proj's step-6 unit (features): four quantisation blocks, enough to make the per-unit
/// rounding cheap, few enough that SmolLM2's 1536 features (12 units) split evenly at TP = 2,
/// 3 and 4. A K-quant's unit is its 256-feature super-block ([`down_unit`]).
const DOWN_UNIT: usize = 128;

/// The step-6 unit of down products for `cfg`: whole units of [`DOWN_UNIT`] and of down's
/// quantisation block (every shard is made of both). The larger the unit, the fewer roundings
/// a row takes (a K-quant's super-block: half as many as 128 features, 7% faster decode on the
/// Qwen3-MoE shape).
fn down_unit(cfg: &crate::config::ModelConfig) -> usize {
    crate::shard::lcm(DOWN_UNIT, cfg.down_proj_block)
}

/// How [`Model::load_with`] stores the weights.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Storage and arithmetic of quantised weights (default: [`WeightMode::Q8`]).
    pub weights: WeightMode,
}

fn vector(src: &dyn WeightSource, name: &str, len: usize) -> anyhow::Result<Vec<f32>> {
    let t = src.tensor(name)?;
    ensure!(t.data.len() == len, "{name}: expected {len} elements, got {}", t.data.len());
    Ok(t.data)
}

fn optional_slice(src: &dyn WeightSource, name: &str, r: Range<usize>) -> anyhow::Result<Option<Vec<f32>>> {
    if !src.contains(name) {
        return Ok(None);
    }
    let t = src.tensor(name)?;
    ensure!(r.end <= t.data.len(), "{name}: too short");
    Ok(Some(t.data[r].to_vec()))
}

/// A quantised matrix with the arithmetic `opts` asks for; `q8_ok` is false where Q8 inputs
/// would not line up with tensor-parallel shards (see [`cols`]).
fn quantized(q: crate::quant::QuantRows, opts: LoadOptions, q8_ok: bool) -> Mat {
    if opts.weights == WeightMode::Q8 && q8_ok {
        Mat::quantized_q8(q)
    } else {
        Mat::quantized(q)
    }
}

/// Whether `name` is stored in GGML blocks (the same answer on every rank: one row is read).
fn block_quantized(src: &dyn WeightSource, name: &str) -> anyhow::Result<bool> {
    Ok(src.quant_rows(name, 0..1)?.is_some())
}

/// Loads rows `r` of a `[rows_total, cols]` weight (a column-parallel shard: each rank's rows
/// see the whole input, so any row split keeps every row's arithmetic).
fn rows(src: &dyn WeightSource, name: &str, r: Range<usize>, cols: usize, opts: LoadOptions) -> anyhow::Result<Mat> {
    let n = r.len();
    if n == 0 {
        return Ok(Mat::new(0, cols, Vec::new()));
    }
    if opts.weights != WeightMode::F32 {
        if let Some(q) = src.quant_rows(name, r.clone())? {
            ensure!(q.cols == cols, "{name}: expected {cols} columns, got {}", q.cols);
            return Ok(quantized(q, opts, true));
        }
    }
    let t = src.tensor_rows(name, r)?;
    ensure!(t.cols() == cols, "{name}: expected {cols} columns, got {}", t.cols());
    Ok(Mat::new(n, cols, t.data))
}

/// Loads columns `c` of a `[rows, cols_total]` weight (a row-parallel shard, summed across
/// ranks by all_sum). With Q8 inputs its products need `exact`, the step-6 unit in features
/// (see [`Model::load_with`]); without one the matrix keeps f32 inputs, so that TP = 1 and
/// TP = N never run different arithmetic on it.
fn cols(
    src: &dyn WeightSource,
    name: &str,
    c: Range<usize>,
    nrows: usize,
    exact: Option<usize>,
    opts: LoadOptions,
) -> anyhow::Result<Mat> {
    if c.is_empty() {
        return Ok(Mat::new(nrows, 0, Vec::new()));
    }
    if opts.weights != WeightMode::F32 {
        if let Some(q) = src.quant_rows(name, 0..nrows)? {
            // Shards on quantisation-block boundaries stay quantised; others fall through.
            if let Some(s) = q.slice_cols(c.clone()) {
                let mut m = quantized(s, opts, exact.is_some());
                m.exact_unit = exact.filter(|_| m.q8).map(|u| u / QK);
                return Ok(m);
            }
        }
    }
    let t = src.tensor(name)?;
    ensure!(t.rows() == nrows, "{name}: expected {nrows} rows, got {}", t.rows());
    ensure!(c.end <= t.cols(), "{name}: columns {c:?} out of {}", t.cols());
    let s = t.slice_cols(c.clone());
    Ok(Mat::new(nrows, c.len(), s.data))
}

/// Rows `r` of a (stacked) weight, columns `c` of them: one expert's down projection, or this
/// rank's slice of it. Quantised when the slice keeps whole blocks, like [`cols`]; the products
/// sum the ranks' f32 partials (no exact units: the experts' outputs are weighted before the
/// all_sum).
fn expert_cols(
    src: &dyn WeightSource,
    name: &str,
    r: Range<usize>,
    c: Range<usize>,
    exact: Option<usize>,
    opts: LoadOptions,
) -> anyhow::Result<Mat> {
    if c.is_empty() {
        return Ok(Mat::new(r.len(), 0, Vec::new()));
    }
    if opts.weights != WeightMode::F32 {
        if let Some(q) = src.quant_rows(name, r.clone())? {
            if let Some(s) = q.slice_cols(c.clone()) {
                let mut m = quantized(s, opts, true);
                m.exact_unit = exact.filter(|_| m.q8).map(|u| u / QK);
                return Ok(m);
            }
        }
    }
    let t = src.tensor_rows(name, r.clone())?;
    ensure!(c.end <= t.cols(), "{name}: columns {c:?} out of {}", t.cols());
    Ok(Mat::new(r.len(), c.len(), t.slice_cols(c).data))
}

/// Layer `i`'s router and this rank's experts ([`ShardPlan::experts`]): each expert's slice
/// of features `plan.ffn` with [`MoeSplit::Tp`], whole experts with [`MoeSplit::Ep`]. Only
/// those rows of the stacked tensors are read from the file.
fn moe_layer(
    src: &dyn WeightSource,
    plan: &ShardPlan,
    i: usize,
    opts: LoadOptions,
    put: &mut dyn FnMut(Mat) -> anyhow::Result<Mat>,
) -> anyhow::Result<MoeLayer> {
    let cfg = src.config();
    let mc = cfg.moe.context("experts in a dense model")?;
    let (h, f) = (cfg.hidden_size, cfg.intermediate_size);
    let n = |s: &str| names::layer(i, s);
    // llama.cpp multiplies the router in f32; so does this.
    let f32_opts = LoadOptions { weights: WeightMode::F32 };
    let router = rows(src, &n(names::ROUTER), 0..mc.experts, h, f32_opts).context("expert router")?;
    let c = match plan.moe {
        MoeSplit::Tp => plan.ffn.clone(),
        MoeSplit::Ep => 0..f,
    };
    // Exact down products (step 6 of `crate::quant::dot`) where every rank's share is whole
    // units: then each expert's output has the same bits whichever ranks computed its parts.
    let unit = down_unit(cfg);
    let in_units = match plan.moe {
        MoeSplit::Tp => plan.ffn_in_units_of(cfg, unit),
        MoeSplit::Ep => f.is_multiple_of(unit),
    };
    let exact = opts.weights == WeightMode::Q8 && in_units && block_quantized(src, &n(names::EXPERTS_DOWN))?;
    let mut experts = Vec::with_capacity(plan.experts.len());
    for e in plan.experts.clone() {
        let r = e * f + c.start..e * f + c.end;
        let mut expert = || -> anyhow::Result<Expert> {
            Ok(Expert {
                index: e,
                gate: put(rows(src, &n(names::EXPERTS_GATE), r.clone(), h, opts)?)?,
                up: put(rows(src, &n(names::EXPERTS_UP), r.clone(), h, opts)?)?,
                down: put(expert_cols(
                    src,
                    &n(names::EXPERTS_DOWN),
                    e * h..(e + 1) * h,
                    c.clone(),
                    exact.then_some(unit),
                    opts,
                )?)?,
            })
        };
        experts.push(expert().with_context(|| format!("layer {i}, expert {e}"))?);
    }
    Ok(MoeLayer { router, experts, exact })
}

impl Model {
    /// Loads the shard described by `plan` from `src`, with the default [`LoadOptions`].
    ///
    /// The embedding, the norms and the output head (tied or separate) are loaded whole on
    /// every rank; the layers only in this rank's share.
    pub fn load(src: &dyn WeightSource, plan: ShardPlan) -> anyhow::Result<Self> {
        Self::load_with(src, plan, LoadOptions::default())
    }

    /// [`Model::load`] with explicit storage options.
    pub fn load_with(src: &dyn WeightSource, plan: ShardPlan, opts: LoadOptions) -> anyhow::Result<Self> {
        let cfg = src.config().clone();
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        // Each matrix moves into the packer once loaded, so the heap holds one at a time.
        let mut packer = Packer::default();
        let mut put = |mut m: Mat| -> anyhow::Result<Mat> {
            m.quant.as_mut().map_or(Ok(()), |q| packer.put(q)).context("packing the quantised weights")?;
            Ok(m)
        };
        let embed = put(rows(src, names::EMBED, 0..cfg.vocab_size, h, opts).context("embedding (vocab x hidden)")?)?;
        let tied = cfg.tie_embeddings || !src.contains(names::LM_HEAD);
        let lm_head = if tied {
            None
        } else {
            Some(put(rows(src, names::LM_HEAD, 0..cfg.vocab_size, h, opts).context("lm_head (vocab x hidden)")?)?)
        };
        let q_rows = plan.q_heads.start * hd..plan.q_heads.end * hd;
        let kv_rows = plan.kv_heads.start * hd..plan.kv_heads.end * hd;
        // Step-6 units of the row-parallel layers (features), when Q8 inputs can use them: the
        // query heads of `exact_head_unit` for o_proj (the plan splits query heads in those
        // units at every TP), and `down_unit` MLP features for down_proj when every rank's
        // share is made of them.
        let q8 = opts.weights == WeightMode::Q8;
        let o_unit = exact_head_unit(&cfg).map(|heads| heads * hd);
        let o_exact = q8 && o_unit.is_some();
        // The exact unit, and every shard, must also be whole blocks of down_proj's encoding.
        let down_unit = down_unit(&cfg);
        let down_exact = q8 && plan.ffn_in_units_of(&cfg, down_unit);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let dense = cfg.moe.is_none();
        for i in 0..cfg.num_layers {
            let n = |s: &str| names::layer(i, s);
            let o_exact = o_exact && block_quantized(src, &n("self_attn.o_proj.weight"))?;
            let down_exact = dense && down_exact && block_quantized(src, &n("mlp.down_proj.weight"))?;
            // A mixture-of-experts layer has no dense MLP: its matrices stay empty.
            let (w_gate, w_up, w_down, moe) = if dense {
                let ffn = plan.ffn.clone();
                (
                    put(rows(src, &n("mlp.gate_proj.weight"), ffn.clone(), h, opts)?)?,
                    put(rows(src, &n("mlp.up_proj.weight"), ffn.clone(), h, opts)?)?,
                    put(cols(src, &n("mlp.down_proj.weight"), ffn, h, down_exact.then_some(down_unit), opts)?)?,
                    None,
                )
            } else {
                let m = moe_layer(src, &plan, i, opts, &mut put)?;
                (Mat::new(0, h, Vec::new()), Mat::new(0, h, Vec::new()), Mat::new(h, 0, Vec::new()), Some(m))
            };
            let layer = Layer {
                attn_norm: vector(src, &n("input_layernorm.weight"), h)?,
                wq: put(rows(src, &n("self_attn.q_proj.weight"), q_rows.clone(), h, opts)?)?,
                wk: put(rows(src, &n("self_attn.k_proj.weight"), kv_rows.clone(), h, opts)?)?,
                wv: put(rows(src, &n("self_attn.v_proj.weight"), kv_rows.clone(), h, opts)?)?,
                bq: optional_slice(src, &n("self_attn.q_proj.bias"), q_rows.clone())?,
                bk: optional_slice(src, &n("self_attn.k_proj.bias"), kv_rows.clone())?,
                bv: optional_slice(src, &n("self_attn.v_proj.bias"), kv_rows.clone())?,
                q_norm: optional_slice(src, &n("self_attn.q_norm.weight"), 0..hd)?,
                k_norm: optional_slice(src, &n("self_attn.k_norm.weight"), 0..hd)?,
                wo: put(cols(
                    src,
                    &n("self_attn.o_proj.weight"),
                    q_rows.clone(),
                    h,
                    o_unit.filter(|_| o_exact),
                    opts,
                )?)?,
                ffn_norm: vector(src, &n("post_attention_layernorm.weight"), h)?,
                w_gate,
                w_up,
                w_down,
                o_exact,
                down_exact,
                moe,
            };
            ensure!(cfg.qkv_bias == layer.bq.is_some(), "layer {i}: q/k/v bias presence does not match the config");
            ensure!(
                cfg.qk_norm == layer.q_norm.is_some() && cfg.qk_norm == layer.k_norm.is_some(),
                "layer {i}: q/k norm presence does not match the config"
            );
            layers.push(layer);
        }
        let inv_freq = cfg.rope_inv_freq();
        let mut model = Self {
            final_norm: vector(src, names::FINAL_NORM, h)?,
            cfg,
            plan,
            embed,
            lm_head,
            layers,
            inv_freq,
            #[cfg(feature = "gpu")]
            gpu_layers: None,
            #[cfg(feature = "gpu")]
            head_gpu: None,
            #[cfg(feature = "gpu")]
            gpu_prefill_rows: 1,
        };
        packer.finish(&mut model.quant_rows_mut()).context("packing the quantised weights")?;
        Ok(model)
    }

    /// Every block-quantised matrix.
    fn quant_rows_mut(&mut self) -> Vec<&mut QuantRows> {
        let Model { embed, lm_head, layers, .. } = self;
        let mut all = Vec::new();
        for l in layers.iter_mut() {
            for m in [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.w_gate, &mut l.w_up, &mut l.w_down] {
                all.extend(m.quant.as_mut());
            }
            for m in l.moe.iter_mut().flat_map(|m| m.mats_mut()) {
                all.extend(m.quant.as_mut());
            }
        }
        all.extend(embed.quant.as_mut());
        all.extend(lm_head.as_mut().and_then(|m| m.quant.as_mut()));
        all
    }

    /// Bytes of weights this rank holds on the CPU (matrices, norms and biases).
    pub fn weight_bytes(&self) -> usize {
        let v = |x: &Option<Vec<f32>>| 4 * x.as_ref().map_or(0, Vec::len);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                    .iter()
                    .map(|m| m.size_bytes())
                    .sum::<usize>()
                    + 4 * (l.attn_norm.len() + l.ffn_norm.len())
                    + v(&l.bq)
                    + v(&l.bk)
                    + v(&l.bv)
                    + v(&l.q_norm)
                    + v(&l.k_norm)
                    + l.moe.as_ref().map_or(0, |m| m.size_bytes())
            })
            .sum();
        layers + self.embed.size_bytes() + self.lm_head.as_ref().map_or(0, Mat::size_bytes) + 4 * self.final_norm.len()
    }
}
