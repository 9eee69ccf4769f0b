//! The control plane of a process group: a TCP connection between every two ranks (rank 0's
//! are the bootstrap's coordinator connections, kept open; see [`crate::bootstrap`]).
//!
//! A rank that fails sends an abort frame, naming the cause, to every other rank, and every
//! rank notices a rank whose connection closes without a goodbye. So ranks that were not
//! talking to a failed rank learn of it within moments, whatever the data links (TCP, shared
//! memory, RDMA) are doing, and without a relay that a stalled rank could hold up: in a ring,
//! the ranks beyond a stalled rank's neighbour wait on that neighbour, and learn whom it waits
//! for only from what it sends them (its waiting note, then its abort).
//!
//! An abort that blames a third rank is a report this rank checks against its own connection
//! to the accused before it repeats it (see [`Claim`]): any rank holding the job key can send
//! an abort, and one must not get an honest rank blamed on every other.

use super::progress::Control;
use crate::error::Error;
use crate::error::Result;
use crate::wire::frame::{self, ControlDecoder, Vote};
use crate::wire::{abort_frame, relayed, shrink_frame, Header};
use rustix::event::{PollFd, PollFlags};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a failing rank tries to write an abort or goodbye frame.
const BRIEFLY: Duration = Duration::from_millis(200);
/// How long a report about a third rank waits for this rank's own connection to the accused to
/// bear it out (see [`Claim`]). A true report is borne out within moments: a dead process's
/// connections all close at once, and a rank that aborts tells every rank directly.
const CORROBORATE: Duration = Duration::from_secs(1);

/// The control connection to one rank.
struct Spoke {
    stream: TcpStream,
    decoder: ControlDecoder,
    /// The other side said goodbye: its silence is no longer suspicious.
    departed: bool,
    /// The rank it said it timed out waiting on.
    waits: Option<usize>,
    /// It sent an abort: it is alive, and failing.
    aborted: bool,
    /// The reason of the first abort it sent in its own name.
    own_abort: Option<String>,
    /// Aborts it sent that blame another rank, not yet judged (see [`Claim`]).
    claims: Vec<Error>,
    /// Shrink votes and commits it sent, not yet taken (see [`TcpControl::agree`]).
    votes: std::collections::VecDeque<Vote>,
}

/// An abort from rank `reporter` that blames another rank, `error.rank()`: that it is gone
/// (`PeerLost`) or that it aborted (`Aborted`).
///
/// The promise: a rank repeats such a report only where its own connection to the accused
/// bears it out — that connection closed (the accused is gone), or, for an abort, the
/// accused's own abort came on it, with the same reason. Where it does not — the accused is
/// this rank itself; it is reported gone but its own abort came, so it is alive; its own abort
/// gives another reason; or its connection stays open and silent for [`CORROBORATE`] — the
/// report is false, and this rank blames the reporter:
/// `Aborted { rank: reporter }`, `Error::rank()` naming it. Honest ranks never send a report
/// their peers cannot bear out: a rank's death closes all its connections, an aborting rank
/// tells every rank itself, and a rank that caught a false report passes it on as its own abort
/// (`TcpControl::abort`), which every rank can check.
struct Claim {
    reporter: usize,
    error: Error,
    since: Instant,
}

/// What this rank makes of a [`Claim`] so far.
enum Verdict {
    /// Borne out: repeat it.
    Believe,
    /// False: blame the reporter, with this error.
    False(Error),
    /// Not yet known.
    Wait,
}

/// One rank's end of the control mesh.
pub(crate) struct TcpControl {
    rank: usize,
    /// `spokes[r]`: the connection to rank r (none to this rank).
    spokes: Vec<Option<Spoke>>,
    aborted: bool,
    /// The rank this one said it timed out waiting on.
    waits: Option<usize>,
    /// Reports about third ranks waiting for this rank's own connection to bear them out.
    claims: Vec<Claim>,
    /// Ranks this one caught sending a false report.
    liars: Vec<usize>,
}

impl TcpControl {
    /// The mesh from the bootstrap's connections (`streams[r]` to rank r).
    pub(crate) fn new(rank: usize, streams: Vec<Option<TcpStream>>) -> io::Result<TcpControl> {
        let spokes = streams
            .into_iter()
            .map(|s| {
                s.map(|stream| -> io::Result<Spoke> {
                    stream.set_read_timeout(None)?;
                    stream.set_write_timeout(None)?;
                    stream.set_nonblocking(true)?;
                    stream.set_nodelay(true)?;
                    Ok(Spoke {
                        stream,
                        decoder: ControlDecoder::default(),
                        departed: false,
                        waits: None,
                        aborted: false,
                        own_abort: None,
                        claims: Vec::new(),
                        votes: Default::default(),
                    })
                })
                .transpose()
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(TcpControl { rank, spokes, aborted: false, waits: None, claims: Vec::new(), liars: Vec::new() })
    }

    /// Judge `claim` by this rank's own connection to the accused.
    fn judge(&self, claim: &Claim) -> Verdict {
        let (accused, what, said) = match &claim.error {
            Error::PeerLost { rank, detail } => (*rank, format!("rank {rank} is gone ({detail})"), None),
            Error::Aborted { rank, reason } => {
                (*rank, format!("rank {rank} aborted the group ({reason})"), Some(reason))
            }
            _ => return Verdict::Believe,
        };
        // The same reason as the accused gave, but for a character the wire cut in two where it
        // shortens a long reason (relayed reasons are shortened again).
        let same = |theirs: &str| {
            let (a, b) = (theirs.trim_end_matches('\u{FFFD}'), said.map_or("", |r| r.trim_end_matches('\u{FFFD}')));
            a.starts_with(b) || b.starts_with(a)
        };
        let why = match self.spokes.get(accused).and_then(Option::as_ref) {
            _ if accused == self.rank => format!("this rank is rank {accused}, and alive"),
            None => format!("there is no rank {accused}"),
            // What the accused said itself comes before its departure, which may follow it.
            Some(s) if said.is_none() && s.aborted => {
                format!("rank {accused} was alive: an abort of its own came to this rank")
            }
            Some(s) if s.own_abort.as_deref().is_some_and(same) => return Verdict::Believe,
            Some(s) if s.own_abort.is_some() => {
                format!("rank {accused}'s own abort, which came to this rank, gives another reason")
            }
            Some(s) if s.departed => return Verdict::Believe,
            Some(_) if claim.since.elapsed() >= CORROBORATE => {
                format!("rank {accused}'s connection to this rank is open and said nothing of it for {CORROBORATE:?}")
            }
            Some(_) => return Verdict::Wait,
        };
        Verdict::False(Error::Aborted {
            rank: claim.reporter,
            reason: format!("it reported that {what}, but {why}: a false report"),
        })
    }

    fn send_to_all(&mut self, frame: &[u8], except: Option<usize>) {
        for peer in (0..self.spokes.len()).filter(|&p| Some(p) != except) {
            self.send_to(peer, frame);
        }
    }
}

/// An abort that rank `peer` sends about another rank also names `peer`: a rank (buggy or
/// hostile) cannot make every rank blame a third one without being named itself.
fn reported_by(e: Error, peer: usize) -> Error {
    match e {
        Error::PeerLost { rank, detail } if rank != peer => {
            Error::PeerLost { rank, detail: format!("{detail}; reported by rank {peer}") }
        }
        Error::Aborted { rank, reason } if rank != peer => {
            Error::Aborted { rank, reason: format!("{reason} (reported by rank {peer})") }
        }
        e => e,
    }
}

/// Read what arrived on rank `peer`'s spoke: the first error it announces, if any.
fn read_spoke(peer: usize, s: &mut Spoke) -> Option<Error> {
    let mut found = None;
    let mut tmp = [0u8; 1024];
    let event = loop {
        match s.stream.read(&mut tmp) {
            Ok(0) => {
                break Some(Error::PeerLost {
                    rank: peer,
                    detail: "its control connection closed (process exited or was killed)".into(),
                })
            }
            Ok(n) => {
                if let Err(d) = s.decoder.push(&tmp[..n]) {
                    break Some(Error::Protocol { from: format!("rank {peer}"), detail: d });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break Some(Error::PeerLost { rank: peer, detail: format!("control connection lost ({e})") }),
        }
    };
    // Complete frames count before end-of-file: a goodbye comes just before it.
    loop {
        match s.decoder.next() {
            Ok(Some(frame::Control::Goodbye)) => s.departed = true,
            Ok(Some(frame::Control::Waiting { on })) => s.waits = Some(on),
            Ok(Some(frame::Control::Shrink(v))) => s.votes.push_back(v),
            Ok(Some(frame::Control::Abort(e))) => {
                s.aborted = true;
                if e.rank() == Some(peer) {
                    if let Error::Aborted { reason, .. } = &e {
                        s.own_abort.get_or_insert_with(|| reason.clone());
                    }
                    found.get_or_insert(e);
                } else {
                    s.claims.push(e);
                }
            }
            Ok(None) => break,
            Err(d) => {
                found.get_or_insert(Error::Protocol { from: format!("rank {peer}"), detail: d });
                break;
            }
        }
    }
    if let Some(e) = event {
        if !s.departed {
            found.get_or_insert(e);
        }
        s.departed = true;
    }
    found
}

impl Control for TcpControl {
    fn check(&mut self) -> Option<Error> {
        let mut news: Vec<Option<Error>> = vec![None; self.spokes.len()];
        for (peer, s) in self.spokes.iter_mut().enumerate() {
            if let Some(s) = s.as_mut().filter(|s| !s.departed) {
                news[peer] = read_spoke(peer, s);
                let since = Instant::now();
                self.claims.extend(s.claims.drain(..).map(|error| Claim { reporter: peer, error, since }));
            }
        }
        // Reports about third ranks, judged once every connection is read (the accused's own
        // news may have come in this same read). A false one is the cause of whatever else
        // came (the accused's own abort, when it was the one lied about), so it comes first.
        let mut believed: Vec<Option<Error>> = vec![None; self.spokes.len()];
        let mut pending = vec![false; self.spokes.len()];
        let mut i = 0;
        while i < self.claims.len() {
            match self.judge(&self.claims[i]) {
                Verdict::Wait => {
                    pending[self.claims[i].reporter] = true;
                    i += 1;
                }
                Verdict::Believe => {
                    let c = self.claims.remove(i);
                    believed[c.reporter].get_or_insert(reported_by(c.error, c.reporter));
                }
                Verdict::False(e) => {
                    let liar = self.claims.remove(i).reporter;
                    self.liars.push(liar);
                    return Some(e);
                }
            }
        }
        // Otherwise the first news in rank order, a rank's report before its own departure
        // (it aborted, then left). A rank whose report is still being judged is not yet said
        // to be gone: its departure follows its abort, and the verdict on it will come.
        (0..self.spokes.len()).find_map(|p| believed[p].take().or(if pending[p] { None } else { news[p].take() }))
    }

    fn wake_on<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) {
        for s in self.spokes.iter().flatten().filter(|s| !s.departed) {
            fds.push(PollFd::new(&s.stream, PollFlags::IN));
        }
    }

    fn waiting(&mut self, on: usize) {
        self.waits = Some(on);
        self.send_to_all(&Header::waiting(on).encode(), None);
    }

    fn waits_of(&self, rank: usize) -> Option<usize> {
        if rank == self.rank {
            return self.waits;
        }
        self.spokes.get(rank)?.as_ref()?.waits
    }

    fn abort(&mut self, cause: &Error) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        let (mut culprit, mut frame) = abort_frame(self.rank, cause);
        if self.liars.contains(&culprit) {
            // A false report this rank caught itself, passed on as its own abort: the others
            // can check that (it comes from its sender), but not a report that blames a rank
            // whose connection to them is open and silent, which they would pin on this rank.
            let reason = match relayed(self.rank, cause) {
                Error::Aborted { reason, .. } => reason,
                other => other.to_string(),
            };
            let caught = Error::Protocol { from: format!("rank {culprit}"), detail: reason };
            (culprit, frame) = abort_frame(self.rank, &caught);
        }
        self.send_to_all(&frame, Some(culprit));
    }

    fn settled(&self) -> bool {
        self.spokes.iter().flatten().all(|s| s.departed)
    }

    fn agree(&mut self, candidates: &[usize], attempt: u32, timeout: Duration) -> Result<Vec<usize>> {
        TcpControl::agree(self, candidates, attempt, timeout)
    }

    fn commit(&mut self, members: &[usize], attempt: u32, timeout: Duration) -> Result<()> {
        TcpControl::commit(self, members, attempt, timeout)
    }

    fn last_attempt(&self) -> u32 {
        TcpControl::last_attempt(self)
    }
}

/// A shrink: the survivors agree, over the control connections, on who is in the new group.
///
/// Rounds of votes: each rank sends the set it believes in to every rank of that set and
/// waits (up to the timeout) for theirs. A rank whose connection closed, or that did not vote
/// in time (alive but stalled), is out; so is a rank any vote leaves out. The set that every
/// member voted for unchanged is agreed; then every member sends a commit and waits for the
/// commits of all the others, which must name the same set. So two ranks that both return
/// have the same group: a rank that fails between the rounds makes the others' commits fail
/// (an error, and the caller may shrink again), never two different groups. Ranks left out
/// are told with the commit, and their connections dropped.
impl TcpControl {
    fn alive(&self, q: usize) -> bool {
        self.spokes.get(q).and_then(Option::as_ref).is_some_and(|s| !s.departed)
    }

    /// Read every connection (news is kept in the spokes; errors are old news here).
    fn read_all(&mut self) {
        for (peer, s) in self.spokes.iter_mut().enumerate() {
            if let Some(s) = s.as_mut().filter(|s| !s.departed) {
                let _ = read_spoke(peer, s);
            }
        }
    }

    fn send_to(&mut self, q: usize, frame: &[u8]) {
        if let Some(s) = self.spokes.get_mut(q).and_then(Option::as_mut).filter(|s| !s.departed) {
            write_briefly(&mut s.stream, frame);
        }
    }

    /// Sleep until one of `ranks`' connections has news, or `until`.
    fn wait_for(&self, ranks: &[usize], until: Instant) {
        let mut fds: Vec<PollFd<'_>> = ranks
            .iter()
            .filter_map(|&q| self.spokes.get(q)?.as_ref())
            .filter(|s| !s.departed)
            .map(|s| PollFd::new(&s.stream, PollFlags::IN))
            .collect();
        let ms = until.saturating_duration_since(Instant::now()).as_millis().clamp(1, 100) as i32;
        let _ = rustix::event::poll(&mut fds, ms);
    }

    /// The next frame of rank `q`'s for `attempt`, older ones dropped.
    fn take_vote(&mut self, q: usize, attempt: u32) -> Option<Vote> {
        let votes = &mut self.spokes.get_mut(q)?.as_mut()?.votes;
        while votes.front().is_some_and(|v| v.attempt < attempt) {
            votes.pop_front();
        }
        votes.pop_front()
    }

    /// The highest shrink attempt any rank has voted in.
    fn last_attempt(&self) -> u32 {
        self.spokes.iter().flatten().flat_map(|s| s.votes.iter().map(|v| v.attempt)).max().unwrap_or(0)
    }

    /// Agree on the new group among `candidates` (transport ranks, this one among them).
    fn agree(&mut self, candidates: &[usize], attempt: u32, timeout: Duration) -> Result<Vec<usize>> {
        let me = self.rank;
        self.read_all();
        // Ranks that already shrank without this one (it was stalled): it is out, not a group
        // of one.
        for &q in candidates {
            let votes = self.spokes.get(q).and_then(Option::as_ref).map(|s| &s.votes);
            if let Some(v) = votes.into_iter().flatten().find(|v| v.commit && !v.members.contains(&me)) {
                return Err(Error::Aborted {
                    rank: q,
                    reason: format!(
                        "rank {q} and the others shrank the group to ranks {:?} without this rank (rank {me}), \
                         which did not take part in time",
                        v.members
                    ),
                });
            }
        }
        let mut set: Vec<usize> = candidates.iter().copied().filter(|&q| q == me || self.alive(q)).collect();
        for round in 0..=candidates.len() as u32 {
            let frame = shrink_frame(false, attempt, round, &set);
            for &q in set.iter().filter(|&&q| q != me) {
                self.send_to(q, &frame);
            }
            let until = Instant::now() + timeout;
            let mut votes: Vec<Option<Vec<usize>>> = vec![None; self.spokes.len()];
            loop {
                self.read_all();
                for &q in set.iter().filter(|&&q| q != me) {
                    if votes[q].is_some() {
                        continue;
                    }
                    match self.take_vote(q, attempt) {
                        Some(v) if !v.commit && v.round == round => votes[q] = Some(v.members),
                        Some(v) if v.attempt > attempt => return Err(behind(q, v.attempt, attempt)),
                        Some(v) => return Err(diverged(q, &v, round)),
                        None => {}
                    }
                }
                let waiting: Vec<usize> =
                    set.iter().copied().filter(|&q| q != me && votes[q].is_none() && self.alive(q)).collect();
                if waiting.is_empty() || Instant::now() >= until {
                    break;
                }
                self.wait_for(&waiting, until);
            }
            let mut next: Vec<usize> = set.iter().copied().filter(|&q| q == me || votes[q].is_some()).collect();
            for (q, v) in votes.iter().enumerate().filter_map(|(q, v)| Some((q, v.as_ref()?))) {
                if !v.contains(&me) {
                    return Err(Error::Aborted {
                        rank: q,
                        reason: format!("rank {q} shrank the group to ranks {v:?}, without this rank (rank {me})"),
                    });
                }
                next.retain(|r| v.contains(r));
            }
            if next == set && votes.iter().flatten().all(|v| *v == set) {
                return Ok(set);
            }
            tracing::debug!(round, ?set, ?next, "shrink: another round");
            set = next;
        }
        Err(Error::Internal("shrink: the votes did not settle".into()))
    }

    /// Commit to `members` (agreed by [`TcpControl::agree`]): the same set from every member,
    /// or an error. Then forget every other rank.
    fn commit(&mut self, members: &[usize], attempt: u32, timeout: Duration) -> Result<()> {
        let me = self.rank;
        let frame = shrink_frame(true, attempt, 0, members);
        for &q in members.iter().filter(|&&q| q != me) {
            self.send_to(q, &frame);
        }
        let until = Instant::now() + timeout;
        let mut done: Vec<usize> = vec![me];
        while done.len() < members.len() {
            self.read_all();
            let pending: Vec<usize> = members.iter().copied().filter(|q| !done.contains(q)).collect();
            for q in pending {
                match self.take_vote(q, attempt) {
                    Some(v) if v.commit && v.members == members => done.push(q),
                    // A vote of an earlier round that crossed this rank's last one.
                    Some(v) if !v.commit && v.attempt == attempt && v.members == members => {}
                    Some(v) if v.attempt > attempt => return Err(behind(q, v.attempt, attempt)),
                    Some(v) => return Err(diverged(q, &v, u32::MAX)),
                    None if !self.alive(q) => {
                        return Err(Error::PeerLost {
                            rank: q,
                            detail: "it was lost during the shrink (its control connection closed)".into(),
                        })
                    }
                    None => {}
                }
            }
            if done.len() == members.len() {
                break;
            }
            if Instant::now() >= until {
                let q = members.iter().copied().find(|q| !done.contains(q)).expect("one is missing");
                return Err(Error::Timeout { op: "shrink (waiting for the commit)".into(), rank: q, after: timeout });
            }
            let waiting: Vec<usize> = members.iter().copied().filter(|q| !done.contains(q)).collect();
            self.wait_for(&waiting, until);
        }
        // The ranks left out learn it from the commit; their connections go.
        for q in 0..self.spokes.len() {
            if !members.contains(&q) {
                self.send_to(q, &frame);
                self.spokes[q] = None;
            }
        }
        self.aborted = false;
        self.waits = None;
        self.claims.clear();
        self.liars.clear();
        for s in self.spokes.iter_mut().flatten() {
            s.aborted = false;
            s.own_abort = None;
            s.claims.clear();
            s.waits = None;
            s.votes.retain(|v| v.attempt > attempt);
        }
        Ok(())
    }
}

fn behind(q: usize, theirs: u32, mine: u32) -> Error {
    Error::Aborted {
        rank: q,
        reason: format!("rank {q} is on shrink attempt {theirs}, this rank on {mine}: call shrink again"),
    }
}

fn diverged(q: usize, v: &Vote, round: u32) -> Error {
    let what = if v.commit { "committed to" } else { "voted for" };
    let when = if round == u32::MAX { "while this rank committed".to_string() } else { format!("in round {round}") };
    Error::Aborted {
        rank: q,
        reason: format!(
            "rank {q} {what} ranks {:?} (round {}) {when}: the ranks saw different failures during the shrink; call shrink again",
            v.members, v.round
        ),
    }
}

impl Drop for TcpControl {
    fn drop(&mut self) {
        if !self.aborted {
            self.send_to_all(&Header::goodbye().encode(), None);
        }
    }
}

/// Write a small frame on a non-blocking socket, giving up after a moment: used only on paths
/// that are already failing or leaving, which must never wait long.
pub(crate) fn write_briefly(stream: &mut TcpStream, mut frame: &[u8]) {
    let until = Instant::now() + BRIEFLY;
    while !frame.is_empty() && Instant::now() < until {
        match stream.write(frame) {
            Ok(0) => return,
            Ok(n) => frame = &frame[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(_) => return,
        }
    }
}
