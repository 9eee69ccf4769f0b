//! The progress engine: the one loop that drives every exchange to completion.
//!
//! An exchange's operations are spread over [`Channel`]s (TCP sockets, RDMA queue pairs,
//! in-process queues), chosen per peer. The engine pumps every channel until all are done,
//! and owns the policy they all share:
//! - **waiting**: spin, then yield, then sleep in the kernel ([`WaitPolicy`]);
//! - **deadlines**: a call fails when nothing has moved for `BOLTCCL_TIMEOUT_MS`, naming the
//!   rank it waits on;
//! - **the control plane** ([`Control`]): aborts and dead ranks reported by other ranks are
//!   read at least every [`CONTROL_CHECK`], while data moves too;
//! - **interrupts**: the caller's check (Ctrl-C in Python) runs at least every
//!   [`INTERRUPT_EVERY`] once the call is no longer on its fast path.

use super::{Limits, LinkKind, OnRecv, RecvOp, SendOp};
use crate::error::{Error, Result};
use rustix::event::{poll, PollFd};
use std::time::{Duration, Instant};

/// How long a failed exchange looks for a better explanation than its own (see
/// [`Engine::explain`]).
const EXPLAIN_WAIT: Duration = Duration::from_millis(300);
/// How often the control plane is read while data is still moving.
pub const CONTROL_CHECK: Duration = Duration::from_millis(20);
/// How often a blocked call runs the interrupt check.
pub const INTERRUPT_EVERY: Duration = Duration::from_millis(50);
/// Sleep between polls for channels the kernel cannot wake us for (RDMA without a completion
/// channel: Apple's provider has none).
pub const NAP: Duration = Duration::from_micros(100);
/// Polls between readings of the clock while a call spins or data moves (see [`Engine::run`]):
/// a few microseconds of polling, far below every policy's hard spin.
const CLOCK_EVERY: u32 = 32;
/// Longest single sleep, so deadlines and the control plane are looked at regularly.
const MAX_SLEEP: Duration = Duration::from_millis(1000);

/// The links of one kind that serve some of the peers: TCP sockets, RDMA queue pairs,
/// in-process queues.
pub(crate) trait Channel: Send {
    /// What kind of link this channel is.
    fn kind(&self) -> LinkKind;
    /// Begin this exchange's operations whose peer `mine` accepts (in list order per peer),
    /// moving at once what can move without waiting, polling up to `polls` times (calling
    /// `on_recv` for each receive completed). True when they are all done already; else
    /// `pump` moves the rest.
    fn start(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        mine: &dyn Fn(usize) -> bool,
        polls: u32,
    ) -> Result<bool>;
    /// Move what can move without blocking; call `on_recv` for each receive completed.
    /// Returns whether anything moved.
    fn pump(&mut self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool>;
    /// The peer the queued operations wait on first; `None` when all are done.
    fn waiting_on(&self) -> Option<usize>;
    /// About to sleep: add the file descriptors whose readiness means progress, and say how
    /// this channel can be waited for.
    fn wake_on<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> Wake;
    /// Look for peers that are gone without a word (read at the control plane's pace, never on
    /// the fast path).
    fn check(&mut self) -> Result<()> {
        Ok(())
    }
    /// How long after a peer's message is in this rank's hands its arrival may still be hidden
    /// from `pump`: zero where the peer's own writes are what `pump` reads (sockets, shared
    /// memory); a device's completions (an RDMA NIC, softverbs' receive threads) land later.
    fn arrival_lag(&self) -> Duration {
        Duration::ZERO
    }
    /// A peer whose process this channel can tell has exited (its link says so, not a
    /// silence). Asked once an exchange has failed, to find the cause.
    fn gone(&self) -> Option<usize> {
        None
    }
    /// After a failed exchange, before returning: make sure nothing still reads or writes the
    /// caller's buffers.
    fn quiesce(&mut self) {}
    /// Whether a shrink can keep this channel's links (see [`Channel::resync`]).
    fn can_resync(&self) -> bool {
        false
    }
    /// A shrink begins, before the votes: stop anything that would still write to the peers.
    fn prepare_resync(&mut self) {}
    /// After the votes: bring the links to the peers in `keep` (transport ranks; this channel
    /// serves some of them) back to a clean start, everything of the failed group dropped,
    /// failing if one of them makes no progress for `timeout`.
    fn resync(&mut self, _keep: &[usize], _attempt: u32, _timeout: Duration) -> Result<()> {
        Err(Error::invalid(format!("a shrink cannot keep {} links yet", self.kind().name())))
    }
    /// After a shrink: drop the links to the peers not in `keep`.
    fn forget(&mut self, _keep: &[usize]) {}
}

/// How a channel can be waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// `poll` on the descriptors it added wakes up when it can progress.
    Poll,
    /// The kernel cannot wake us for it (RDMA without a completion channel): nap and look again.
    Nap,
    /// It can progress now: do not sleep.
    Ready,
}

/// How the ranks of a group tell each other that the job is failing.
pub(crate) trait Control: Send {
    /// News from the other ranks: an abort or a dead rank, if any arrived.
    fn check(&mut self) -> Option<Error>;
    /// Add the file descriptors whose readiness means news.
    fn wake_on<'a>(&'a self, fds: &mut Vec<PollFd<'a>>);
    /// Tell every rank that this one timed out waiting on rank `on` (best effort, brief).
    fn waiting(&mut self, on: usize);
    /// The rank that rank `rank` (this one included) said it timed out waiting on, if it said
    /// so (other ranks' notes are read by `check`).
    fn waits_of(&self, rank: usize) -> Option<usize>;
    /// Tell every rank that this job is failing because of `cause` (best effort, brief).
    fn abort(&mut self, cause: &Error);
    /// No more news can come: every other rank has left, or this control plane tells nothing
    /// it does not know at once.
    fn settled(&self) -> bool;
    /// A shrink's votes (see `TcpControl::agree`): the agreed new group among `candidates`.
    fn agree(&mut self, _candidates: &[usize], _attempt: u32, _timeout: Duration) -> Result<Vec<usize>> {
        Err(Error::invalid("this control plane cannot shrink a group"))
    }
    /// A shrink's commit (see `TcpControl::commit`).
    fn commit(&mut self, _members: &[usize], _attempt: u32, _timeout: Duration) -> Result<()> {
        Err(Error::invalid("this control plane cannot shrink a group"))
    }
    /// The highest shrink attempt another rank has voted in.
    fn last_attempt(&self) -> u32 {
        0
    }
}

/// How long a waiting rank polls before sleeping, when it has a core to itself.
pub const DEFAULT_POLL: Duration = Duration::from_millis(1);
/// Longest hard spin: on loopback a hard spinner starves the kernel's deferred network work
/// (ksoftirqd) on its core, delaying the very packet it waits for.
pub const MAX_HARD_SPIN: Duration = Duration::from_micros(50);

/// How long a rank on a host with more ranks than cores yield-polls, while its recent waits
/// have been short.
pub const SHARED_CORE_POLL: Duration = Duration::from_micros(50);
/// Waits that short mean the ranks are trading messages, not waiting on each other's compute:
/// yield-polling then answers in microseconds where a sleep costs a wake-up each hop.
pub const QUICK_WAIT: Duration = Duration::from_micros(200);
/// Calls larger than this do not poll on shared cores: their time goes into copying, and a
/// polling rank takes CPU from the ranks that copy. Measured at
/// 4 ranks on 2 cores (2026-11-30): polling made 1 KiB all_sums 7.6x faster (80 -> 10.5 us)
/// and 1 MiB ones 1.2x, but 16 MiB ones 1.2x slower.
pub const SHARED_CORE_POLL_MAX_BYTES: usize = 2 << 20;

/// How a blocked exchange waits for progress: spin hard (lowest latency), then yield the CPU
/// between checks (lets co-located ranks and the kernel's network work run), then sleep in
/// the kernel. Hard spinning is only allowed when this host runs no more ranks than cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Spin without yielding for this long after the last progress.
    pub hard: Duration,
    /// Keep checking, yielding between checks, until this long after the last progress.
    pub soft: Duration,
    /// Ranks outnumber cores and no budget was set: yield-poll for [`SHARED_CORE_POLL`] only
    /// while recent waits were quick (see [`Pace`]), else sleep at once.
    pub adaptive: bool,
}

/// The recent waits of one rank: an average of the longest wait without progress in each
/// exchange. Ranks that only trade messages wait microseconds; a rank waiting for a peer that
/// computes on a shared core waits far longer, and polling would take that peer's CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pace {
    longest: Duration,
}

impl Pace {
    /// Fold in an exchange whose longest wait was `longest` (a quarter weight: one long wait
    /// does not undo a run of quick ones, a few do).
    pub fn record(&mut self, longest: Duration) {
        self.longest = (self.longest * 3 + longest) / 4;
    }

    /// Whether recent waits were quick.
    pub fn quick(&self) -> bool {
        self.longest < QUICK_WAIT
    }
}

/// What a waiting loop should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStep {
    /// Check again at once.
    Spin,
    /// Yield the CPU, then check again.
    Yield,
    /// Sleep until a channel has something to do.
    Block,
}

impl WaitPolicy {
    /// The policy for `local_ranks` ranks on a host with `cores` cores; `budget` is
    /// `BOLTCCL_SPIN_US` when set.
    ///
    /// With a core per rank, waiting costs nobody anything, and a rank that has gone to sleep
    /// wakes tens of microseconds late (longer in a VM), so poll for up to 1 ms: hard for the
    /// first quarter (at most [`MAX_HARD_SPIN`]), then yielding. With more ranks than cores,
    /// any CPU a waiting rank uses is taken from the rank it waits for: sleep at once (an
    /// explicit budget is still honoured, as yielding only). Measured with the inference
    /// example at 3 ranks on 2 cores: all_sum's communication share fell from 14% to 7%.
    pub fn for_host(local_ranks: usize, cores: usize, budget: Option<Duration>) -> WaitPolicy {
        if local_ranks > cores {
            let soft = budget.unwrap_or(SHARED_CORE_POLL);
            return WaitPolicy { hard: Duration::ZERO, soft, adaptive: budget.is_none() };
        }
        let soft = budget.unwrap_or(DEFAULT_POLL);
        WaitPolicy { hard: (soft / 4).min(MAX_HARD_SPIN), soft, adaptive: false }
    }

    /// The policy for `local_ranks` ranks on this host.
    pub fn here(local_ranks: usize, budget: Option<Duration>) -> WaitPolicy {
        WaitPolicy::for_host(local_ranks, crate::host::parallelism(), budget)
    }

    /// The next step after `idle` without progress in a call of `bytes`, given the rank's
    /// recent waits.
    pub fn step(&self, idle: Duration, bytes: usize, pace: &Pace) -> WaitStep {
        if idle < self.hard {
            WaitStep::Spin
        } else if idle < self.soft && (!self.adaptive || (pace.quick() && bytes <= SHARED_CORE_POLL_MAX_BYTES)) {
            WaitStep::Yield
        } else {
            WaitStep::Block
        }
    }
}

/// When an exchange last moved, and when the control plane and the interrupt check are due.
struct Due {
    progress: Instant,
    control: Instant,
    interrupt: Instant,
}

impl Due {
    fn from(now: Instant) -> Due {
        Due { progress: now, control: now + CONTROL_CHECK, interrupt: now + INTERRUPT_EVERY }
    }
}

/// The links of a group and the loop that drives them.
pub(crate) struct Engine {
    pub channels: Vec<Box<dyn Channel>>,
    /// `route[peer]`: the index in `channels` of the channel that serves `peer`.
    pub route: Vec<usize>,
    pub control: Box<dyn Control>,
    pub wait: WaitPolicy,
    pub pace: Pace,
    /// The last exchange failed on the control plane's news, which is its own explanation.
    pub told: bool,
    /// A peer found gone while the exchange it took part in could still finish on what it had
    /// sent: the next exchange fails with it at once.
    pub lost: Option<Error>,
}

impl Engine {
    /// Run `sends` and `recvs` to completion, each over the channel that serves its peer.
    /// Returns the first error: a dead peer, an abort, a mismatched header, a timeout (each
    /// explained by the control plane when it knows better), an interrupt.
    pub fn run(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        limits: &Limits<'_>,
    ) -> Result<()> {
        if let Some(e) = self.lost.take() {
            // Known before this exchange began, and its own explanation.
            self.told = true;
            return Err(e);
        }
        // Only the channels this exchange uses are begun, pumped and checked: a small call over
        // shared memory should not pay for the sockets too. The others hold no pending
        // operation: their last exchange completed, or failed, and links that failed carry no
        // exchange until a shrink has resynced them, which clears their queues.
        let peers = sends.iter().map(|s| s.peer).chain(recvs.iter().map(|r| r.peer));
        let active = peers.fold(0u64, |m, peer| m | 1 << self.route[peer]);
        self.told = false;
        let r = self.start(sends, recvs, on_recv, active).and_then(|done| {
            if !done {
                return self.drive(sends, recvs, on_recv, limits, active);
            }
            self.pace.record(Duration::ZERO);
            limits.aborted()
        });
        if r.is_err() {
            // The caller may free its buffers once we return.
            for ch in self.channels.iter_mut() {
                ch.quiesce();
            }
        }
        match r {
            Err(e @ (Error::PeerLost { .. } | Error::Timeout { .. })) if !self.told => {
                if let Error::Timeout { rank, .. } = e {
                    // At once, before looking for news: the others, timing out about now, may
                    // be waiting on this rank and need to know whom it waits on.
                    self.control.waiting(rank);
                }
                Err(self.explain(e))
            }
            other => other,
        }
    }

    /// Start the exchange on every channel it uses; true when all of it is done already (a
    /// small call whose peers were there). Polls as long as the first stretch of `drive` would
    /// before reading the clock, once when the policy does not spin.
    fn start(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        active: u64,
    ) -> Result<bool> {
        let polls = if self.wait.hard.is_zero() { 1 } else { CLOCK_EVERY };
        if active.count_ones() == 1 {
            // Every operation is the one channel's.
            let ch = &mut self.channels[active.trailing_zeros() as usize];
            return ch.start(sends, recvs, on_recv, &|_| true, polls);
        }
        let route = &self.route;
        let mut done = true;
        for (c, ch) in used(&mut self.channels, active) {
            done &= ch.start(sends, recvs, on_recv, &|peer| route[peer] == c, polls)?;
        }
        Ok(done)
    }

    /// `err` names the rank whose link failed or went silent; that rank is often a bystander.
    /// When a call fails somewhere (a mismatch, a death), the ranks that saw it fail, take back
    /// what they lent and leave, and a third rank may see that first. So look, for a moment,
    /// for the cause: another rank's abort (it names its own cause) is the best; failing that,
    /// a rank whose process is known to have exited (it may have exited because of the abort
    /// still on its way, so it is only the fallback). A timeout waiting on a rank that itself
    /// timed out waiting on another follows those waits to the rank they lead to.
    fn explain(&mut self, err: Error) -> Error {
        let named = match &err {
            Error::PeerLost { rank, .. } | Error::Timeout { rank, .. } => *rank,
            _ => return err,
        };
        let until = Instant::now() + EXPLAIN_WAIT;
        let mut exited = None;
        loop {
            if let Some(e @ (Error::Aborted { .. } | Error::PeerLost { .. })) = self.control.check() {
                return e;
            }
            exited = exited.or_else(|| self.channels.iter().find_map(|c| c.gone()));
            if self.control.settled() || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        match exited {
            Some(dead) if dead == named && matches!(err, Error::PeerLost { .. }) => err,
            Some(dead) if dead == named => {
                Error::PeerLost { rank: dead, detail: "its process exited or was killed".into() }
            }
            Some(dead) => Error::PeerLost {
                rank: dead,
                detail: format!("its process exited or was killed (what this rank saw first: {err})"),
            },
            None => follow_waits(err, |r| self.control.waits_of(r)),
        }
    }

    fn drive(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        limits: &Limits<'_>,
        active: u64,
    ) -> Result<()> {
        let Engine { channels, control, wait, pace, told, lost, .. } = self;
        let uses = |c: usize| active >> c & 1 == 1;
        // Set at the first reading of the clock: a call done within CLOCK_EVERY polls needs none.
        let mut due: Option<Due> = None;
        let mut longest = Duration::ZERO;
        // Polls since the clock was last read, whether any of them moved something, and
        // whether the wait policy spins hard at this point.
        let (mut polls, mut progressed, mut spinning) = (0u32, false, !wait.hard.is_zero());
        loop {
            let mut moved = false;
            for (_, ch) in used(channels, active) {
                moved |= ch.pump(sends, recvs, on_recv)?;
            }
            limits.aborted()?;
            let waiting_on = channels.iter().enumerate().filter(|(c, _)| uses(*c)).find_map(|(_, c)| c.waiting_on());
            let Some(blocked) = waiting_on else {
                pace.record(longest);
                return Ok(());
            };
            if moved {
                progressed = true;
                spinning = !wait.hard.is_zero();
            }
            polls += 1;
            // Reading the clock costs as much as a poll: while data moves or the policy spins
            // hard, look at it every CLOCK_EVERY polls only. Progress is dated when it is next
            // read, at most that many polls late.
            if polls < CLOCK_EVERY && (moved || spinning) {
                if !moved {
                    std::hint::spin_loop();
                }
                continue;
            }
            polls = 0;
            let now = Instant::now();
            let Due { progress: last_progress, control: next_control, interrupt: next_interrupt } =
                due.get_or_insert_with(|| Due::from(now));
            if std::mem::take(&mut progressed) {
                longest = longest.max(now.duration_since(*last_progress));
                *last_progress = now;
            }
            if now >= *next_control {
                *next_control = now + CONTROL_CHECK;
                if let Err(e) = check(channels, active, control.as_mut(), told) {
                    return finish_on_what_arrived(e, channels, active, sends, recvs, on_recv, lost);
                }
            }
            if now >= *next_interrupt {
                *next_interrupt = now + INTERRUPT_EVERY;
                limits.interrupted()?;
            }
            if moved {
                continue;
            }
            let step = wait.step(now.duration_since(*last_progress), limits.bytes, pace);
            spinning = step == WaitStep::Spin;
            match step {
                WaitStep::Spin => {
                    std::hint::spin_loop();
                    continue;
                }
                WaitStep::Yield => {
                    std::thread::yield_now();
                    continue;
                }
                WaitStep::Block => {}
            }
            let deadline = *last_progress + limits.timeout;
            if now >= deadline {
                return Err(Error::Timeout { op: limits.op.into(), rank: blocked, after: limits.timeout });
            }
            let mut until = deadline.min(now + MAX_SLEEP).min((*next_control).max(now + CONTROL_CHECK));
            if limits.interrupt.is_some() {
                until = until.min((*next_interrupt).max(now + INTERRUPT_EVERY));
            }
            let mut fds: Vec<PollFd<'_>> = Vec::new();
            let mut wake = Wake::Poll;
            for (_, ch) in channels.iter().enumerate().filter(|(c, ch)| uses(*c) && ch.waiting_on().is_some()) {
                wake = match (wake, ch.wake_on(&mut fds)) {
                    (Wake::Ready, _) | (_, Wake::Ready) => Wake::Ready,
                    (Wake::Nap, _) | (_, Wake::Nap) => Wake::Nap,
                    _ => Wake::Poll,
                };
            }
            match wake {
                Wake::Ready => continue,
                Wake::Nap => std::thread::sleep(NAP),
                Wake::Poll => {
                    control.wake_on(&mut fds);
                    if let Some(a) = &limits.abort {
                        fds.push(PollFd::from_borrowed_fd(a.fd(), rustix::event::PollFlags::IN));
                    }
                    sleep(&mut fds, until.saturating_duration_since(now))?;
                    drop(fds);
                    // What woke us may be news, not data: read it at once.
                    if let Err(e) = check(channels, active, control.as_mut(), told) {
                        return finish_on_what_arrived(e, channels, active, sends, recvs, on_recv, lost);
                    }
                    *next_control = Instant::now() + CONTROL_CHECK;
                }
            }
        }
    }
}

/// A timeout waiting on a rank, blamed on the rank the waits lead to: that rank's own wait
/// (`waits_of`, this rank's included), and so on, until a rank that did not say it waits (the
/// stalled one) or a cycle (ranks waiting on each other, this one among them: the timeout
/// stays as it is).
fn follow_waits(err: Error, waits_of: impl Fn(usize) -> Option<usize>) -> Error {
    let Error::Timeout { op, rank: named, after } = err else { return err };
    let mut seen = vec![named];
    let mut at = named;
    while let Some(next) = waits_of(at) {
        if seen.contains(&next) {
            return Error::Timeout { op, rank: named, after };
        }
        seen.push(next);
        at = next;
    }
    if at == named {
        return Error::Timeout { op, rank: named, after };
    }
    let through: Vec<String> = seen[..seen.len() - 1].iter().map(|r| format!("rank {r}")).collect();
    let op = format!("{op} (through {}, which timed out waiting for it)", through.join(", then "));
    Error::Timeout { op, rank: at, after }
}

/// The channels in the `active` mask (bit c: channel c), with their indices.
fn used(channels: &mut [Box<dyn Channel>], active: u64) -> impl Iterator<Item = (usize, &mut Box<dyn Channel>)> {
    channels.iter_mut().enumerate().filter(move |(c, _)| active >> c & 1 == 1)
}

/// Read the control plane's news and let every `active` channel look for silently lost peers.
/// News from the control plane sets `told`: it already names the cause (another rank's abort),
/// and looking again could only find a later, lesser event, such as that rank exiting after it
/// sent the abort.
fn check(channels: &mut [Box<dyn Channel>], active: u64, control: &mut dyn Control, told: &mut bool) -> Result<()> {
    if let Some(e) = control.check() {
        *told = true;
        return Err(e);
    }
    used(channels, active).try_for_each(|(_, c)| c.check())
}

/// A peer is gone (`err`), but a peer sends its last message before it exits, and the news of
/// its exit may be read before that message: take what has arrived (waiting out the channels'
/// arrival lag), and if that completes the exchange, it succeeds and `err` waits in `lost`:
/// the next exchange fails with it at once. Anything else (an abort, a protocol error) fails
/// at once.
fn finish_on_what_arrived(
    err: Error,
    channels: &mut [Box<dyn Channel>],
    active: u64,
    sends: &[SendOp<'_>],
    recvs: &mut [RecvOp<'_>],
    on_recv: &mut OnRecv<'_>,
    lost: &mut Option<Error>,
) -> Result<()> {
    if !matches!(err, Error::PeerLost { .. }) {
        return Err(err);
    }
    let lag = used(channels, active).filter(|(_, c)| c.waiting_on().is_some()).map(|(_, c)| c.arrival_lag()).max();
    let lag = lag.unwrap_or_default();
    // Bounded: a dead peer sends nothing more, what the live ones send is this exchange's,
    // and a lag without progress ends it.
    let mut last_progress = Instant::now();
    loop {
        let mut moved = false;
        for (_, ch) in used(channels, active) {
            // A link failing now fails because of the loss (a peer that saw it withdrew what
            // it was sending): the loss is the cause to report.
            let Ok(m) = ch.pump(sends, recvs, on_recv) else { return Err(err) };
            moved |= m;
        }
        if used(channels, active).all(|(_, c)| c.waiting_on().is_none()) {
            *lost = Some(err);
            return Ok(());
        }
        let now = Instant::now();
        if moved {
            last_progress = now;
        } else if now.duration_since(last_progress) >= lag {
            return Err(err);
        } else {
            std::thread::sleep(NAP);
        }
    }
}

/// Sleep until one of `fds` is ready or `for_` has passed (rounded up to a millisecond).
fn sleep(fds: &mut [PollFd<'_>], for_: Duration) -> Result<()> {
    let ms = for_.as_micros().div_ceil(1000).clamp(1, i32::MAX as u128) as i32;
    match poll(fds, ms) {
        Ok(_) => Ok(()),
        Err(e) if e == rustix::io::Errno::INTR => Ok(()),
        Err(e) => Err(Error::local_io("poll", e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_spins_hard_when_ranks_outnumber_cores() {
        let us = Duration::from_micros;
        let quick = Pace::default();
        let p = WaitPolicy::for_host(2, 2, None);
        assert_eq!(
            (p.step(us(1), 0, &quick), p.step(us(60), 0, &quick), p.step(us(1100), 0, &quick)),
            (WaitStep::Spin, WaitStep::Yield, WaitStep::Block)
        );
        let p = WaitPolicy::for_host(4, 2, None);
        assert_eq!((p.step(us(0), 0, &quick), p.step(us(60), 0, &quick)), (WaitStep::Yield, WaitStep::Block));
        let p = WaitPolicy::for_host(4, 2, Some(us(50)));
        assert_eq!((p.step(us(0), 0, &quick), p.step(us(60), 0, &quick)), (WaitStep::Yield, WaitStep::Block));
        let p = WaitPolicy::for_host(1, 8, Some(Duration::ZERO));
        assert_eq!(p.step(us(0), 0, &quick), WaitStep::Block);
        let p = WaitPolicy::for_host(1, 8, Some(us(400)));
        assert_eq!(
            (p.step(us(40), 0, &quick), p.step(us(60), 0, &quick), p.step(us(400), 0, &quick)),
            (WaitStep::Spin, WaitStep::Yield, WaitStep::Block)
        );
    }

    /// Waits lead from the rank waited on to the one that said nothing; a cycle through this
    /// rank (its own note included) keeps the rank it waited on.
    #[test]
    fn timeouts_follow_the_waits() {
        let timeout = |rank| Error::Timeout { op: "all_sum".into(), rank, after: Duration::from_secs(2) };
        let blamed = |e: Error| (e.rank(), e.to_string());
        // This is rank 0. A chain: 0 waited on 1, 1 on 3, 3 said nothing.
        let chain = |r: usize| [Some(1), Some(3), None, None][r];
        let (rank, msg) = blamed(follow_waits(timeout(1), chain));
        assert_eq!(rank, Some(3), "{msg}");
        assert!(msg.contains("through rank 1"), "{msg}");
        // Waiting directly on the silent rank: unchanged.
        assert_eq!(follow_waits(timeout(3), |_| None).rank(), Some(3));
        // 0 waits on 1, 1 on 0: a cycle through this rank; and 1 -> 2 -> 1.
        let own = |r: usize| [Some(1), Some(0), None][r];
        assert_eq!(follow_waits(timeout(1), own).rank(), Some(1));
        let loop_ = |r: usize| [Some(1), Some(2), Some(1)][r];
        assert_eq!(follow_waits(timeout(1), loop_).rank(), Some(1));
        // Not a timeout: as it is.
        let lost = Error::PeerLost { rank: 2, detail: "gone".into() };
        assert_eq!(follow_waits(lost, |_| Some(0)).rank(), Some(2));
    }

    /// With more ranks than cores, a rank whose recent waits were long (its peers compute on
    /// the shared cores) sleeps at once; after a few quick waits it polls again. A budget set
    /// by the user is kept whatever the waits.
    #[test]
    fn shared_cores_poll_only_while_waits_are_quick() {
        let us = Duration::from_micros;
        let p = WaitPolicy::for_host(4, 2, None);
        let mut pace = Pace::default();
        for _ in 0..4 {
            pace.record(us(2_000));
        }
        assert!(!pace.quick());
        assert_eq!(p.step(us(0), 0, &pace), WaitStep::Block);
        let fixed = WaitPolicy::for_host(4, 2, Some(us(50)));
        assert_eq!(fixed.step(us(0), 0, &pace), WaitStep::Yield);
        let mut quick_again = 0;
        while !pace.quick() {
            pace.record(us(20));
            quick_again += 1;
        }
        assert!((2..=12).contains(&quick_again), "{quick_again} quick waits to poll again");
        assert_eq!(p.step(us(0), 0, &pace), WaitStep::Yield);
        // Large calls sleep: their time goes into copies that polling would slow.
        assert_eq!(p.step(us(0), SHARED_CORE_POLL_MAX_BYTES + 1, &pace), WaitStep::Block);
        // One long wait among quick ones does not stop the polling.
        for _ in 0..10 {
            pace.record(us(20));
        }
        pace.record(us(400));
        assert!(pace.quick());
    }
}
