//! `boltccl-llm`: tensor-parallel decode of a Llama-family model, streaming from rank 0.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, ValueEnum};

use boltccl_llm::comm::{Comm, SingleRank, TimedComm};
use boltccl_llm::generate::{generate, GenOptions, GenOutput};
use boltccl_llm::loader::{self, Checkpoint, WeightSource};
use boltccl_llm::model::{LoadOptions, Model, WeightMode};
use boltccl_llm::sample::Sampler;
use boltccl_llm::shard::{MoeSplit, ShardPlan};
use boltccl_llm::tokenizer::{StreamDecoder, Tokenizer};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backend {
    Cpu,
    Gpu,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Moe {
    Tp,
    Ep,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Weights {
    Q8,
    Quant,
    F32,
}

/// Tensor-parallel LLM decode over boltccl's all_sum.
#[derive(Debug, Parser)]
#[command(
    version,
    after_help = "To serve the model over HTTP (OpenAI-compatible): boltccl-llm serve --model FILE [--host H] \
                  [--port N]; see boltccl-llm serve --help."
)]
struct Args {
    /// Model: a .gguf file, or a directory with config.json + *.safetensors.
    #[arg(long)]
    model: PathBuf,
    /// User prompt (wrapped in the model's chat template when it has one: ChatML or Llama 3's;
    /// another template is an error, see --raw).
    #[arg(long, default_value = "What is the capital of France? Answer in one sentence.")]
    prompt: String,
    /// Optional system message for the chat template.
    #[arg(long)]
    system: Option<String>,
    /// Feed the prompt verbatim, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Prompt as comma-separated token ids (for checkpoints without a tokenizer, e.g.
    /// safetensors); generated ids are then printed as numbers.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Maximum number of new tokens.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    /// With --backend gpu: store weights as f16 on the GPU (half the memory and traffic).
    #[arg(long)]
    gpu_f16: bool,
    /// With --backend gpu: most prompt tokens per prefill batch (capped by the GPU's buffer
    /// limits); 1 prefills token by token through the decode kernels.
    #[arg(long, default_value_t = boltccl_llm::GPU_PREFILL_BATCH)]
    gpu_prefill_batch: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass (with --temperature > 0).
    #[arg(long, default_value_t = 0.9)]
    top_p: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write rank 0's logits after the prompt (little-endian f32, vocab entries) to this file,
    /// for cross-checks such as tools/reference_logits.py.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
    /// Verify after every step that all ranks hold bit-identical replicated state.
    #[arg(long)]
    check_sync: bool,
    /// How Q8_0/Q4_0/Q4_1 GGUF weights are held and multiplied on the CPU: `q8` keeps the
    /// blocks and quantises each product's input to 8 bits (integer dot products, like
    /// llama.cpp); `quant` keeps the blocks with f32 inputs (f32 arithmetic, the GPU
    /// backend's); `f32` expands them at load (4-7x the memory).
    #[arg(long, value_enum, default_value_t = Weights::Q8)]
    weights: Weights,
    /// How a mixture-of-experts model (qwen3moe) splits its experts across ranks: `tp` gives
    /// every rank a column slice of every expert (one all_sum per layer, like the dense MLP);
    /// `ep` gives each rank whole experts and brings their outputs back with an all_to_all_v.
    #[arg(long, value_enum, default_value_t = Moe::Tp)]
    moe: Moe,
    /// CPU threads per rank for the matrix products and attention (default: every core this
    /// process may run on, or BOLTCCL_LLM_THREADS). With N ranks on one machine, give each
    /// rank its share of the cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Run N ranks as threads in this process (in-process stand-in for a boltccl group). With
    /// the `boltccl` feature, setting BOLTCCL_WORLD_SIZE etc. makes this process one rank of a
    /// real multi-process group instead.
    #[arg(long, default_value_t = 1)]
    local_ranks: usize,
}

fn prompt_ids(tok: Option<&Tokenizer>, chat_template: Option<&str>, args: &Args) -> anyhow::Result<Vec<u32>> {
    if let Some(ids) = &args.prompt_ids {
        return Ok(ids.clone());
    }
    let tok = tok.context("this checkpoint has no tokenizer: use a GGUF file, or pass --prompt-ids 1,2,3")?;
    let text = match (chat_template, args.raw) {
        (Some(t), false) => tok.chat_prompt(t, args.system.as_deref(), &args.prompt)?,
        _ => args.prompt.clone(),
    };
    let body = tok.encode(&text, true)?;
    let mut ids = Vec::new();
    // A template that prints BOS itself (Llama 3's) must not get a second one.
    if let (true, Some(bos)) = (tok.add_bos, tok.bos) {
        if body.first() != Some(&bos) {
            ids.push(bos);
        }
    }
    ids.extend(body);
    Ok(ids)
}

/// The GPU device shared by all in-process ranks, when `--backend gpu`.
#[cfg(feature = "gpu")]
type Gpu = Option<std::sync::Arc<boltccl_llm::gpu::GpuContext>>;
/// Without the `gpu` feature there is never a device.
#[cfg(not(feature = "gpu"))]
type Gpu = Option<std::convert::Infallible>;

fn open_gpu(backend: Backend) -> anyhow::Result<Gpu> {
    match backend {
        Backend::Cpu => Ok(None),
        #[cfg(feature = "gpu")]
        Backend::Gpu => {
            let ctx = boltccl_llm::gpu::GpuContext::new()?
                .context("no GPU adapter found (on Linux: apt-get install mesa-vulkan-drivers)")?;
            eprintln!("GPU: {}", ctx.adapter);
            Ok(Some(ctx))
        }
        #[cfg(not(feature = "gpu"))]
        Backend::Gpu => anyhow::bail!("this binary was built without the `gpu` feature; rebuild with --features gpu"),
    }
}

/// What a rank reports besides the generated tokens.
struct RankStats {
    /// Bytes of weights the shard holds on the CPU.
    weight_bytes: usize,
    /// Resident and peak resident MiB of the process, taken while the shard was loaded.
    resident: Option<(f64, f64)>,
}

/// One rank's whole run: load its shard, generate. `weights` is dropped once the shard is
/// loaded: when it was the last reference the file is unmapped, so the resident size shows
/// the shard alone.
fn run_rank(
    weights: Arc<dyn WeightSource>,
    comm: &TimedComm<impl Comm>,
    ids: &[u32],
    tok: Option<&Tokenizer>,
    args: &Args,
    gpu: &Gpu,
) -> anyhow::Result<(GenOutput, RankStats)> {
    let t = Instant::now();
    let src = weights.as_ref();
    let split = match args.moe {
        Moe::Tp => MoeSplit::Tp,
        Moe::Ep => MoeSplit::Ep,
    };
    let plan = ShardPlan::with_moe(src.config(), comm.rank(), comm.size(), split)?;
    let mode = match args.weights {
        Weights::Q8 => WeightMode::Q8,
        Weights::Quant => WeightMode::Quant,
        Weights::F32 => WeightMode::F32,
    };
    #[allow(unused_mut)] // mutated only by the GPU upload
    let mut model = Model::load_with(src, plan, LoadOptions { weights: mode })?;
    drop(weights);
    #[cfg(feature = "gpu")]
    if let Some(ctx) = gpu {
        model.upload_to_gpu(ctx, args.gpu_f16)?;
        model.set_gpu_prefill_rows(args.gpu_prefill_batch);
    }
    #[cfg(not(feature = "gpu"))]
    let _ = gpu;
    if comm.rank() == 0 {
        eprintln!(
            "[rank 0] loaded shard in {:.2}s (kv heads {:?}, q heads {:?}, ffn {:?} of {})",
            t.elapsed().as_secs_f64(),
            model.plan.kv_heads,
            model.plan.q_heads,
            model.plan.ffn,
            model.cfg.intermediate_size
        );
    }
    let mut sampler = Sampler::new(args.temperature, args.top_p, args.seed);
    let opts = GenOptions {
        max_tokens: args.max_tokens,
        stop_tokens: tok.map(Tokenizer::stop_tokens).unwrap_or_default(),
        record_logits: args.dump_logits.is_some(),
        check_sync: args.check_sync,
    };
    let mut dec = StreamDecoder::default();
    let mut stdout = std::io::stdout();
    let out = generate(&model, comm, ids, &mut sampler, &opts, |id| {
        let _ = match tok {
            Some(t) => write!(stdout, "{}", dec.push(t, id)),
            None => write!(stdout, "{id} "),
        };
        let _ = stdout.flush();
    })?;
    if let (Some(path), Some(first)) = (&args.dump_logits, out.logits.first()) {
        let bytes: Vec<u8> = first.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok((out, RankStats { weight_bytes: model.weight_bytes(), resident: resident_mib() }))
}

/// This process's resident and peak resident size in MiB (Linux: /proc/self/status).
fn resident_mib() -> Option<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse::<f64>().ok()
    };
    Some((kib("VmRSS:")? / 1024.0, kib("VmHWM:")? / 1024.0))
}

/// Every rank: gather the all_sum logs; rank 0: print the rates, where the time went, and its
/// memory.
fn report((out, stats): &(GenOutput, RankStats), comm: &TimedComm<impl Comm>) -> anyhow::Result<()> {
    let log = comm.log().calls();
    // Ranks run the same calls in lock-step, so rank 0's index of the first decode call holds
    // everywhere.
    let first = log.iter().position(|&(enter, _)| enter >= out.decode_start_ns).unwrap_or(log.len());
    let split = boltccl_llm::timing::gather_split(comm, &log, first)?;
    let Some((split, clock_bound)) = split else { return Ok(()) };
    let n_dec = out.tokens.len().saturating_sub(1);
    println!();
    eprintln!(
        "prefill: {} tokens in {:.3}s = {:.2} tok/s",
        out.prompt_tokens,
        out.prefill.as_secs_f64(),
        out.prompt_tokens as f64 / out.prefill.as_secs_f64()
    );
    // The first generated token comes from the prefill logits, so decode rate counts the
    // forward passes made after it.
    let decode = out.decode.as_secs_f64().max(1e-9);
    eprintln!("decode:  {} tokens in {:.3}s = {:.2} tok/s", n_dec, out.decode.as_secs_f64(), n_dec as f64 / decode);
    let pct = |ns: u64| 100.0 * ns as f64 * 1e-9 / decode;
    let total = split.waiting_ns + split.communicating_ns;
    eprintln!(
        "all_sum: {} calls in decode = {:.1}% of decode time on rank 0 (world size {}): {:.1}% communicating \
         (from the last rank's arrival), {:.1}% waiting for slower ranks; clocks aligned within {:.0} us",
        split.calls,
        pct(total),
        comm.size(),
        pct(split.communicating_ns),
        pct(split.waiting_ns),
        clock_bound as f64 / 1e3
    );
    let held = stats.weight_bytes as f64 / (1 << 20) as f64;
    match stats.resident {
        Some((rss, peak)) => eprintln!(
            "memory: rank 0 holds {held:.1} MiB of weights; process resident {rss:.1} MiB (peak {peak:.1} MiB)"
        ),
        None => eprintln!("memory: rank 0 holds {held:.1} MiB of weights"),
    }
    Ok(())
}

/// Errors (a file it cannot run, a bad flag) end the program with their message and its
/// causes on one line, not a debug dump or a backtrace.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    // This program owns its process: boltccl's warnings go to stderr (BOLTCCL_LOG filters).
    boltccl::log_to_stderr();
    // `boltccl-llm serve ...`: the HTTP server, with its own flags.
    if std::env::args_os().nth(1).is_some_and(|a| a == "serve") {
        let args = boltccl_llm::serve::ServeArgs::parse_from(std::env::args_os().skip(1));
        return boltccl_llm::serve::run(args);
    }
    let args = Args::parse();
    if let Some(n) = args.threads {
        anyhow::ensure!(n >= 1, "--threads must be at least 1");
        boltccl_llm::ops::par::set_threads(n);
    }
    let gpu = open_gpu(args.backend)?;
    anyhow::ensure!(args.local_ranks >= 1, "--local-ranks must be at least 1");
    let Checkpoint { weights, tokenizer, chat_template } = loader::open(&args.model)?;
    let weights: Arc<dyn WeightSource> = Arc::from(weights);
    let tok = tokenizer.as_ref();
    let ids = prompt_ids(tok, chat_template.as_deref(), &args)?;
    // Under a launcher the world size comes from the group (BOLTCCL_WORLD_SIZE), else from
    // --local-ranks.
    let world = std::env::var("BOLTCCL_WORLD_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(args.local_ranks);
    eprintln!("model: {:?}\nprompt: {} tokens, world size {world}", weights.config(), ids.len());
    // A process launched as one rank of a boltccl group (e.g. by `boltccl launch`).
    if std::env::var_os("BOLTCCL_WORLD_SIZE").is_some() {
        anyhow::ensure!(args.local_ranks == 1, "--local-ranks cannot be combined with a boltccl group");
        let comm = TimedComm::new(boltccl::init().context("joining the boltccl group")?);
        let out = run_rank(weights, &comm, &ids, tok, &args, &gpu)?;
        return report(&out, &comm);
    }
    if args.local_ranks == 1 {
        let comm = TimedComm::new(SingleRank);
        let out = run_rank(weights, &comm, &ids, tok, &args, &gpu)?;
        return report(&out, &comm);
    }
    let world = boltccl::Group::local_world(args.local_ranks);
    std::thread::scope(|s| {
        let handles: Vec<_> = world
            .into_iter()
            .map(|c| {
                let (weights, ids, args, gpu) = (weights.clone(), &ids, &args, &gpu);
                s.spawn(move || {
                    let comm = TimedComm::new(c);
                    let out = run_rank(weights, &comm, ids, tok, args, gpu)?;
                    report(&out, &comm)
                })
            })
            .collect();
        // The ranks hold the only other references: the file is unmapped once all have loaded.
        drop(weights);
        for h in handles {
            h.join().expect("rank thread panicked")?;
        }
        Ok(())
    })
}
