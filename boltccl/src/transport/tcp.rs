//! TCP links: a full mesh of non-blocking sockets.
//!
//! Each peer has `BOLTCCL_TCP_STREAMS` connections; the frames' queues are [`Streams`]. A closed
//! or reset connection names the peer at once; a waiting rank sleeps in `poll` on the sockets
//! it waits for.

use super::progress::{Channel, Wake};
use super::stream::Streams;
use super::{LinkKind, OnRecv, RecvOp, SendOp};
use crate::error::Result;
use rustix::event::{PollFd, PollFlags};
use std::io;
use std::net::{Shutdown, TcpStream};

/// One rank's TCP links to every peer it reaches over TCP.
pub(crate) struct TcpChannel(Streams<TcpStream>);

impl TcpChannel {
    /// Links from connected, authenticated sockets (`links[peer][stream]`).
    pub(crate) fn new(links: Vec<Vec<TcpStream>>) -> io::Result<TcpChannel> {
        for s in links.iter().flatten() {
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
        }
        Ok(TcpChannel(Streams::new(links)))
    }
}

impl Channel for TcpChannel {
    fn kind(&self) -> LinkKind {
        LinkKind::Tcp
    }

    fn start(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        _: &mut OnRecv<'_>,
        mine: &dyn Fn(usize) -> bool,
        _: u32,
    ) -> Result<bool> {
        // Every move is a system call: the engine's pumps make them.
        self.0.begin(sends, recvs, mine)?;
        Ok(false)
    }

    fn pump(&mut self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        self.0.pump(sends, recvs, on_recv)
    }

    fn waiting_on(&self) -> Option<usize> {
        self.0.waiting_on()
    }

    fn wake_on<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> Wake {
        for (s, read) in self.0.pending_links() {
            fds.push(PollFd::new(s, if read { PollFlags::IN } else { PollFlags::OUT }));
        }
        Wake::Poll
    }

    fn can_resync(&self) -> bool {
        true
    }

    fn resync(&mut self, keep: &[usize], attempt: u32, timeout: std::time::Duration) -> Result<()> {
        self.0.resync(keep, attempt, timeout, |pending, left| {
            let mut fds: Vec<PollFd<'_>> = pending
                .iter()
                .map(|&(s, read, write)| {
                    let mut f = PollFlags::empty();
                    f.set(PollFlags::IN, read);
                    f.set(PollFlags::OUT, write);
                    PollFd::new(s, f)
                })
                .collect();
            let ms = left.as_millis().clamp(1, 10) as i32;
            let _ = rustix::event::poll(&mut fds, ms);
        })
    }

    fn forget(&mut self, keep: &[usize]) {
        for (peer, l) in self.0.links.iter().enumerate() {
            if !keep.contains(&peer) {
                for s in l {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
        self.0.forget(keep);
    }
}
