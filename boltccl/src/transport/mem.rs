//! In-process transport: ranks are threads of one process, links are channels.
//!
//! For fast tests of the algorithms and for single-process users. Frames are real encoded
//! headers followed by the payload, so header checks, aborts and timeouts behave as on TCP.
//! Sends never block (channels are unbounded), so an exchange posts all its sends and then
//! takes its receives in order.

use super::{abort_fields, Limits, OnRecv, RecvOp, SendOp, Transport};
use crate::error::Error;
use crate::wire::{self, Header, Kind, HEADER_LEN};
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct World {
    /// The first abort, seen by every rank.
    aborted: Mutex<Option<Error>>,
}

/// One rank's end of an in-process world.
pub struct MemTransport {
    rank: usize,
    size: usize,
    world: Arc<World>,
    /// `to[p]` sends to rank `p`.
    to: Vec<Option<Sender<Vec<u8>>>>,
    /// `from[p]` receives from rank `p`.
    from: Vec<Option<Receiver<Vec<u8>>>>,
}

impl MemTransport {
    /// Create the transports of an `n`-rank world, one per rank, in rank order.
    pub fn world(n: usize) -> Vec<MemTransport> {
        let world = Arc::new(World { aborted: Mutex::new(None) });
        let mut to: Vec<Vec<Option<Sender<Vec<u8>>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let mut from: Vec<Vec<Option<Receiver<Vec<u8>>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    let (tx, rx) = unbounded();
                    to[a][b] = Some(tx);
                    from[b][a] = Some(rx);
                }
            }
        }
        to.into_iter()
            .zip(from)
            .enumerate()
            .map(|(rank, (to, from))| MemTransport { rank, size: n, world: world.clone(), to, from })
            .collect()
    }

    fn recv_one(&self, op: &mut RecvOp<'_>, limits: &Limits) -> Result<(), Error> {
        let rx = self.from[op.peer].as_ref().ok_or_else(|| Error::Internal("receive from self".into()))?;
        let deadline = Instant::now() + limits.timeout;
        let mut next_check = Instant::now() + super::INTERRUPT_EVERY;
        let frame = loop {
            if let Some(e) = self.world.aborted.lock().clone() {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout { op: limits.op.into(), rank: op.peer, after: limits.timeout });
            }
            if now >= next_check {
                limits.interrupted()?;
                next_check = now + super::INTERRUPT_EVERY;
            }
            match rx.recv_timeout((deadline - now).min(Duration::from_millis(5))) {
                Ok(f) => break f,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::PeerLost {
                        rank: op.peer,
                        detail: "its in-process transport was dropped".into(),
                    })
                }
            }
        };
        let head: &[u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().expect("frames start with a header");
        let got = Header::decode(head).map_err(|d| Error::Protocol { from: format!("rank {}", op.peer), detail: d })?;
        if got.kind == Kind::Abort {
            return Err(wire::abort_error(&got, &frame[HEADER_LEN..]));
        }
        wire::check(&op.expect, &got, op.peer)?;
        op.buf.copy_from_slice(&frame[HEADER_LEN..]);
        Ok(())
    }
}

impl Transport for MemTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn exchange(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        limits: &Limits,
    ) -> Result<(), Error> {
        for s in sends {
            debug_assert_eq!(s.header.len as usize, s.data.len());
            let mut frame = Vec::with_capacity(HEADER_LEN + s.data.len());
            frame.extend_from_slice(&s.header.encode());
            frame.extend_from_slice(s.data);
            let tx = self.to[s.peer].as_ref().ok_or_else(|| Error::Internal("send to self".into()))?;
            tx.send(frame)
                .map_err(|_| Error::PeerLost { rank: s.peer, detail: "its in-process transport was dropped".into() })?;
        }
        for i in 0..recvs.len() {
            self.recv_one(&mut recvs[i], limits)?;
            on_recv(recvs, i)?;
        }
        Ok(())
    }

    fn abort(&mut self, cause: &Error) {
        let (culprit, lost, reason) = abort_fields(self.rank, cause);
        let mut slot = self.world.aborted.lock();
        if slot.is_none() {
            *slot = Some(if lost {
                Error::PeerLost { rank: culprit, detail: reason }
            } else {
                Error::Aborted { rank: culprit, reason }
            });
        }
    }
}
