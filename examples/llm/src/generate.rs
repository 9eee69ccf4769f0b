//! The decode loop every rank runs in lock-step.

use std::time::{Duration, Instant};

use crate::comm::Comm;
use crate::model::{KvCache, Model};
use crate::sample::Sampler;

/// What to generate.
pub struct GenOptions {
    /// Maximum new tokens.
    pub max_tokens: usize,
    /// Stop when one of these tokens is chosen (it is not emitted): EOS and the end-of-turn
    /// tokens ([`crate::tokenizer::Tokenizer::stop_tokens`]).
    pub stop_tokens: Vec<u32>,
    /// Keep every step's logits (rank 0, the only rank that holds them all), for tests.
    pub record_logits: bool,
    /// After every forward pass, compare the residual-stream fingerprint of every rank with
    /// rank 0's (one extra tiny broadcast) and fail on the first difference, instead of
    /// letting ranks silently compute with different states.
    pub check_sync: bool,
}

/// Fails if this rank's replicated state differs from rank 0's.
fn check_sync(comm: &dyn Comm, fingerprint: u32, step: usize) -> anyhow::Result<()> {
    let mut f = [fingerprint];
    comm.broadcast_u32(&mut f, 0)?;
    anyhow::ensure!(
        f[0] == fingerprint,
        "rank {} diverged from rank 0 at step {step}: the all_sum results were not bitwise \
         identical on all ranks",
        comm.rank()
    );
    Ok(())
}

/// Result of [`generate`].
#[derive(Debug, Default)]
pub struct GenOutput {
    /// Generated ids (identical on every rank thanks to the broadcast).
    pub tokens: Vec<u32>,
    /// Logits used to choose each token (rank 0, when requested).
    pub logits: Vec<Vec<f32>>,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Time to run the prompt through the model.
    pub prefill: Duration,
    /// Time from the first generated token to the last.
    pub decode: Duration,
    /// When decoding began, on this host's wall clock in ns ([`crate::timing::now_ns`]).
    pub decode_start_ns: u64,
}

/// Runs prefill on `prompt` and then up to `opts.max_tokens` decode steps. Every rank must call
/// this with the same prompt and options. Greedy decoding (unless logits are recorded) chooses
/// each token on every rank at once ([`Model::forward_greedy`]); otherwise every rank computes
/// the logits of its vocabulary slice, rank 0 gathers them ([`Model::logits`]), samples and
/// broadcasts the token. Either way all ranks feed the same id. `on_token` is called on rank 0
/// for each generated token, as soon as it is chosen (for streaming).
pub fn generate(
    model: &Model,
    comm: &dyn Comm,
    prompt: &[u32],
    sampler: &mut Sampler,
    opts: &GenOptions,
    mut on_token: impl FnMut(u32),
) -> anyhow::Result<GenOutput> {
    anyhow::ensure!(!prompt.is_empty(), "empty prompt");
    let root = comm.rank() == 0;
    let mut cache = model.new_cache();
    let mut out = GenOutput { prompt_tokens: prompt.len(), ..Default::default() };
    let mut step = Step { model, comm, sampler, opts };
    let t0 = Instant::now();
    let mut tok = step.next(prompt, &mut cache, 0, &mut out.logits)?;
    out.prefill = t0.elapsed();

    let t1 = Instant::now();
    out.decode_start_ns = crate::timing::now_ns();
    for i in 0..opts.max_tokens {
        if opts.stop_tokens.contains(&tok) {
            break;
        }
        out.tokens.push(tok);
        if root {
            on_token(tok);
        }
        if i + 1 < opts.max_tokens {
            tok = step.next(&[tok], &mut cache, i + 1, &mut out.logits)?;
        }
    }
    out.decode = t1.elapsed();
    Ok(out)
}

/// What one step of [`generate`] needs besides its tokens.
struct Step<'a> {
    model: &'a Model,
    comm: &'a dyn Comm,
    sampler: &'a mut Sampler,
    opts: &'a GenOptions,
}

impl Step<'_> {
    /// A forward pass over `tokens` (pass number `pass`), then the next token, the same on
    /// every rank; rank 0 appends the logits it chose from to `recorded` when asked.
    fn next(
        &mut self,
        tokens: &[u32],
        cache: &mut KvCache,
        pass: usize,
        recorded: &mut Vec<Vec<f32>>,
    ) -> anyhow::Result<u32> {
        let (model, comm) = (self.model, self.comm);
        if self.sampler.is_greedy() && !self.opts.record_logits {
            let tok = model.forward_greedy(tokens, cache, comm)?;
            self.check(cache, pass)?;
            return Ok(tok);
        }
        // Every rank asks for logits (each computes its slice); only rank 0 gets them back.
        let logits = model.forward_batch(tokens, cache, comm, true)?;
        self.check(cache, pass)?;
        let mut tok = [0u32];
        if let Some(l) = logits {
            tok[0] = self.sampler.pick(&l);
            if self.opts.record_logits {
                recorded.push(l);
            }
        }
        comm.broadcast_u32(&mut tok, 0)?;
        Ok(tok[0])
    }

    fn check(&self, cache: &KvCache, pass: usize) -> anyhow::Result<()> {
        if self.opts.check_sync {
            check_sync(self.comm, cache.fingerprint(), pass)?;
        }
        Ok(())
    }
}
