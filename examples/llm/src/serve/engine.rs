//! The cluster side of the server: the commands rank 0 broadcasts to the other ranks, the
//! decode loop every rank runs for a request, and rank 0's generation worker.
//!
//! Every rank runs the same collectives in the same order, so the followers must learn each
//! request (its prompt and sampling parameters) before it starts, and every decode step must
//! end the same way on every rank. Rank 0 broadcasts a fixed-size header (a [`Command`]) and,
//! for a generation, the prompt's token ids; the followers loop on [`recv_command`]. Whether to
//! stop is known to all ranks when it follows from the tokens (end of sequence, `max_tokens`);
//! when only rank 0 knows (the client went away, a stop sequence matched in the text), rank 0
//! broadcasts its decision after each token ([`run_job`]), so nobody waits for a step that
//! will not come. While no request is running rank 0 broadcasts [`Command::Idle`] every
//! [`heartbeat`], so a follower's wait never reaches the collective deadline, and a dead rank
//! is noticed between requests too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use tokio::sync::mpsc::UnboundedSender;

use crate::comm::Comm;
use crate::model::{KvCache, Model};
use crate::sample::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// First word of every header: a follower that reads anything else is out of step.
const MAGIC: u32 = 0xB017_5E27;
/// Words in a command header.
const HEADER: usize = 8;

/// Sampling and length of one generation (what every rank must know).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobParams {
    /// Largest number of tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass in [0, 1].
    pub top_p: f32,
    /// Sampling seed.
    pub seed: u64,
}

/// What rank 0 tells the other ranks to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Nothing to do (a heartbeat).
    Idle,
    /// Run one generation on this prompt.
    Generate {
        /// Prompt token ids.
        prompt: Vec<u32>,
        /// Its parameters.
        params: JobParams,
    },
    /// Leave the loop: the server is stopping.
    Shutdown,
    /// Form a larger group with a newcomer ([`super::join`]): `size` ranks, the new rank 0
    /// listening on the job coordinator's host at `port`, under the key of `generation`.
    Grow {
        /// The new group's size.
        size: usize,
        /// The new group's coordinator port.
        port: u16,
        /// The job's re-formation count.
        generation: u64,
    },
}

/// Rank 0: broadcasts `cmd` to every rank (the others receive it with [`recv_command`]).
pub fn send_command(comm: &dyn Comm, cmd: &Command) -> anyhow::Result<()> {
    let mut h = [0u32; HEADER];
    h[0] = MAGIC;
    match cmd {
        Command::Idle => h[1] = 0,
        Command::Shutdown => h[1] = 2,
        Command::Grow { size, port, generation } => {
            h[1] = 3;
            h[2] = u32::try_from(*size).context("group too large")?;
            h[3] = u32::from(*port);
            h[4] = *generation as u32;
            h[5] = (*generation >> 32) as u32;
        }
        Command::Generate { prompt, params } => {
            h[1] = 1;
            h[2] = u32::try_from(prompt.len()).context("prompt too long")?;
            h[3] = u32::try_from(params.max_tokens).context("max_tokens too large")?;
            h[4] = params.temperature.to_bits();
            h[5] = params.top_p.to_bits();
            h[6] = params.seed as u32;
            h[7] = (params.seed >> 32) as u32;
        }
    }
    comm.broadcast_u32(&mut h, 0).context("sending the next command to the other ranks")?;
    if let Command::Generate { prompt, .. } = cmd {
        let mut p = prompt.clone();
        comm.broadcast_u32(&mut p, 0).context("sending the prompt to the other ranks")?;
    }
    Ok(())
}

/// A follower: waits for rank 0's next command.
pub fn recv_command(comm: &dyn Comm) -> anyhow::Result<Command> {
    let mut h = [0u32; HEADER];
    comm.broadcast_u32(&mut h, 0).context("waiting for rank 0's next command")?;
    ensure!(
        h[0] == MAGIC,
        "rank {} is out of step with rank 0 (read {:#x} where a command was due)",
        comm.rank(),
        h[0]
    );
    match h[1] {
        0 => Ok(Command::Idle),
        2 => Ok(Command::Shutdown),
        3 => Ok(Command::Grow {
            size: h[2] as usize,
            port: u16::try_from(h[3]).context("a coordinator port out of range")?,
            generation: u64::from(h[4]) | (u64::from(h[5]) << 32),
        }),
        1 => {
            let mut prompt = vec![0u32; h[2] as usize];
            comm.broadcast_u32(&mut prompt, 0).context("receiving the prompt from rank 0")?;
            let params = JobParams {
                max_tokens: h[3] as usize,
                temperature: f32::from_bits(h[4]),
                top_p: f32::from_bits(h[5]),
                seed: u64::from(h[6]) | (u64::from(h[7]) << 32),
            };
            Ok(Command::Generate { prompt, params })
        }
        c => anyhow::bail!("unknown command {c} from rank 0"),
    }
}

/// Why a generation ended, as every rank sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The model chose its end-of-sequence token (not counted, not emitted).
    Eos,
    /// `max_tokens` were generated.
    MaxTokens,
    /// Rank 0's callback said stop (a stop sequence, or nobody is listening any more).
    Root,
}

/// Result of [`run_job`].
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    /// The generated ids (without the end-of-sequence token).
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub end: End,
}

/// Every rank: one generation in lock-step (prefill, then decode), the same steps as
/// [`crate::generate::generate`] and so the same tokens. On rank 0, `on_token` is called with
/// each token as soon as it is chosen and answers whether to go on; rank 0 broadcasts that
/// answer before each further step, so every rank stops at the same one. The callback is never
/// called on the other ranks.
pub fn run_job(
    model: &Model,
    comm: &dyn Comm,
    prompt: &[u32],
    params: &JobParams,
    stop: &[u32],
    mut on_token: impl FnMut(u32) -> bool,
) -> anyhow::Result<JobOutcome> {
    ensure!(!prompt.is_empty(), "empty prompt");
    ensure!(params.max_tokens >= 1, "max_tokens must be at least 1");
    let root = comm.rank() == 0;
    let mut sampler = Sampler::new(params.temperature, params.top_p, params.seed);
    let mut cache = model.new_cache();
    let mut tok = next_token(model, comm, &mut sampler, prompt, &mut cache)?;
    let mut tokens = Vec::new();
    for i in 0..params.max_tokens {
        if stop.contains(&tok) {
            return Ok(JobOutcome { tokens, end: End::Eos });
        }
        tokens.push(tok);
        let go = !root || on_token(tok);
        if i + 1 == params.max_tokens {
            let end = if go { End::MaxTokens } else { End::Root };
            return Ok(JobOutcome { tokens, end });
        }
        let mut decision = [u32::from(go)];
        comm.broadcast_u32(&mut decision, 0).context("agreeing whether to go on")?;
        if decision[0] == 0 {
            return Ok(JobOutcome { tokens, end: End::Root });
        }
        tok = next_token(model, comm, &mut sampler, &[tok], &mut cache)?;
    }
    unreachable!("the loop returns at its last step")
}

/// A forward pass over `tokens`, then the next token, the same on every rank: chosen together
/// when greedy, else sampled on rank 0 and broadcast (as [`crate::generate::generate`] does).
fn next_token(
    model: &Model,
    comm: &dyn Comm,
    sampler: &mut Sampler,
    tokens: &[u32],
    cache: &mut KvCache,
) -> anyhow::Result<u32> {
    if sampler.is_greedy() {
        return model.forward_greedy(tokens, cache, comm);
    }
    let logits = model.forward_batch(tokens, cache, comm, true)?;
    let mut tok = [0u32];
    if let Some(l) = logits {
        tok[0] = sampler.pick(&l);
    }
    comm.broadcast_u32(&mut tok, 0)?;
    Ok(tok[0])
}

/// A follower: run what rank 0 says until it says stop, or to grow the group (which the
/// caller does: the returned command).
pub fn follow(model: &Model, comm: &dyn Comm, stop: &[u32]) -> anyhow::Result<Command> {
    loop {
        match recv_command(comm)? {
            Command::Idle => {}
            Command::Generate { prompt, params } => {
                run_job(model, comm, &prompt, &params, stop, |_| true)?;
            }
            other => return Ok(other),
        }
    }
}

/// What the worker tells the HTTP side about one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// More text (never empty).
    Text(String),
    /// The generation ended normally.
    Done {
        /// OpenAI's `finish_reason`: `"stop"` or `"length"`.
        finish_reason: &'static str,
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Tokens generated.
        completion_tokens: usize,
    },
    /// The cluster failed during this request; the server is stopping.
    Error(String),
    /// A rank was lost during this request and the others healed: the message says which and
    /// how many are left. The request may be sent again.
    Lost(String),
}

/// One queued request, as the HTTP side hands it to the worker.
#[derive(Debug)]
pub struct Job {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling and length.
    pub params: JobParams,
    /// Stop sequences: the text ends before the first one found (not included).
    pub stop: Vec<String>,
    /// Where the text goes; when its receiver is dropped (the client went away) the
    /// generation stops at the next token.
    pub events: UnboundedSender<Event>,
}

/// How often an idle rank 0 tells the others it is still there: well inside the collective
/// deadline (`BOLTCCL_TIMEOUT_MS`, 30 s unless set), at most once a second.
pub fn heartbeat() -> Duration {
    let deadline_ms = std::env::var("BOLTCCL_TIMEOUT_MS").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(30_000);
    Duration::from_millis((deadline_ms / 4).clamp(10, 1000))
}

/// Why [`lead`] stopped early: a failed cluster (a rank died or fell out of step).
#[derive(Debug)]
pub struct Failure {
    /// What failed.
    pub error: anyhow::Error,
    /// The request it broke, not yet told (`None` when it failed between requests).
    pub job: Option<Job>,
}

impl Failure {
    fn idle(error: anyhow::Error) -> Self {
        Failure { error, job: None }
    }
}

/// Why [`lead`] returned without a failure.
pub enum Led {
    /// The others were told to shut down.
    Shutdown,
    /// A newcomer asks to join: the caller grows the group (nothing was sent yet).
    Join(super::join::Request),
}

/// Rank 0's generation worker: takes jobs from the queue one at a time and runs them on every
/// rank; heartbeats while idle; tells the others to shut down when the queue closes, or, with
/// `closing` set, as soon as the queue is empty. Between two jobs it returns a newcomer's
/// request to join, from `joins`. A failure returns the error and the request it broke, for
/// the caller to tell once it knows whether the cluster healed; the queue is left as it is.
/// `served` numbers the requests in the log, across calls.
pub fn lead(
    model: &Model,
    comm: &dyn Comm,
    tok: &Tokenizer,
    jobs: &Receiver<Job>,
    joins: &Receiver<super::join::Request>,
    closing: &AtomicBool,
    served: &mut u64,
) -> Result<Led, Failure> {
    let beat = heartbeat();
    loop {
        if let Ok(join) = joins.try_recv() {
            return Ok(Led::Join(join));
        }
        let job = match jobs.recv_timeout(beat) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) if closing.load(Ordering::Relaxed) => {
                return send_command(comm, &Command::Shutdown).map(|()| Led::Shutdown).map_err(Failure::idle)
            }
            Err(RecvTimeoutError::Timeout) => {
                send_command(comm, &Command::Idle).map_err(Failure::idle)?;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                return send_command(comm, &Command::Shutdown).map(|()| Led::Shutdown).map_err(Failure::idle)
            }
        };
        if job.events.is_closed() {
            continue; // the client left while queued
        }
        *served += 1;
        if let Err(error) = run_one(model, comm, tok, &job, *served) {
            return Err(Failure { error, job: Some(job) });
        }
    }
}

/// Rank 0: one request, start to end.
fn run_one(model: &Model, comm: &dyn Comm, tok: &Tokenizer, job: &Job, n: u64) -> anyhow::Result<()> {
    let t0 = Instant::now();
    send_command(comm, &Command::Generate { prompt: job.prompt.clone(), params: job.params })?;
    let mut dec = StreamDecoder::default();
    let mut stop = StopMatcher::new(job.stop.clone());
    let mut matched = false;
    let mut first: Option<Duration> = None;
    let out = run_job(model, comm, &job.prompt, &job.params, &tok.stop_tokens(), |id| {
        first.get_or_insert_with(|| t0.elapsed());
        let (text, hit) = stop.push(&dec.push(tok, id));
        if !text.is_empty() {
            let _ = job.events.send(Event::Text(text));
        }
        matched |= hit;
        !hit && !job.events.is_closed()
    })?;
    if !matched {
        let rest = stop.finish();
        if !rest.is_empty() {
            let _ = job.events.send(Event::Text(rest));
        }
    }
    let gone = out.end == End::Root && !matched;
    let finish_reason = if matched || out.end == End::Eos { "stop" } else { "length" };
    let _ = job.events.send(Event::Done {
        finish_reason,
        prompt_tokens: job.prompt.len(),
        completion_tokens: out.tokens.len(),
    });
    let total = t0.elapsed().as_secs_f64();
    let first = first.unwrap_or_default().as_secs_f64();
    let rate = out.tokens.len().saturating_sub(1) as f64 / (total - first).max(1e-9);
    crate::serve::log(&format!(
        "request {n}: {} prompt tokens, {} generated ({}), first token {:.0} ms, {rate:.1} tok/s after it",
        job.prompt.len(),
        out.tokens.len(),
        if gone { "client gone: stopped" } else { finish_reason },
        first * 1e3,
    ));
    Ok(())
}

/// Cuts generated text at the first of a few stop sequences, holding back text that may be the
/// start of one until it is decided, so that a stream never shows a stop sequence's beginning.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Matches these sequences (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Adds generated text. Returns the text that can be shown now, and whether a stop sequence
    /// was found (the returned text then ends just before it, and nothing more should be added).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep = self.stops.iter().map(|s| partial_suffix(&self.held, s)).max().unwrap_or(0);
        let out: String = self.held.drain(..self.held.len() - keep).collect();
        (out, false)
    }

    /// The text still held back, at the end of the generation (no stop sequence came).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
fn partial_suffix(text: &str, stop: &str) -> usize {
    let most = text.len().min(stop.len().saturating_sub(1));
    (1..=most)
        .rev()
        .find(|&k| text.is_char_boundary(text.len() - k) && stop.starts_with(&text[text.len() - k..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut shown = Vec::new();
        for p in pieces {
            let (t, hit) = m.push(p);
            shown.push(t);
            if hit {
                return (shown, true, String::new());
            }
        }
        (shown, false, m.finish())
    }

    #[test]
    fn stop_sequences_cut_the_text_and_hold_back_their_beginnings() {
        // Split across pieces: "\n\n" arrives one newline at a time.
        let (shown, hit, _) = feed(&["\n\n"], &["Paris.", "\n", "\nMore"]);
        assert!(hit);
        assert_eq!(shown, ["Paris.", "", ""]);
        // A false start is released once it cannot be a stop sequence.
        let (shown, hit, rest) = feed(&["END"], &["a E", "Nx", " EN"]);
        assert!(!hit);
        assert_eq!((shown, rest), (vec!["a ".to_string(), "ENx".into(), " ".into()], "EN".to_string()));
        // The earliest of several wins; text before it is kept.
        let (shown, hit, _) = feed(&["cd", "b"], &["abcd"]);
        assert!(hit);
        assert_eq!(shown, ["a"]);
        // No stops: everything passes at once; multi-byte characters are never split.
        assert_eq!(feed(&[], &["é", "x"]).0, ["é", "x"]);
        let (shown, hit, rest) = feed(&["éa"], &["xé", "b"]);
        assert!(!hit);
        assert_eq!((shown, rest), (vec!["x".to_string(), "éb".to_string()], String::new()));
    }

    #[test]
    fn commands_round_trip() {
        let gen = Command::Generate {
            prompt: vec![1, 2, 3],
            params: JobParams { max_tokens: 7, temperature: 0.5, top_p: 0.9, seed: u64::MAX - 5 },
        };
        let tape = Tape::default();
        for cmd in [Command::Idle, gen, Command::Shutdown, Command::Grow { size: 3, port: 40123, generation: 1 << 33 }]
        {
            send_command(&tape.at(0), &cmd).unwrap();
            assert_eq!(recv_command(&tape.at(1)).unwrap(), cmd);
        }
        tape.0.lock().unwrap().push_back(vec![7; HEADER]);
        let bad = recv_command(&tape.at(1)).unwrap_err();
        assert!(format!("{bad:#}").contains("out of step"), "{bad:#}");
    }

    /// Broadcasts on a tape: rank 0's are recorded, rank 1's play them back in order.
    #[derive(Default)]
    struct Tape(std::sync::Mutex<std::collections::VecDeque<Vec<u32>>>);

    struct OnTape<'a>(&'a Tape, usize);

    impl Tape {
        fn at(&self, rank: usize) -> OnTape<'_> {
            OnTape(self, rank)
        }
    }

    impl Comm for OnTape<'_> {
        fn rank(&self) -> usize {
            self.1
        }
        fn size(&self) -> usize {
            2
        }
        fn all_sum(&self, _x: &mut [f32]) -> anyhow::Result<()> {
            anyhow::bail!("not used")
        }
        fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
            let mut tape = self.0 .0.lock().unwrap();
            if self.1 == root {
                tape.push_back(x.to_vec());
                return Ok(());
            }
            let next = tape.pop_front().context("nothing was sent")?;
            ensure!(next.len() == x.len(), "length mismatch");
            x.copy_from_slice(&next);
            Ok(())
        }
        fn all_gather_u64(&self, _mine: &[u64]) -> anyhow::Result<Vec<u64>> {
            anyhow::bail!("not used")
        }
    }
}
