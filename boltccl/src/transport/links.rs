//! A group's links: per peer, the channel that serves it, and the control plane, driven by
//! the progress engine.

use super::progress::{Channel, Control, Engine, Pace, WaitPolicy};
use super::tcp::TcpChannel;
use super::{control::TcpControl, Limits, LinkKind, OnRecv, RecvOp, SendOp, Transport};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::topology::Cabling;
use std::net::TcpStream;

/// One rank's links to every other rank of its group.
pub(crate) struct Links {
    rank: usize,
    size: usize,
    engine: Engine,
    cabling: Cabling,
    aborted: bool,
    /// Shrinks tried so far (every vote names its attempt).
    attempts: u32,
}

impl Links {
    /// Links over one channel for every peer.
    pub(crate) fn new(
        rank: usize,
        size: usize,
        channel: Box<dyn Channel>,
        control: Box<dyn Control>,
        wait: WaitPolicy,
    ) -> Links {
        let engine = Engine {
            channels: vec![channel],
            route: vec![0; size],
            control,
            wait,
            pace: Pace::default(),
            told: false,
            lost: None,
        };
        Links { rank, size, engine, cabling: Cabling::uniform(size), aborted: false, attempts: 0 }
    }

    /// Every pair on the TCP connections of a formed group: `links[peer][stream]` the data
    /// connections, `control[peer]` the control connection to every other rank; `wait` how a
    /// blocked exchange waits (it depends on who shares this rank's cores).
    pub(crate) fn over_tcp(
        cfg: &Config,
        links: Vec<Vec<TcpStream>>,
        control: Vec<Option<TcpStream>>,
        wait: WaitPolicy,
    ) -> Result<Links> {
        let (rank, size) = (cfg.rank, cfg.world_size);
        tracing::debug!(rank, ?wait, "bootstrap: links connected");
        let io = |e| Error::io(rank, "socket setup", e);
        let tcp = TcpChannel::new(links).map_err(io)?;
        let control = TcpControl::new(rank, control).map_err(io)?;
        Ok(Links::new(rank, size, Box::new(tcp), Box::new(control), wait))
    }

    /// Serve `peers` with `channel` from now on, and choose algorithms from `cabling` when the
    /// channel's links are not all alike.
    pub(crate) fn attach(&mut self, channel: Box<dyn Channel>, peers: &[usize], cabling: Option<Cabling>) {
        let c = self.engine.channels.len();
        // The engine marks the channels an exchange uses in a 64-bit mask.
        assert!(c < 64, "a transport has a channel per kind of link, a handful at most");
        self.engine.channels.push(channel);
        for &p in peers {
            self.engine.route[p] = c;
        }
        if let Some(cabling) = cabling {
            self.cabling = cabling;
        }
    }

    /// Which ranks share a host (equal labels), for the algorithms.
    pub(crate) fn set_hosts(&mut self, hosts: Vec<usize>) {
        self.cabling = self.cabling.clone().with_hosts(hosts);
    }
}

impl Transport for Links {
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
        limits: &Limits<'_>,
    ) -> Result<()> {
        if self.aborted {
            return Err(Error::Internal("exchange on an aborted transport".into()));
        }
        self.engine.run(sends, recvs, on_recv, limits)
    }

    fn abort(&mut self, cause: &Error) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        // The data links stay open: the control plane tells every rank, and a shrink may
        // reuse them. They close when the links are dropped.
        self.engine.control.abort(cause);
    }

    fn cabling(&self) -> Cabling {
        self.cabling.clone()
    }

    fn shrink(&mut self, candidates: &[usize], timeout: std::time::Duration) -> Result<Vec<usize>> {
        let peers = |set: &[usize]| -> Vec<usize> { set.iter().copied().filter(|&q| q != self.rank).collect() };
        if peers(candidates).is_empty() {
            // Alone: nobody to agree with, no link to keep.
            self.aborted = false;
            return Ok(vec![self.rank]);
        }
        for q in peers(candidates) {
            let c = &self.engine.channels[self.engine.route[q]];
            if !c.can_resync() {
                return Err(Error::invalid(format!(
                    "a shrink cannot keep {} links yet (rank {q}): the survivors must form a new group (boltccl::init)",
                    c.kind().name()
                )));
            }
        }
        for c in self.engine.channels.iter_mut() {
            c.prepare_resync();
        }
        self.attempts = (self.attempts + 1).max(self.engine.control.last_attempt());
        let attempt = self.attempts;
        let members = self.engine.control.agree(candidates, attempt, timeout)?;
        let keep = peers(&members);
        for c in self.engine.channels.iter_mut() {
            c.resync(&keep, attempt, timeout)?;
        }
        self.engine.control.commit(&members, attempt, timeout)?;
        for c in self.engine.channels.iter_mut() {
            c.forget(&keep);
        }
        // A loss noticed after the exchange it ended was done is the old group's news.
        self.engine.lost = None;
        self.aborted = false;
        Ok(members)
    }

    fn link_kind(&self, peer: usize) -> LinkKind {
        if peer == self.rank {
            return LinkKind::Local;
        }
        self.engine.channels[self.engine.route[peer]].kind()
    }
}
