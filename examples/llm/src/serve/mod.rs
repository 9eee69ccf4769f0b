//! `boltccl-llm serve`: an OpenAI-compatible HTTP server for the tensor-parallel model.
//!
//! Every rank loads its shard. Rank 0 serves HTTP (`/v1/models`, `/v1/completions`,
//! `/v1/chat/completions`, streaming by server-sent events or not) and runs one generation
//! worker that takes queued requests one at a time; the other ranks follow it
//! ([`engine::follow`]). See [`engine`] for how they stay in step.
//!
//! Failures: a bad request gets a 4xx in OpenAI's error shape and changes nothing; a full
//! queue a 429. A rank that dies breaks the request under way (503, naming it), and the
//! survivors heal ([`heal`]): they shrink the group to themselves, cut new shards from the
//! mapped file, and serve the next requests at the smaller size. When healing is off
//! (`--no-heal`) or fails, or the failure is not a lost rank, the request it broke and every
//! one after get a 5xx and the server stops with a non-zero status; when rank 0 dies, the
//! others leave. A replacement started with `--join` brings the group back to its size
//! ([`join`]). SIGTERM or ctrl-c stop it gracefully: no new connections, the requests under
//! way finish, then the other ranks are told to stop.

pub mod api;
pub mod chat;
pub mod engine;
pub mod heal;
pub mod http;
pub mod join;

use std::io::Write;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use crate::comm::SingleRank;
use crate::loader::{self, Checkpoint};
use chat::ChatTemplate;
use heal::{Cluster, Link};

/// How long rank 0 lets the requests under way finish after SIGTERM or ctrl-c.
const DRAIN: Duration = Duration::from_secs(60);
/// How long a follower that got SIGTERM or ctrl-c waits for rank 0's word before leaving.
const FOLLOWER_GRACE: Duration = Duration::from_secs(DRAIN.as_secs() + 15);

/// `boltccl-llm serve`: an OpenAI-compatible server (start it under `boltccl launch -n N` for
/// tensor parallelism: rank 0 serves, the others follow).
#[derive(Debug, Parser)]
#[command(name = "boltccl-llm serve")]
pub struct ServeArgs {
    /// The model: a .gguf file (with its tokenizer and chat template).
    #[arg(long)]
    pub model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model's id in the API (default: the file name without `.gguf`).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Requests that may wait while one runs; more are answered 429.
    #[arg(long, default_value_t = 16)]
    pub max_queue: usize,
    /// A Jinja chat template file, instead of the model's own `tokenizer.chat_template`.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Largest prompt + generation in tokens (default: the model's context length).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// CPU threads per rank (default: every core this process may run on).
    #[arg(long)]
    pub threads: Option<usize>,
    /// When a rank dies, stop the server (exit 1) instead of healing: by default the ranks
    /// still there shrink the group to themselves, re-shard the model, and serve on.
    #[arg(long)]
    pub no_heal: bool,
    /// Join a running server as a replacement rank: rank 0's address (`http://HOST:PORT`).
    /// Needs the job's `BOLTCCL_JOB_KEY`; the group grows by this rank and every rank re-shards.
    #[arg(long, value_name = "URL")]
    pub join: Option<String>,
}

/// A line on stderr, ignoring a closed stderr (the launcher relaying it may have gone first).
pub fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "[serve] {line}");
}

/// Runs `serve` on this rank: rank 0 serves until SIGTERM or ctrl-c (or a failed cluster,
/// an error), the others follow it.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if let Some(n) = args.threads {
        anyhow::ensure!(n >= 1, "--threads must be at least 1");
        crate::ops::par::set_threads(n);
    }
    anyhow::ensure!(args.max_queue >= 1, "--max-queue must be at least 1");
    let Checkpoint { weights, tokenizer, chat_template } = loader::open(&args.model)?;
    let tok = Arc::new(tokenizer.context("serve needs a tokenizer: give it a GGUF file, which carries one")?);
    let heal = !args.no_heal;
    if let Some(url) = &args.join {
        return join_and_follow(url, weights, &tok.stop_tokens(), heal);
    }
    let link = if std::env::var_os("BOLTCCL_WORLD_SIZE").is_some() {
        Link::Group(boltccl::init().context("joining the boltccl group")?)
    } else {
        Link::Single(SingleRank)
    };
    let cfg = weights.config().clone();
    // The mapped file stays open: a heal cuts new shards from it.
    let mut cluster = Cluster::new(weights, link)?;
    if cluster.comm().rank() != 0 {
        leave_after_signal_unless_told();
        let me = cluster.first_rank();
        return follow(&mut cluster, &tok.stop_tokens(), heal).with_context(|| format!("rank {me} following rank 0"));
    }

    let template = match &args.chat_template {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?),
        None => chat_template,
    };
    let text = |id: Option<u32>| id.map(|i| tok.decode(&[i], true)).unwrap_or_default();
    let template = match template {
        None => Err(format!(
            "{} has no chat template (tokenizer.chat_template): use /v1/completions, or start the server with \
             --chat-template FILE",
            args.model.display()
        )),
        Some(src) => match ChatTemplate::new(&src, text(tok.bos), text(tok.eos)) {
            Ok(t) => Ok(t),
            Err(e) if args.chat_template.is_some() => return Err(e),
            Err(e) => Err(format!("{e:#}; start the server with --chat-template FILE")),
        },
    };
    if let Err(why) = &template {
        log(&format!("chat completions are off: {why}"));
    }
    let context = args.ctx_size.map_or(cfg.max_seq_len, |c| c.min(cfg.max_seq_len));
    anyhow::ensure!(context >= 2, "the context must hold at least 2 tokens");
    let model_id = args.model_name.clone().unwrap_or_else(|| {
        let name = args.model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        name.strip_suffix(".gguf").unwrap_or(&name).to_string()
    });

    let addr = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .with_context(|| format!("resolving --host {}", args.host))?
        .next()
        .with_context(|| format!("--host {} has no address", args.host))?;
    let listener = std::net::TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let (jobs, queue) = std::sync::mpsc::sync_channel(args.max_queue);
    let (joins, join_queue) = std::sync::mpsc::sync_channel(1);
    let join_proof = cluster.group().and_then(|g| g.config().job_key.as_deref().map(join::proof));
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let shared = Arc::new(http::Shared {
        model_id: model_id.clone(),
        created,
        context,
        tok: tok.clone(),
        template,
        jobs,
        fatal: Mutex::new(None),
        next_id: AtomicU64::new(1),
        joins,
        join_proof,
    });
    // Set by the worker when the cluster fails; by the HTTP side when it has stopped.
    let (failed, mut failed_rx) = tokio::sync::watch::channel(false);
    let closing = AtomicBool::new(false);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;

    let size = cluster.comm().size();
    std::thread::scope(|s| {
        let (tok, shared_w, closing) = (&tok, shared.clone(), &closing);
        let worker = s.spawn(move || {
            let (mut served, mut generation) = (0, 0);
            let r = loop {
                let led = engine::lead(cluster.model(), cluster.comm(), tok, &queue, &join_queue, closing, &mut served);
                let f = match led {
                    Ok(engine::Led::Shutdown) => break Ok(()),
                    Ok(engine::Led::Join(req)) => match admit(&mut cluster, req, &mut generation) {
                        Ok(()) => continue,
                        Err(error) => engine::Failure { error, job: None },
                    },
                    Err(f) => f,
                };
                match heal_lead(&mut cluster, f.error, f.job.as_ref(), heal) {
                    Ok(()) => continue,
                    Err(e) => {
                        if let Some(job) = f.job {
                            let _ = job.events.send(engine::Event::Error(format!("{e:#}")));
                        }
                        break Err(e);
                    }
                }
            };
            if let Err(e) = &r {
                let why = format!("the cluster failed: {e:#}");
                log(&why);
                *shared_w.fatal.lock().unwrap() = Some(why.clone());
                // Whoever is still queued hears why instead of waiting.
                while let Ok(job) = queue.try_recv() {
                    let _ = job.events.send(engine::Event::Error(why.clone()));
                }
                let _ = failed.send(true);
            }
            r
        });
        let served = rt.block_on(async {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            log(&format!(
                "listening on http://{local} (model `{model_id}`, tensor-parallel over {} rank{}, context {context})",
                size,
                if size == 1 { "" } else { "s" }
            ));
            let (stopping, mut stopping_rx) = tokio::sync::watch::channel(false);
            let stop = async move {
                tokio::select! {
                    _ = wait_for_signal() => {
                        log("stopping: no new requests; those under way finish (signal again to stop at once)");
                        tokio::spawn(async {
                            wait_for_signal().await;
                            log("stopped at once");
                            std::process::exit(130);
                        });
                    }
                    _ = failed_rx.wait_for(|f| *f) => {}
                }
                let _ = stopping.send(true);
            };
            let server = axum::serve(listener, http::router(shared.clone())).with_graceful_shutdown(stop);
            tokio::select! {
                r = server => r.context("the HTTP server failed"),
                // A stream that never ends must not hold the shutdown forever.
                _ = async { let _ = stopping_rx.wait_for(|s| *s).await; tokio::time::sleep(DRAIN).await } => {
                    log(&format!("requests still under way after {} s: dropped", DRAIN.as_secs()));
                    Ok(())
                }
            }
        });
        // Whatever is left of the connections goes with the runtime; the worker runs out the
        // queue (requests whose client has gone are skipped), then tells the others to stop.
        drop(rt);
        drop(shared);
        closing.store(true, Ordering::Relaxed);
        let worked = worker.join().map_err(|_| anyhow::anyhow!("the generation worker panicked"))?;
        worked.context("serving")?;
        served?;
        log("stopped; the other ranks were told to stop");
        Ok(())
    })
}

/// Rank 0, after its worker failed with `e` during `job` (or between requests): heal when
/// `heal` is on and `e` is a lost rank, telling `job` which rank was lost and that it may be
/// sent again, else (or when the heal fails) the error to stop on.
fn heal_lead(cluster: &mut Cluster, e: anyhow::Error, job: Option<&engine::Job>, heal: bool) -> anyhow::Result<()> {
    if !heal || heal::blamed(&e).is_none() {
        return Err(e);
    }
    let before = cluster.comm().size();
    log(&format!("a rank was lost ({e:#}); healing"));
    let lost = cluster.shrink(&e)?;
    let plural = if lost.size == 1 { "" } else { "s" };
    if let Some(job) = job {
        let why = format!(
            "generation failed: {} of the {before} ranks {} lost during this request; the cluster healed to {} \
             rank{plural}, which {} the next requests: send this one again",
            lost.names(),
            if lost.ranks.len() == 1 { "was" } else { "were" },
            lost.size,
            if lost.size == 1 { "serves" } else { "serve" }
        );
        let _ = job.events.send(engine::Event::Lost(why));
    }
    let cut = cluster.reshard()?;
    log(&format!(
        "healed: {} lost, serving on {} rank{plural} (shrink {:.0} ms, re-shard {:.0} ms)",
        lost.names(),
        lost.size,
        lost.took.as_secs_f64() * 1e3,
        cut.as_secs_f64() * 1e3
    ));
    Ok(())
}

/// Rank 0, with a newcomer's request: tells the followers to grow, answers the newcomer with
/// its ticket, grows. A grow that does not happen (the newcomer never came) is logged and the
/// server goes on at its size; an error is a failed cluster (the old group broke).
fn admit(cluster: &mut Cluster, req: join::Request, generation: &mut u64) -> anyhow::Result<()> {
    let Some(g) = cluster.group() else {
        let _ = req.reply.send(Err("this server runs without a boltccl group".into()));
        return Ok(());
    };
    let (port, coordinator) = match join::free_port(g).and_then(|p| Ok((p, join::coordinator_at(g, p)?))) {
        Ok(found) => found,
        Err(e) => {
            let _ = req.reply.send(Err(format!("{e:#}")));
            return Ok(());
        }
    };
    let key = g.config().job_key.clone().context("the job has no key")?;
    let size = g.size() + 1;
    *generation += 1;
    engine::send_command(cluster.comm(), &engine::Command::Grow { size, port, generation: *generation })?;
    let id = cluster.next_id();
    let ticket = join::Ticket { rank: size - 1, size, coordinator: coordinator.clone(), generation: *generation, id };
    let _ = req.reply.send(Ok(ticket));
    log(&format!("rank {id} is joining as rank {} of {size}", size - 1));
    let t = Instant::now();
    match cluster.grow(size, &coordinator, &join::generation_key(&key, *generation))? {
        Ok(took) => log(&format!(
            "grew: rank {id} joined, serving on {size} ranks (grow {:.0} ms, with the re-shard {:.0} ms)",
            took.as_secs_f64() * 1e3,
            t.elapsed().as_secs_f64() * 1e3
        )),
        Err(why) => log(&format!("rank {id} did not join ({why}); serving on {} ranks", size - 1)),
    }
    Ok(())
}

/// A newcomer: asks rank 0 at `url` for a ticket, forms the grown group, loads its shard and
/// follows.
fn join_and_follow(
    url: &str,
    weights: Box<dyn crate::loader::WeightSource>,
    stop: &[u32],
    heal: bool,
) -> anyhow::Result<()> {
    let key = std::env::var("BOLTCCL_JOB_KEY").context("--join needs the job's BOLTCCL_JOB_KEY")?;
    let ticket = join::ask(url, &key)?;
    let mut cfg = boltccl::Config::from_env().context("reading the boltccl settings")?;
    cfg.rank = ticket.rank;
    cfg.world_size = ticket.size;
    cfg.coordinator = Some(ticket.coordinator.clone());
    cfg.job_key = Some(join::generation_key(&key, ticket.generation));
    let group = boltccl::Group::new(cfg).context("forming the grown group")?;
    let mut cluster = Cluster::join(weights, group, ticket.id)?;
    log(&format!("rank {}: joined as rank {} of {}", ticket.id, ticket.rank, ticket.size));
    leave_after_signal_unless_told();
    follow(&mut cluster, stop, heal).with_context(|| format!("rank {} following rank 0", ticket.id))
}

/// A follower's life: follow rank 0; when a rank is lost, heal (unless `heal` is off) and
/// follow on in the smaller group; grow when rank 0 says so.
fn follow(cluster: &mut Cluster, stop: &[u32], heal: bool) -> anyhow::Result<()> {
    loop {
        let e = match engine::follow(cluster.model(), cluster.comm(), stop) {
            Ok(engine::Command::Grow { size, port, generation }) => {
                grow_follower(cluster, size, port, generation)?;
                continue;
            }
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if !heal || heal::blamed(&e).is_none() {
            return Err(e);
        }
        log(&format!("rank {}: a rank was lost ({e:#}); healing", cluster.first_rank()));
        let lost = cluster.shrink(&e)?;
        let cut = cluster.reshard()?;
        log(&format!(
            "rank {}: healed, {} lost; now rank {} of {} (shrink {:.0} ms, re-shard {:.0} ms)",
            cluster.first_rank(),
            lost.names(),
            cluster.comm().rank(),
            lost.size,
            lost.took.as_secs_f64() * 1e3,
            cut.as_secs_f64() * 1e3
        ));
    }
}

/// A follower told to grow: the new group's rank 0 listens on the job coordinator's host.
fn grow_follower(cluster: &mut Cluster, size: usize, port: u16, generation: u64) -> anyhow::Result<()> {
    let g = cluster.group().context("a follower without a group")?;
    let coordinator = join::coordinator_at(g, port)?;
    let key = g.config().job_key.clone().context("the job has no key")?;
    let me = cluster.first_rank();
    match cluster.grow(size, &coordinator, &join::generation_key(&key, generation))? {
        Ok(_) => log(&format!("rank {me}: grew; now rank {} of {size}", cluster.comm().rank())),
        Err(why) => log(&format!("rank {me}: the grow to {size} did not happen ({why})")),
    }
    Ok(())
}

/// Resolves on SIGTERM or ctrl-c.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A follower that gets SIGTERM or ctrl-c (as every rank of a launcher's job does on ctrl-c)
/// keeps following, so that rank 0 can finish the requests under way and say stop; if rank 0
/// has not done so within [`FOLLOWER_GRACE`], it leaves.
fn leave_after_signal_unless_told() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        rt.block_on(async {
            wait_for_signal().await;
            tokio::time::sleep(FOLLOWER_GRACE).await;
        });
        log("signalled, and rank 0 did not say stop in time: leaving");
        std::process::exit(1);
    });
}
