//! A whole decoder layer's shard on the GPU: two round trips per layer per token.
//!
//! Attention segment: upload x → RMSNorm → q/k/v products → bias / q-k norm / RoPE → append K/V
//! to the GPU cache → attention → o_proj → read back the partial. MLP segment: upload x →
//! RMSNorm → gate/up → SiLU·up → down → read back. The host adds the residual and runs the
//! all_sum between segments, so the GPU never waits on the network.
//!
//! Prefill runs the same two segments on T tokens at once ([`GpuLayer::attention_batch`],
//! [`GpuLayer::mlp_batch`]): still one submission and one read-back per segment, now of
//! T x hidden values, with the matrix products in the batched `matmul*` kernels and every
//! layer kernel taking T rows. The batch's buffers ([`BatchBufs`]) are shared by a rank's
//! layers, which run one after another.

use std::sync::Arc;

use anyhow::ensure;
use wgpu::util::DeviceExt;

use super::{batch_uniform, map_read, BatchProduct, GpuContext, GpuMat};

/// WGSL of the per-layer kernels.
pub const LAYER_WGSL: &str = include_str!("layer.wgsl");

/// Host-side description of one layer's shard, for [`GpuLayer::new`].
pub struct LayerSpec<'a> {
    /// Hidden size.
    pub hidden: usize,
    /// Head width.
    pub head_dim: usize,
    /// Local query heads (0: this rank has no attention work).
    pub n_q: usize,
    /// Local KV heads.
    pub n_kv: usize,
    /// Query heads per KV head (the model's, not the shard's).
    pub group: usize,
    /// Local query head `q` reads local KV head `(q + q_skew) / group` (see
    /// [`crate::shard::ShardPlan::q_skew`]).
    pub q_skew: usize,
    /// Longest sequence the GPU KV cache holds.
    pub max_seq: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Adjacent-pair (GPT-J) instead of rotate-half RoPE.
    pub interleaved: bool,
    /// RoPE inverse frequencies (head_dim / 2).
    pub inv_freq: &'a [f32],
    /// Norm weights.
    pub attn_norm: &'a [f32],
    /// Norm weights.
    pub ffn_norm: &'a [f32],
    /// Optional q/k/v biases (Qwen2) and per-head q/k norms (Qwen3).
    pub bq: Option<&'a [f32]>,
    /// See `bq`.
    pub bk: Option<&'a [f32]>,
    /// See `bq`.
    pub bv: Option<&'a [f32]>,
    /// See `bq`.
    pub q_norm: Option<&'a [f32]>,
    /// See `bq`.
    pub k_norm: Option<&'a [f32]>,
    /// The layer's matrices, already uploaded.
    pub wq: Option<Arc<GpuMat>>,
    /// See `wq`.
    pub wk: Option<Arc<GpuMat>>,
    /// See `wq`.
    pub wv: Option<Arc<GpuMat>>,
    /// See `wq`.
    pub wo: Option<Arc<GpuMat>>,
    /// MLP matrices.
    pub w_gate: Arc<GpuMat>,
    /// See `w_gate`.
    pub w_up: Arc<GpuMat>,
    /// See `w_gate`.
    pub w_down: Arc<GpuMat>,
    /// The rank's prefill buffers, shared by its layers.
    pub batch: Arc<BatchBufs>,
}

/// Working buffers of one rank's batched prefill, for up to [`BatchBufs::max_rows`] tokens,
/// shared by all its layers. Activations are row-major `[T][n]`.
pub struct BatchBufs {
    max_rows: usize,
    /// Residual rows in, normalised rows.
    x: wgpu::Buffer,
    xn: wgpu::Buffer,
    /// q, k, v rows (`[T][heads][head_dim]`), the attention output, its scores scratch
    /// (`[T][q heads][max_seq]`).
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    att: wgpu::Buffer,
    scores: wgpu::Buffer,
    /// gate and up rows, SiLU(gate) * up.
    gate: wgpu::Buffer,
    up: wgpu::Buffer,
    act: wgpu::Buffer,
    /// The segment's partial (o_proj or down_proj rows) and its host-readable copy.
    out: wgpu::Buffer,
    staging: wgpu::Buffer,
    /// `[T, 0, 0, 0]` for the matmul kernels.
    rows: wgpu::Buffer,
}

impl BatchBufs {
    /// Buffers for batches of up to [`crate::GPU_PREFILL_BATCH`] tokens, fewer when a buffer
    /// would exceed the device's limits (a long context with many heads can make the scores
    /// scratch the largest); an error when not even one token's buffers fit.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &GpuContext,
        hidden: usize,
        head_dim: usize,
        n_q: usize,
        n_kv: usize,
        ffn: usize,
        max_seq: usize,
    ) -> anyhow::Result<Self> {
        let lim = ctx.limits();
        let max_bytes = lim.max_storage_buffer_binding_size.min(lim.max_buffer_size);
        // Bytes per token row of the widest buffer.
        let row = 4 * [hidden, n_q * head_dim, n_kv * head_dim, ffn, n_q * max_seq].into_iter().max().unwrap_or(1);
        let fit = usize::try_from(max_bytes / row.max(1) as u64).unwrap_or(usize::MAX);
        ensure!(fit >= 1, "one token's prefill buffers ({row} bytes) exceed the GPU's buffer limit ({max_bytes})");
        let max_rows = crate::GPU_PREFILL_BATCH.min(fit).min(lim.max_compute_workgroups_per_dimension as usize);
        let d = &ctx.device;
        use wgpu::BufferUsages as U;
        let buf = |label, n: usize, usage| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (max_rows * n.max(1) * 4) as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        let s = U::STORAGE;
        Ok(Self {
            max_rows,
            x: buf("batch x", hidden, s | U::COPY_DST),
            xn: buf("batch xn", hidden, s),
            q: buf("batch q", n_q * head_dim, s | U::COPY_SRC),
            k: buf("batch k", n_kv * head_dim, s | U::COPY_SRC),
            v: buf("batch v", n_kv * head_dim, s | U::COPY_SRC),
            att: buf("batch att", n_q * head_dim, s | U::COPY_DST),
            scores: buf("batch scores", n_q * max_seq, s),
            gate: buf("batch gate", ffn, s),
            up: buf("batch up", ffn, s),
            act: buf("batch act", ffn, s),
            out: buf("batch out", hidden, s | U::COPY_SRC),
            staging: buf("batch staging", hidden, U::MAP_READ | U::COPY_DST),
            rows: batch_uniform(d, 0)?,
        })
    }

    /// The most tokens one batch takes; longer prompts go in several.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }
}

/// A layer's bind groups over the shared [`BatchBufs`].
struct Batched {
    bufs: Arc<BatchBufs>,
    bg_norm_attn: wgpu::BindGroup,
    bg_norm_ffn: wgpu::BindGroup,
    bg_silu: wgpu::BindGroup,
    gate: BatchProduct,
    up: BatchProduct,
    down: BatchProduct,
    attn: Option<BatchedAttn>,
}

struct BatchedAttn {
    bg_qprep: wgpu::BindGroup,
    bg_kprep: wgpu::BindGroup,
    bg_vprep: Option<wgpu::BindGroup>,
    bg_attn: wgpu::BindGroup,
    wq: BatchProduct,
    wk: BatchProduct,
    wv: BatchProduct,
    wo: BatchProduct,
}

struct Attn {
    wq: Arc<GpuMat>,
    wk: Arc<GpuMat>,
    wv: Arc<GpuMat>,
    wo: Arc<GpuMat>,
    kcache: wgpu::Buffer,
    vcache: wgpu::Buffer,
    att: wgpu::Buffer,
    p_qprep: wgpu::Buffer,
    p_kprep: wgpu::Buffer,
    p_vprep: wgpu::Buffer,
    p_attn: wgpu::Buffer,
    bg_qprep: wgpu::BindGroup,
    bg_kprep: wgpu::BindGroup,
    bg_vprep: Option<wgpu::BindGroup>,
    bg_attn: wgpu::BindGroup,
    q_flags: u32,
    k_flags: u32,
}

/// One layer's shard resident on the GPU.
pub struct GpuLayer {
    ctx: Arc<GpuContext>,
    hidden: usize,
    head_dim: usize,
    n_q: usize,
    n_kv: usize,
    max_seq: usize,
    eps: f32,
    group: usize,
    q_skew: usize,
    x: wgpu::Buffer,
    xn: wgpu::Buffer,
    bg_norm_attn: wgpu::BindGroup,
    bg_norm_ffn: wgpu::BindGroup,
    bg_silu: wgpu::BindGroup,
    attn: Option<Attn>,
    w_gate: Arc<GpuMat>,
    w_up: Arc<GpuMat>,
    w_down: Arc<GpuMat>,
    batch: Batched,
}

/// Pipelines and layout for the layer kernels (built once per device).
pub struct LayerKernels {
    layout: wgpu::BindGroupLayout,
    rmsnorm: wgpu::ComputePipeline,
    qk_prep: wgpu::ComputePipeline,
    attention: wgpu::ComputePipeline,
    silu_mul: wgpu::ComputePipeline,
}

impl LayerKernels {
    /// Compiles the kernels on `ctx`'s device.
    pub fn new(ctx: &GpuContext) -> Self {
        let d = &ctx.device;
        let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("layer"),
            source: wgpu::ShaderSource::Wgsl(LAYER_WGSL.into()),
        });
        let entry = |binding, ty| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None },
            count: None,
        };
        use wgpu::BufferBindingType as B;
        let layout = d.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("layer"),
            entries: &[
                entry(0, B::Storage { read_only: false }),
                entry(1, B::Storage { read_only: true }),
                entry(2, B::Storage { read_only: true }),
                entry(3, B::Storage { read_only: false }),
                entry(4, B::Uniform),
            ],
        });
        let pl = d.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("layer"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let make = |name| {
            d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: Some(&pl),
                module: &module,
                entry_point: Some(name),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        Self {
            rmsnorm: make("rmsnorm"),
            qk_prep: make("qk_prep"),
            attention: make("attention"),
            silu_mul: make("silu_mul"),
            layout,
        }
    }
}

/// Mirror of the WGSL `Params` uniform (field meanings depend on the kernel, see layer.wgsl).
#[derive(Default, Clone, Copy)]
struct Params {
    n: u32,
    heads: u32,
    pos: u32,
    flags: u32,
    eps: f32,
    scale: f32,
    group: u32,
    n_kv: u32,
}

impl Params {
    fn bytes(self) -> [u8; 32] {
        let mut b = [0u8; 32];
        let words =
            [self.n, self.heads, self.pos, self.flags, self.eps.to_bits(), self.scale.to_bits(), self.group, self.n_kv];
        for (i, v) in words.into_iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

impl GpuLayer {
    /// Builds the layer: uploads norms/biases, allocates the KV cache, makes the bind groups.
    pub fn new(ctx: &Arc<GpuContext>, k: &LayerKernels, s: LayerSpec<'_>) -> anyhow::Result<Self> {
        ensure!(s.head_dim <= 256 && s.head_dim.is_multiple_of(2), "GPU attention needs an even head_dim <= 256");
        let d = &ctx.device;
        use wgpu::BufferUsages as U;
        let init = |label, data: &[f32], usage| {
            d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::cast_slice(if data.is_empty() { &[0f32][..] } else { data }),
                usage,
            })
        };
        let zeros = |label, n: usize, usage| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (n.max(1) * 4) as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        let uni = |bytes: [u8; 32]| {
            d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: &bytes,
                usage: U::UNIFORM | U::COPY_DST,
            })
        };
        let bind = |a: &wgpu::Buffer, b: &wgpu::Buffer, c: &wgpu::Buffer, o: &wgpu::Buffer, p: &wgpu::Buffer| {
            d.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("layer"),
                layout: &k.layout,
                entries: &[a, b, c, o, p]
                    .iter()
                    .enumerate()
                    .map(|(i, buf)| wgpu::BindGroupEntry { binding: i as u32, resource: buf.as_entire_binding() })
                    .collect::<Vec<_>>(),
            })
        };
        let h = s.hidden;
        let dummy = || zeros("dummy", 1, U::STORAGE);
        let x = zeros("x", h, U::STORAGE | U::COPY_DST);
        let xn = zeros("xn", h, U::STORAGE | U::COPY_SRC);
        let an = init("attn_norm", s.attn_norm, U::STORAGE);
        let fnw = init("ffn_norm", s.ffn_norm, U::STORAGE);
        let p_norm = uni(Params { n: h as u32, eps: s.eps, ..Default::default() }.bytes());
        let bg_norm_attn = bind(&x, &an, &dummy(), &xn, &p_norm);
        let bg_norm_ffn = bind(&x, &fnw, &dummy(), &xn, &p_norm);
        let nf = s.w_gate.rows;
        let p_silu = uni(Params { n: nf as u32, ..Default::default() }.bytes());
        let bg_silu = bind(&s.w_gate.y, &s.w_up.y, &dummy(), &s.w_down.x, &p_silu);
        let bb = &s.batch;
        let mut batch = Batched {
            bufs: s.batch.clone(),
            bg_norm_attn: bind(&bb.x, &an, &dummy(), &bb.xn, &p_norm),
            bg_norm_ffn: bind(&bb.x, &fnw, &dummy(), &bb.xn, &p_norm),
            bg_silu: bind(&bb.gate, &bb.up, &dummy(), &bb.act, &p_silu),
            gate: s.w_gate.batch_bind(&bb.xn, &bb.gate, &bb.rows),
            up: s.w_up.batch_bind(&bb.xn, &bb.up, &bb.rows),
            down: s.w_down.batch_bind(&bb.act, &bb.out, &bb.rows),
            attn: None,
        };
        let hd = s.head_dim;
        let attn = match (s.wq, s.wk, s.wv, s.wo) {
            (Some(wq), Some(wk), Some(wv), Some(wo)) if s.n_q > 0 => {
                let kv_len = s.max_seq * s.n_kv * hd;
                let kcache = zeros("kcache", kv_len, U::STORAGE | U::COPY_DST);
                let vcache = zeros("vcache", kv_len, U::STORAGE | U::COPY_DST);
                let att = zeros("att", s.n_q * hd, U::STORAGE | U::COPY_DST | U::COPY_SRC);
                let scores = zeros("scores", s.n_q * s.max_seq, U::STORAGE);
                let inv = |label| init(label, s.inv_freq, U::STORAGE);
                let rope = 8 | if s.interleaved { 4 } else { 0 };
                let q_flags = rope | u32::from(s.bq.is_some()) | if s.q_norm.is_some() { 2 } else { 0 };
                let k_flags = rope | u32::from(s.bk.is_some()) | if s.k_norm.is_some() { 2 } else { 0 };
                let buf_or = |label, v: Option<&[f32]>| match v {
                    Some(v) => init(label, v, U::STORAGE),
                    None => dummy(),
                };
                let p_qprep = uni([0; 32]);
                let p_kprep = uni([0; 32]);
                let p_vprep = uni(Params { n: hd as u32, flags: 1, eps: s.eps, ..Default::default() }.bytes());
                let p_attn = uni([0; 32]);
                let (bq, qn, invq) = (buf_or("bq", s.bq), buf_or("qn", s.q_norm), inv("invq"));
                let (bk, kn, invk) = (buf_or("bk", s.bk), buf_or("kn", s.k_norm), inv("invk"));
                let bv = s.bv.map(|bv| init("bv", bv, U::STORAGE));
                let bg_qprep = bind(&wq.y, &bq, &qn, &invq, &p_qprep);
                let bg_kprep = bind(&wk.y, &bk, &kn, &invk, &p_kprep);
                let bg_vprep = bv.as_ref().map(|bv| bind(&wv.y, bv, &dummy(), &dummy_rw(d), &p_vprep));
                let bg_attn = bind(&scores, &kcache, &vcache, &att, &p_attn);
                // The batch shares the cache and the uniforms (rewritten by every call).
                batch.attn = Some(BatchedAttn {
                    bg_qprep: bind(&bb.q, &bq, &qn, &invq, &p_qprep),
                    bg_kprep: bind(&bb.k, &bk, &kn, &invk, &p_kprep),
                    bg_vprep: bv.as_ref().map(|bv| bind(&bb.v, bv, &dummy(), &dummy_rw(d), &p_vprep)),
                    bg_attn: bind(&bb.scores, &kcache, &vcache, &bb.att, &p_attn),
                    wq: wq.batch_bind(&bb.xn, &bb.q, &bb.rows),
                    wk: wk.batch_bind(&bb.xn, &bb.k, &bb.rows),
                    wv: wv.batch_bind(&bb.xn, &bb.v, &bb.rows),
                    wo: wo.batch_bind(&bb.att, &bb.out, &bb.rows),
                });
                Some(Attn {
                    wq,
                    wk,
                    wv,
                    wo,
                    kcache,
                    vcache,
                    att,
                    p_qprep,
                    p_kprep,
                    p_vprep,
                    p_attn,
                    bg_qprep,
                    bg_kprep,
                    bg_vprep,
                    bg_attn,
                    q_flags,
                    k_flags,
                })
            }
            _ => None,
        };
        Ok(Self {
            ctx: ctx.clone(),
            hidden: h,
            head_dim: hd,
            n_q: s.n_q,
            n_kv: s.n_kv,
            max_seq: s.max_seq,
            eps: s.eps,
            group: s.group,
            q_skew: s.q_skew,
            x,
            xn,
            bg_norm_attn,
            bg_norm_ffn,
            bg_silu,
            attn,
            w_gate: s.w_gate,
            w_up: s.w_up,
            w_down: s.w_down,
            batch,
        })
    }

    /// Attention partial (`hidden` values, before all_sum) for the token whose residual is
    /// `x`, at position `pos`; appends its K/V to the GPU cache. Zeros when this rank has no
    /// heads.
    pub fn attention(&self, k: &LayerKernels, x: &[f32], pos: usize, out: &mut [f32]) -> anyhow::Result<()> {
        let Some(a) = &self.attn else {
            out.fill(0.0);
            return Ok(());
        };
        ensure!(pos < self.max_seq, "GPU KV cache full ({} positions)", self.max_seq);
        let (d, q) = (&self.ctx.device, &self.ctx.queue);
        let hd = self.head_dim;
        q.write_buffer(&self.x, 0, bytemuck::cast_slice(x));
        self.write_attention_params(a, pos);
        let _ = &a.p_vprep;
        let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.dispatch(&mut enc, &k.rmsnorm, &self.bg_norm_attn, 1);
        let hb = (self.hidden * 4) as u64;
        for m in [&a.wq, &a.wk, &a.wv] {
            enc.copy_buffer_to_buffer(&self.xn, 0, &m.x, 0, hb);
        }
        self.matvecs(&mut enc, &[&a.wq, &a.wk, &a.wv]);
        self.dispatch(&mut enc, &k.qk_prep, &a.bg_qprep, self.n_q as u32);
        self.dispatch(&mut enc, &k.qk_prep, &a.bg_kprep, self.n_kv as u32);
        if let Some(bg) = &a.bg_vprep {
            self.dispatch(&mut enc, &k.qk_prep, bg, self.n_kv as u32);
        }
        let kvb = (self.n_kv * hd * 4) as u64;
        enc.copy_buffer_to_buffer(&a.wk.y, 0, &a.kcache, pos as u64 * kvb, kvb);
        enc.copy_buffer_to_buffer(&a.wv.y, 0, &a.vcache, pos as u64 * kvb, kvb);
        enc.copy_buffer_to_buffer(&a.wq.y, 0, &a.att, 0, (self.n_q * hd * 4) as u64);
        self.dispatch(&mut enc, &k.attention, &a.bg_attn, self.n_q as u32);
        enc.copy_buffer_to_buffer(&a.att, 0, &a.wo.x, 0, (self.n_q * hd * 4) as u64);
        self.matvecs(&mut enc, &[&a.wo]);
        self.finish(enc, &a.wo, out)
    }

    /// MLP partial (`hidden` values, before all_sum) for the residual `x`.
    pub fn mlp(&self, k: &LayerKernels, x: &[f32], out: &mut [f32]) -> anyhow::Result<()> {
        let (d, q) = (&self.ctx.device, &self.ctx.queue);
        q.write_buffer(&self.x, 0, bytemuck::cast_slice(x));
        let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.dispatch(&mut enc, &k.rmsnorm, &self.bg_norm_ffn, 1);
        let hb = (self.hidden * 4) as u64;
        enc.copy_buffer_to_buffer(&self.xn, 0, &self.w_gate.x, 0, hb);
        enc.copy_buffer_to_buffer(&self.xn, 0, &self.w_up.x, 0, hb);
        self.matvecs(&mut enc, &[&self.w_gate, &self.w_up]);
        self.dispatch(&mut enc, &k.silu_mul, &self.bg_silu, (self.w_gate.rows as u32).div_ceil(64));
        self.matvecs(&mut enc, &[&self.w_down]);
        self.finish(enc, &self.w_down, out)
    }

    /// The most tokens [`GpuLayer::attention_batch`] and [`GpuLayer::mlp_batch`] take at once.
    pub fn max_batch(&self) -> usize {
        self.batch.bufs.max_rows
    }

    /// The rows of a batch `x` (`[t][hidden]`), checked against `out` and the buffers.
    fn batch_rows(&self, x: &[f32], out: &[f32]) -> anyhow::Result<usize> {
        let h = self.hidden;
        let t = x.len() / h;
        ensure!(t > 0 && x.len() == t * h, "batch of {} values is not whole rows of {h}", x.len());
        ensure!(out.len() == x.len(), "batch output holds {} values, not {}", out.len(), x.len());
        ensure!(t <= self.max_batch(), "batch of {t} tokens over the GPU's {} a batch", self.max_batch());
        Ok(t)
    }

    /// [`GpuLayer::attention`] for the `t` tokens whose residual rows are `x` (`[t][hidden]`),
    /// at positions `pos0..pos0 + t`, with causal attention among them: one submission and one
    /// read-back of the `t` partial rows. Appends their K/V to the GPU cache.
    pub fn attention_batch(&self, k: &LayerKernels, x: &[f32], pos0: usize, out: &mut [f32]) -> anyhow::Result<()> {
        let t = self.batch_rows(x, out)?;
        let (Some(a), Some(b)) = (&self.attn, &self.batch.attn) else {
            out.fill(0.0);
            return Ok(());
        };
        ensure!(pos0 + t <= self.max_seq, "GPU KV cache full ({} positions)", self.max_seq);
        let bufs = &self.batch.bufs;
        let (d, q) = (&self.ctx.device, &self.ctx.queue);
        let hd = self.head_dim;
        q.write_buffer(&bufs.x, 0, bytemuck::cast_slice(x));
        q.write_buffer(&bufs.rows, 0, bytemuck::cast_slice(&[t as u32, 0, 0, 0]));
        // Row 0's position; the kernels add the row index.
        self.write_attention_params(a, pos0);
        let rows = t as u32;
        let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.dispatch2(&mut enc, &k.rmsnorm, &self.batch.bg_norm_attn, rows, 1);
        self.products(&mut enc, &[&b.wq, &b.wk, &b.wv], t)?;
        self.dispatch2(&mut enc, &k.qk_prep, &b.bg_qprep, self.n_q as u32, rows);
        self.dispatch2(&mut enc, &k.qk_prep, &b.bg_kprep, self.n_kv as u32, rows);
        if let Some(bg) = &b.bg_vprep {
            self.dispatch2(&mut enc, &k.qk_prep, bg, self.n_kv as u32, rows);
        }
        // k and v rows are [t][n_kv][hd]: the cache's layout from position pos0 on.
        let kvb = (self.n_kv * hd * 4) as u64;
        enc.copy_buffer_to_buffer(&bufs.k, 0, &a.kcache, pos0 as u64 * kvb, t as u64 * kvb);
        enc.copy_buffer_to_buffer(&bufs.v, 0, &a.vcache, pos0 as u64 * kvb, t as u64 * kvb);
        enc.copy_buffer_to_buffer(&bufs.q, 0, &bufs.att, 0, (t * self.n_q * hd * 4) as u64);
        self.dispatch2(&mut enc, &k.attention, &b.bg_attn, self.n_q as u32, rows);
        self.products(&mut enc, &[&b.wo], t)?;
        self.finish_batch(enc, out)
    }

    /// [`GpuLayer::mlp`] for the `t` residual rows `x` (`[t][hidden]`): one submission and one
    /// read-back of the `t` partial rows.
    pub fn mlp_batch(&self, k: &LayerKernels, x: &[f32], out: &mut [f32]) -> anyhow::Result<()> {
        let t = self.batch_rows(x, out)?;
        let b = &self.batch;
        let (d, q) = (&self.ctx.device, &self.ctx.queue);
        q.write_buffer(&b.bufs.x, 0, bytemuck::cast_slice(x));
        q.write_buffer(&b.bufs.rows, 0, bytemuck::cast_slice(&[t as u32, 0, 0, 0]));
        let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.dispatch2(&mut enc, &k.rmsnorm, &b.bg_norm_ffn, t as u32, 1);
        self.products(&mut enc, &[&b.gate, &b.up], t)?;
        self.dispatch2(&mut enc, &k.silu_mul, &b.bg_silu, (self.w_gate.rows as u32).div_ceil(64), t as u32);
        self.products(&mut enc, &[&b.down], t)?;
        self.finish_batch(enc, out)
    }

    fn products(&self, enc: &mut wgpu::CommandEncoder, ps: &[&BatchProduct], t: usize) -> anyhow::Result<()> {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        for p in ps {
            p.dispatch(&self.ctx, &mut pass, t)?;
        }
        Ok(())
    }

    /// The q/k preparation and attention uniforms for a token at `pos` (a batch's row 0; the
    /// kernels add the row index).
    fn write_attention_params(&self, a: &Attn, pos: usize) {
        let (q, hd) = (&self.ctx.queue, self.head_dim as u32);
        let prep = |flags| Params { n: hd, pos: pos as u32, flags, eps: self.eps, ..Default::default() };
        q.write_buffer(&a.p_qprep, 0, &prep(a.q_flags).bytes());
        q.write_buffer(&a.p_kprep, 0, &prep(a.k_flags).bytes());
        let attn = Params {
            n: hd,
            heads: self.max_seq as u32,
            pos: pos as u32 + 1,
            // The attention kernel does not read flags: it carries the query-head skew.
            flags: self.q_skew as u32,
            scale: 1.0 / (hd as f32).sqrt(),
            group: self.group as u32,
            n_kv: self.n_kv as u32,
            ..Default::default()
        };
        q.write_buffer(&a.p_attn, 0, &attn.bytes());
    }

    /// Submits, then reads the batch's partial rows back into `out`.
    fn finish_batch(&self, mut enc: wgpu::CommandEncoder, out: &mut [f32]) -> anyhow::Result<()> {
        let bufs = &self.batch.bufs;
        enc.copy_buffer_to_buffer(&bufs.out, 0, &bufs.staging, 0, (out.len() * 4) as u64);
        self.ctx.queue.submit([enc.finish()]);
        map_read(&self.ctx.device, &bufs.staging, out)
    }

    fn dispatch(&self, enc: &mut wgpu::CommandEncoder, p: &wgpu::ComputePipeline, bg: &wgpu::BindGroup, n: u32) {
        self.dispatch2(enc, p, bg, n, 1)
    }

    fn dispatch2(
        &self,
        enc: &mut wgpu::CommandEncoder,
        p: &wgpu::ComputePipeline,
        bg: &wgpu::BindGroup,
        nx: u32,
        ny: u32,
    ) {
        if nx == 0 || ny == 0 {
            return;
        }
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        pass.set_pipeline(p);
        pass.set_bind_group(0, bg, &[]);
        pass.dispatch_workgroups(nx, ny, 1);
    }

    fn matvecs(&self, enc: &mut wgpu::CommandEncoder, mats: &[&Arc<GpuMat>]) {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        for m in mats {
            pass.set_pipeline(self.ctx.pipeline_for(m.kind));
            pass.set_bind_group(0, &m.bind, &[]);
            pass.dispatch_workgroups(m.grid.0, m.grid.1, 1);
        }
    }

    /// Submits, then reads `m`'s output back into `out`.
    fn finish(&self, mut enc: wgpu::CommandEncoder, m: &GpuMat, out: &mut [f32]) -> anyhow::Result<()> {
        ensure!(out.len() == m.rows, "{} outputs for a matrix of {} rows", out.len(), m.rows);
        enc.copy_buffer_to_buffer(&m.y, 0, &m.staging, 0, (m.rows * 4) as u64);
        self.ctx.queue.submit([enc.finish()]);
        map_read(&self.ctx.device, &m.staging, out)
    }
}

fn dummy_rw(d: &wgpu::Device) -> wgpu::Buffer {
    d.create_buffer(&wgpu::BufferDescriptor {
        label: Some("dummy_rw"),
        size: 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}
