//! The control plane of a process group: a TCP connection between every two ranks (rank 0's
//! are the bootstrap's coordinator connections, kept open; see [`crate::bootstrap`]).
//!
//! A rank that fails sends an abort frame, naming the cause, to every other rank, and every
//! rank notices a rank whose connection closes without a goodbye. So ranks that were not
//! talking to a failed rank learn of it within moments, whatever the data links (TCP, shared
//! memory, RDMA) are doing, and without a relay that a stalled rank could hold up: in a ring,
//! the ranks beyond a stalled rank's neighbour wait on that neighbour, and learn whom it waits
//! for only from what it sends them (its waiting note, then its abort).

use super::progress::Control;
use crate::error::Error;
use crate::wire::frame::{self, ControlDecoder};
use crate::wire::{abort_frame, Header};
use rustix::event::{PollFd, PollFlags};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a failing rank tries to write an abort or goodbye frame.
const BRIEFLY: Duration = Duration::from_millis(200);

/// The control connection to one rank.
struct Spoke {
    stream: TcpStream,
    decoder: ControlDecoder,
    /// The other side said goodbye: its silence is no longer suspicious.
    departed: bool,
    /// The rank it said it timed out waiting on.
    waits: Option<usize>,
}

/// One rank's end of the control mesh.
pub(crate) struct MeshControl {
    rank: usize,
    /// `spokes[r]`: the connection to rank r (none to this rank).
    spokes: Vec<Option<Spoke>>,
    aborted: bool,
    /// The rank this one said it timed out waiting on.
    waits: Option<usize>,
}

impl MeshControl {
    /// The mesh from the bootstrap's connections (`streams[r]` to rank r).
    pub(crate) fn new(rank: usize, streams: Vec<Option<TcpStream>>) -> io::Result<MeshControl> {
        let spokes = streams
            .into_iter()
            .map(|s| {
                s.map(|stream| -> io::Result<Spoke> {
                    stream.set_read_timeout(None)?;
                    stream.set_write_timeout(None)?;
                    stream.set_nonblocking(true)?;
                    stream.set_nodelay(true)?;
                    Ok(Spoke { stream, decoder: ControlDecoder::default(), departed: false, waits: None })
                })
                .transpose()
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(MeshControl { rank, spokes, aborted: false, waits: None })
    }

    fn send_to_all(&mut self, frame: &[u8], except: Option<usize>) {
        for (peer, s) in self.spokes.iter_mut().enumerate() {
            if let Some(s) = s.as_mut().filter(|s| !s.departed && Some(peer) != except) {
                write_briefly(&mut s.stream, frame);
            }
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
            Ok(Some(frame::Control::Abort(e))) => {
                found.get_or_insert(reported_by(e, peer));
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

impl Control for MeshControl {
    fn check(&mut self) -> Option<Error> {
        let mut found = None;
        for (peer, s) in self.spokes.iter_mut().enumerate() {
            if let Some(s) = s.as_mut().filter(|s| !s.departed) {
                if let Some(e) = read_spoke(peer, s) {
                    found.get_or_insert(e);
                }
            }
        }
        found
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
        let (culprit, frame) = abort_frame(self.rank, cause);
        self.send_to_all(&frame, Some(culprit));
    }

    fn settled(&self) -> bool {
        self.spokes.iter().flatten().all(|s| s.departed)
    }
}

impl Drop for MeshControl {
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
