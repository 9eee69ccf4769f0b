//! GPU backend on `wgpu` (Vulkan on Linux, Metal on macOS) with WGSL kernels.
//!
//! Each decoder layer runs on the GPU in two segments ([`layer::GpuLayer`]): attention
//! (RMSNorm, q/k/v, bias, q/k norm, RoPE, KV cache, attention, o_proj) and MLP (RMSNorm,
//! gate/up, SiLU, down). Each segment is one submission and one read-back of the partial hidden
//! vector; the host adds the residual and runs the all_sum in between, so collectives always see
//! completed, host-visible results and the GPU never waits on the network (the contract from
//! the research note). The output head is a plain [`GpuMat`] product: each rank uploads only
//! the rows of its vocabulary slice and rank 0 gathers the logits on the host.
//!
//! Prefill takes the prompt in batches ([`layer::GpuLayer::attention_batch`] /
//! [`layer::GpuLayer::mlp_batch`]): the same two segments per layer for T tokens at once, with
//! matrix-matrix kernels (the `matmul*` entries of the matvec shaders) that read each weight
//! once per tile of [`MATMUL_TILE`] tokens, and one all_sum per segment on T x hidden values.

use std::sync::{mpsc, Arc};

use anyhow::{anyhow, Context};
use wgpu::util::DeviceExt;

use crate::quant::{GgmlType, QuantRows};

pub mod layer;

/// Input rows each workgroup of a `matmul*` kernel multiplies with the weights it loads (`TT`
/// in the shaders): the weight reuse of batched prefill.
pub const MATMUL_TILE: usize = 16;

/// WGSL source of the f32 matvec kernel (and its batched `matmul`). Each matvec module is its
/// own file followed by matmul_tile.wgsl, the batched-prefill tile they share (WGSL has no
/// include; module-scope declarations may come in any order).
pub const MATVEC_WGSL: &str = concat!(include_str!("matvec.wgsl"), include_str!("matmul_tile.wgsl"));
/// WGSL source of the f16-weight matvec kernel and its `matmul` (needs the `shader-f16` feature).
pub const MATVEC_F16_WGSL: &str = concat!(include_str!("matvec_f16.wgsl"), include_str!("matmul_tile.wgsl"));
/// WGSL source of the matvec and matmul kernels on GGML blocks (Q4_0, Q4_1, Q8_0), decoded in
/// the shader.
pub const MATVEC_Q_WGSL: &str = concat!(include_str!("matvec_q.wgsl"), include_str!("matmul_tile.wgsl"));

/// How a [`GpuMat`]'s weights are stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightKind {
    /// f32 values.
    F32,
    /// f16 values (`shader-f16`), f32 accumulation.
    F16,
    /// GGML blocks, see matvec_q.wgsl.
    Q4_0,
    /// GGML blocks, see matvec_q.wgsl.
    Q4_1,
    /// GGML blocks, see matvec_q.wgsl.
    Q8_0,
}

/// Rows per grid row; keeps each dispatch dimension under the 65535 limit.
const GRID_X: u32 = 32768;

/// A device, its queue and the compiled kernels.
pub struct GpuContext {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipeline: wgpu::ComputePipeline,
    /// f16-weight pipeline, when the adapter supports `shader-f16`.
    pipeline_f16: Option<wgpu::ComputePipeline>,
    /// Block-quantised pipelines: Q4_0, Q4_1, Q8_0.
    pipeline_q: [wgpu::ComputePipeline; 3],
    layout: wgpu::BindGroupLayout,
    /// Batched (`matmul*`) pipelines, in the order of the matvec ones: f32, f16, Q4_0/Q4_1/Q8_0.
    mm: MatmulPipelines,
    /// The matvec layout plus binding 4, the batch's row count.
    layout_mm: wgpu::BindGroupLayout,
    /// Human-readable adapter description.
    pub adapter: String,
}

/// The `matmul*` entry points, one per weight kind.
struct MatmulPipelines {
    f32: wgpu::ComputePipeline,
    f16: Option<wgpu::ComputePipeline>,
    q: [wgpu::ComputePipeline; 3],
}

impl GpuContext {
    /// Whether weights can be stored as f16 on this device.
    pub fn supports_f16(&self) -> bool {
        self.pipeline_f16.is_some()
    }

    /// The matvec pipeline for weights stored as `kind`.
    fn pipeline_for(&self, kind: WeightKind) -> &wgpu::ComputePipeline {
        match (kind, &self.pipeline_f16) {
            (WeightKind::F16, Some(p)) => p,
            (WeightKind::Q4_0, _) => &self.pipeline_q[0],
            (WeightKind::Q4_1, _) => &self.pipeline_q[1],
            (WeightKind::Q8_0, _) => &self.pipeline_q[2],
            _ => &self.pipeline,
        }
    }

    /// The batched (matrix-matrix) pipeline for weights stored as `kind`.
    fn matmul_for(&self, kind: WeightKind) -> &wgpu::ComputePipeline {
        match (kind, &self.mm.f16) {
            (WeightKind::F16, Some(p)) => p,
            (WeightKind::Q4_0, _) => &self.mm.q[0],
            (WeightKind::Q4_1, _) => &self.mm.q[1],
            (WeightKind::Q8_0, _) => &self.mm.q[2],
            _ => &self.mm.f32,
        }
    }

    /// The device's limits (buffer sizes bound the prefill batch).
    pub fn limits(&self) -> wgpu::Limits {
        self.device.limits()
    }
}

impl GpuContext {
    /// Opens the default adapter. `Ok(None)` when the machine has no usable adapter.
    pub fn new() -> anyhow::Result<Option<Arc<Self>>> {
        pollster::block_on(Self::new_async())
    }

    async fn new_async() -> anyhow::Result<Option<Arc<Self>>> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = match instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
        {
            Ok(a) => a,
            Err(_) => return Ok(None),
        };
        let info = adapter.get_info();
        // Ask for the adapter's own limits: the default 128 MiB binding limit would not hold
        // larger embeddings on GPUs that allow more.
        let f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("boltccl-llm"),
                required_limits: adapter.limits(),
                required_features: if f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() },
                ..Default::default()
            })
            .await
            .context("requesting the GPU device")?;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("matvec"),
            source: wgpu::ShaderSource::Wgsl(MATVEC_WGSL.into()),
        });
        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let uniform = |binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("matvec"),
            entries: &[storage(0, true), storage(1, true), storage(2, false), uniform(3)],
        });
        let layout_mm = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("matmul"),
            entries: &[storage(0, true), storage(1, true), storage(2, false), uniform(3), uniform(4)],
        });
        let pipeline_layout = |layout: &wgpu::BindGroupLayout| {
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("matvec"),
                bind_group_layouts: &[Some(layout)],
                immediate_size: 0,
            })
        };
        let (pl, pl_mm) = (pipeline_layout(&layout), pipeline_layout(&layout_mm));
        let make_in = |pl: &wgpu::PipelineLayout, module: &wgpu::ShaderModule, entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(pl),
                module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        let make = |module: &wgpu::ShaderModule, entry: &str| make_in(&pl, module, entry);
        let make_mm = |module: &wgpu::ShaderModule, entry: &str| make_in(&pl_mm, module, entry);
        let pipeline = make(&module, "matvec");
        let mm_f32 = make_mm(&module, "matmul");
        let (pipeline_f16, mm_f16) = if f16 {
            let m = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("matvec_f16"),
                source: wgpu::ShaderSource::Wgsl(MATVEC_F16_WGSL.into()),
            });
            (Some(make(&m, "matvec")), Some(make_mm(&m, "matmul")))
        } else {
            (None, None)
        };
        let q = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("matvec_q"),
            source: wgpu::ShaderSource::Wgsl(MATVEC_Q_WGSL.into()),
        });
        let pipeline_q = ["matvec_q4_0", "matvec_q4_1", "matvec_q8_0"].map(|e| make(&q, e));
        let mm_q = ["matmul_q4_0", "matmul_q4_1", "matmul_q8_0"].map(|e| make_mm(&q, e));
        Ok(Some(Arc::new(Self {
            device,
            queue,
            pipeline,
            pipeline_f16,
            pipeline_q,
            layout,
            mm: MatmulPipelines { f32: mm_f32, f16: mm_f16, q: mm_q },
            layout_mm,
            adapter: format!("{} ({:?}, {})", info.name, info.backend, info.driver),
        })))
    }
}

/// A weight matrix resident on the GPU, with its own input/output/staging buffers (a rank uses
/// each matrix from one thread at a time, so per-matrix buffers need no locking).
pub struct GpuMat {
    ctx: Arc<GpuContext>,
    rows: usize,
    cols: usize,
    x: wgpu::Buffer,
    y: wgpu::Buffer,
    staging: wgpu::Buffer,
    bind: wgpu::BindGroup,
    grid: (u32, u32),
    kind: WeightKind,
    /// The weights and the shape uniform, which the batched products bind with other inputs
    /// and outputs ([`GpuMat::batch_bind`]).
    w: wgpu::Buffer,
    params: wgpu::Buffer,
}

impl std::fmt::Debug for GpuMat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuMat[{}x{}]", self.rows, self.cols)
    }
}

impl GpuMat {
    /// Uploads a row-major `[rows, cols]` matrix as f32.
    pub fn upload(ctx: &Arc<GpuContext>, rows: usize, cols: usize, data: &[f32]) -> Self {
        Self::upload_as(ctx, rows, cols, data, false).expect("f32 upload cannot fail")
    }

    /// Uploads a row-major `[rows, cols]` matrix, as f16 when `f16` (rounding each weight to
    /// the nearest half; products still accumulate in f32).
    pub fn upload_as(ctx: &Arc<GpuContext>, rows: usize, cols: usize, data: &[f32], f16: bool) -> anyhow::Result<Self> {
        assert!(rows > 0 && cols > 0, "empty matrices stay on the CPU");
        anyhow::ensure!(!f16 || ctx.supports_f16(), "this GPU adapter lacks shader-f16; use f32 weights");
        let bytes: Vec<u8> = if f16 {
            let mut b: Vec<u8> = data.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
            b.resize(b.len().div_ceil(4) * 4, 0); // buffers are sized in 4-byte units
            b
        } else {
            bytemuck::cast_slice(data).to_vec()
        };
        let kind = if f16 { WeightKind::F16 } else { WeightKind::F32 };
        Ok(Self::with_weights(ctx, rows, cols, &bytes, kind, 0))
    }

    /// Uploads rows `r` of a block-quantised matrix in its blocks (quants, then one word of
    /// f16 scale and minimum per block: the file's 20 bytes per 32 Q4_1 weights), for the
    /// shaders of matvec_q.wgsl to decode.
    pub fn upload_quant(ctx: &Arc<GpuContext>, q: &QuantRows, r: std::ops::Range<usize>) -> anyhow::Result<Self> {
        anyhow::ensure!(!r.is_empty() && r.end <= q.rows(), "rows {r:?} of {}", q.rows());
        let kind = match q.ty {
            GgmlType::Q4_0 => WeightKind::Q4_0,
            GgmlType::Q4_1 => WeightKind::Q4_1,
            GgmlType::Q8_0 => WeightKind::Q8_0,
            t => anyhow::bail!("{t:?} is not block-quantised"),
        };
        let (qs, d, m) = (q.qs_rows(r.clone()), q.d_rows(r.clone()), q.m_rows(r.clone()));
        let mut bytes = Vec::with_capacity(qs.len() + 4 * d.len());
        bytes.extend_from_slice(qs); // 16 or 32 bytes a block: whole words
        for (i, &di) in d.iter().enumerate() {
            let mi = m.get(i).copied().unwrap_or(0);
            bytes.extend_from_slice(&(di as u32 | (mi as u32) << 16).to_le_bytes());
        }
        let dm_offset = u32::try_from(qs.len() / 4).context("quants too large for one buffer")?;
        Ok(Self::with_weights(ctx, r.len(), q.cols, &bytes, kind, dm_offset))
    }

    /// The matrix with its weight buffer `bytes` and its own input/output/staging buffers.
    fn with_weights(ctx: &Arc<GpuContext>, rows: usize, cols: usize, bytes: &[u8], kind: WeightKind, dm: u32) -> Self {
        let d = &ctx.device;
        let w = d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("weights"),
            contents: bytes,
            usage: wgpu::BufferUsages::STORAGE,
        });
        let buf = |label, size: usize, usage| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (size * 4) as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        use wgpu::BufferUsages as U;
        let x = buf("x", cols, U::STORAGE | U::COPY_DST);
        let y = buf("y", rows, U::STORAGE | U::COPY_SRC);
        let staging = buf("staging", rows, U::MAP_READ | U::COPY_DST);
        let gx = (rows as u32).min(GRID_X);
        let gy = (rows as u32).div_ceil(GRID_X);
        let params = d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::cast_slice(&[rows as u32, cols as u32, gx, dm]),
            usage: U::UNIFORM,
        });
        let bind = d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("matvec"),
            layout: &ctx.layout,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: w.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: x.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: y.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: params.as_entire_binding() },
            ],
        });
        Self { ctx: ctx.clone(), rows, cols, x, y, staging, bind, grid: (gx, gy), kind, w, params }
    }

    /// Output rows (the length of `W · x`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// A bind group for the batched product `y[t] = W · x[t]` over the rows `x` (`[T][cols]`)
    /// into `y` (`[T][rows]`), T read from the uniform `batch` (`[T, 0, 0, 0]`).
    pub fn batch_bind(&self, x: &wgpu::Buffer, y: &wgpu::Buffer, batch: &wgpu::Buffer) -> BatchProduct {
        let bind = self.ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("matmul"),
            layout: &self.ctx.layout_mm,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: self.w.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: x.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: y.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: self.params.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 4, resource: batch.as_entire_binding() },
            ],
        });
        BatchProduct { bind, grid: self.grid, kind: self.kind }
    }

    /// `out[t] = W · x[t]` for the `t` rows of `x` (`[t][cols]`, `out` `[t][rows]`) with the
    /// batched kernel, in one submission: the product prefill runs, on its own.
    pub fn matmul(&self, x: &[f32], t: usize, out: &mut [f32]) -> anyhow::Result<()> {
        anyhow::ensure!(t > 0 && x.len() == t * self.cols, "matmul: {} inputs for {t} rows of {}", x.len(), self.cols);
        anyhow::ensure!(out.len() == t * self.rows, "matmul: {} outputs for {t} rows of {}", out.len(), self.rows);
        let d = &self.ctx.device;
        use wgpu::BufferUsages as U;
        let xb = d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("matmul x"),
            contents: bytemuck::cast_slice(x),
            usage: U::STORAGE,
        });
        let yb = d.create_buffer(&wgpu::BufferDescriptor {
            label: Some("matmul y"),
            size: (out.len() * 4) as u64,
            usage: U::STORAGE | U::COPY_SRC,
            mapped_at_creation: false,
        });
        let batch = batch_uniform(d, t)?;
        let p = self.batch_bind(&xb, &yb, &batch);
        let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            p.dispatch(&self.ctx, &mut pass, t)?;
        }
        read_back(&self.ctx, enc, &yb, out)
    }

    /// `out = W · x`, blocking until the result is back in host memory.
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) -> anyhow::Result<()> {
        matvec_many(&[self], x, &mut [out])
    }
}

/// A uniform holding `[t, 0, 0, 0]`, the batch's row count for the `matmul*` kernels.
pub fn batch_uniform(d: &wgpu::Device, t: usize) -> anyhow::Result<wgpu::Buffer> {
    let t = u32::try_from(t).context("batch too large")?;
    Ok(d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("batch"),
        contents: bytemuck::cast_slice(&[t, 0u32, 0, 0]),
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    }))
}

/// One matrix's batched product, bound to its input and output buffers
/// ([`GpuMat::batch_bind`]).
pub struct BatchProduct {
    bind: wgpu::BindGroup,
    grid: (u32, u32),
    kind: WeightKind,
}

impl BatchProduct {
    /// Records the product for `t` input rows: a grid row per weight row as in the matvec, and
    /// one grid layer (z) per tile of [`MATMUL_TILE`] input rows.
    pub fn dispatch(&self, ctx: &GpuContext, pass: &mut wgpu::ComputePass<'_>, t: usize) -> anyhow::Result<()> {
        let tiles = t.div_ceil(MATMUL_TILE) as u32;
        let max = ctx.device.limits().max_compute_workgroups_per_dimension;
        anyhow::ensure!(tiles <= max, "{t} rows make {tiles} tiles, over the device's {max} a dispatch");
        pass.set_pipeline(ctx.matmul_for(self.kind));
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.grid.0, self.grid.1, tiles);
        Ok(())
    }
}

/// Copies `src`'s first `out.len()` values to a staging buffer at the end of `enc`, submits,
/// waits and reads them into `out`.
pub(crate) fn read_back(
    ctx: &GpuContext,
    mut enc: wgpu::CommandEncoder,
    src: &wgpu::Buffer,
    out: &mut [f32],
) -> anyhow::Result<()> {
    let (d, q) = (&ctx.device, &ctx.queue);
    let bytes = (out.len() * 4) as u64;
    let staging = d.create_buffer(&wgpu::BufferDescriptor {
        label: Some("staging"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    enc.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
    q.submit([enc.finish()]);
    map_read(d, &staging, out)
}

/// Maps the first `out.len()` values of the staging buffer `staging` (its copy already
/// submitted), waits for them and copies them into `out`.
pub(crate) fn map_read(d: &wgpu::Device, staging: &wgpu::Buffer, out: &mut [f32]) -> anyhow::Result<()> {
    let slice = staging.slice(..(out.len() * 4) as u64);
    let (tx, rx) = mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    d.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| anyhow!("GPU poll failed: {e}"))?;
    rx.recv().context("GPU map callback dropped")?.map_err(|e| anyhow!("mapping the GPU result failed: {e}"))?;
    {
        let data = slice.get_mapped_range().map_err(|e| anyhow!("reading the GPU result failed: {e:?}"))?;
        out.copy_from_slice(bytemuck::cast_slice(&data));
    }
    staging.unmap();
    Ok(())
}

/// `outs[i] = mats[i] · x` for several matrices sharing one input (q/k/v, gate/up), in a single
/// submission and a single wait: one GPU round trip instead of one per matrix.
pub fn matvec_many(mats: &[&GpuMat], x: &[f32], outs: &mut [&mut [f32]]) -> anyhow::Result<()> {
    anyhow::ensure!(mats.len() == outs.len(), "matvec_many: {} matrices, {} outputs", mats.len(), outs.len());
    let Some(first) = mats.first() else {
        return Ok(());
    };
    let ctx = &first.ctx;
    for (m, o) in mats.iter().zip(outs.iter()) {
        anyhow::ensure!(Arc::ptr_eq(&m.ctx, ctx), "matrices live on different GPU devices");
        anyhow::ensure!(x.len() == m.cols && o.len() == m.rows, "matvec shape mismatch");
    }
    let (d, q) = (&ctx.device, &ctx.queue);
    for m in mats {
        q.write_buffer(&m.x, 0, bytemuck::cast_slice(x));
    }
    let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        for m in mats {
            pass.set_pipeline(ctx.pipeline_for(m.kind));
            pass.set_bind_group(0, &m.bind, &[]);
            pass.dispatch_workgroups(m.grid.0, m.grid.1, 1);
        }
    }
    for m in mats {
        enc.copy_buffer_to_buffer(&m.y, 0, &m.staging, 0, (m.rows * 4) as u64);
    }
    q.submit([enc.finish()]);
    let (tx, rx) = mpsc::channel();
    for (i, m) in mats.iter().enumerate() {
        let tx = tx.clone();
        m.staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send((i, r));
        });
    }
    drop(tx);
    d.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| anyhow!("GPU poll failed: {e}"))?;
    for _ in 0..mats.len() {
        let (_, r) = rx.recv().context("GPU map callback dropped")?;
        r.map_err(|e| anyhow!("mapping the GPU result failed: {e}"))?;
    }
    for (m, o) in mats.iter().zip(outs.iter_mut()) {
        {
            let data =
                m.staging.slice(..).get_mapped_range().map_err(|e| anyhow!("reading the GPU result failed: {e:?}"))?;
            o.copy_from_slice(bytemuck::cast_slice(&data));
        }
        m.staging.unmap();
    }
    Ok(())
}

/// Translates the WGSL kernels to Metal Shading Language with naga, the same translation wgpu
/// performs on a Mac. Lets Linux CI check that every kernel is valid for the Metal backend.
pub fn wgsl_to_msl(src: &str) -> anyhow::Result<String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| anyhow!("{}", e.emit_to_string(src)))?;
    // SHADER_FLOAT16 for the f16 kernel (wgpu enables it only when the device has it).
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::SHADER_FLOAT16)
            .validate(&module)
            .map_err(|e| anyhow!("WGSL validation: {e:?}"))?;
    let (msl, _) = naga::back::msl::write_string(
        &module,
        &info,
        &naga::back::msl::Options::default(),
        &naga::back::msl::PipelineOptions::default(),
    )
    .map_err(|e| anyhow!("MSL output: {e:?}"))?;
    Ok(msl)
}
