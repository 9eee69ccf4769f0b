//! The control plane of a process group: a star of TCP connections through rank 0 (the
//! bootstrap connections, kept open).
//!
//! A rank that fails sends an abort frame to rank 0, which relays it to everyone; rank 0 also
//! notices a rank whose connection closes without a goodbye and tells the others. So ranks
//! that were not talking to a failed rank learn of it within moments, whatever the data links
//! (TCP, shared memory, RDMA) are doing.

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
}

/// One rank's end of the star.
pub(crate) struct StarControl {
    rank: usize,
    /// Rank 0: one per other rank. Others: only `spokes[0]`, the connection to rank 0.
    spokes: Vec<Option<Spoke>>,
    aborted: bool,
}

impl StarControl {
    /// The star from the bootstrap's connections (`streams[r]` to rank r, where there is one).
    pub(crate) fn new(rank: usize, streams: Vec<Option<TcpStream>>) -> io::Result<StarControl> {
        let spokes = streams
            .into_iter()
            .map(|s| {
                s.map(|stream| -> io::Result<Spoke> {
                    stream.set_read_timeout(None)?;
                    stream.set_write_timeout(None)?;
                    stream.set_nonblocking(true)?;
                    stream.set_nodelay(true)?;
                    Ok(Spoke { stream, decoder: ControlDecoder::default(), departed: false })
                })
                .transpose()
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(StarControl { rank, spokes, aborted: false })
    }

    fn send_to_all(&mut self, frame: &[u8], except: Option<usize>) {
        for (peer, s) in self.spokes.iter_mut().enumerate() {
            if let Some(s) = s.as_mut().filter(|s| !s.departed && Some(peer) != except) {
                write_briefly(&mut s.stream, frame);
            }
        }
    }
}

/// Read what arrived on one spoke: the first error it announces, if any.
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
            Ok(Some(frame::Control::Abort(e))) => {
                found.get_or_insert(e);
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

impl Control for StarControl {
    fn check(&mut self) -> Option<Error> {
        let mut found = None;
        for (peer, s) in self.spokes.iter_mut().enumerate() {
            if let Some(s) = s.as_mut().filter(|s| !s.departed) {
                if let Some(e) = read_spoke(peer, s) {
                    found.get_or_insert(e);
                }
            }
        }
        if let Some(e) = &found {
            if self.rank == 0 {
                // The hub passes the news on, so every rank hears it.
                let (culprit, frame) = abort_frame(self.rank, e);
                self.send_to_all(&frame, Some(culprit));
            }
        }
        found
    }

    fn wake_on<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) {
        for s in self.spokes.iter().flatten().filter(|s| !s.departed) {
            fds.push(PollFd::new(&s.stream, PollFlags::IN));
        }
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

impl Drop for StarControl {
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
