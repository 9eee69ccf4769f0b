//! A group's links: per peer, the channel that serves it, and the control plane, driven by
//! the progress engine.

use super::progress::{Channel, Control, Engine, WaitPolicy};
use super::tcp::TcpChannel;
use super::{control::StarControl, Limits, OnRecv, RecvOp, SendOp, Transport};
use crate::algo::select::Cabling;
use crate::config::Config;
use crate::error::{Error, Result};

/// One rank's links to every other rank of its group.
pub(crate) struct Mesh {
    rank: usize,
    size: usize,
    engine: Engine,
    cabling: Cabling,
    aborted: bool,
}

impl Mesh {
    /// Links over one channel for every peer.
    pub(crate) fn new(
        rank: usize,
        size: usize,
        channel: Box<dyn Channel>,
        control: Box<dyn Control>,
        wait: WaitPolicy,
    ) -> Mesh {
        let engine = Engine { channels: vec![channel], route: vec![0; size], control, wait };
        Mesh { rank, size, engine, cabling: Cabling::uniform(size), aborted: false }
    }

    /// Form the group over TCP (the bootstrap: coordinator, authentication, agreed settings)
    /// with every pair on the TCP mesh.
    pub(crate) fn over_tcp(cfg: &Config) -> Result<Mesh> {
        let boot = crate::bootstrap::connect(cfg)?;
        let (rank, size) = (cfg.rank, cfg.world_size);
        let me = &boot.hosts[rank];
        let local = cfg.local_world_size.unwrap_or_else(|| boot.hosts.iter().filter(|h| *h == me).count());
        let wait = WaitPolicy::here(local, cfg.spin);
        tracing::debug!(rank, local, ?wait, "bootstrap: mesh connected");
        let io = |e| Error::io(rank, "socket setup", e);
        let tcp = TcpChannel::new(boot.links).map_err(io)?;
        let control = StarControl::new(rank, boot.control).map_err(io)?;
        Ok(Mesh::new(rank, size, Box::new(tcp), Box::new(control), wait))
    }

    /// Serve `peers` with `channel` from now on, and choose algorithms from `cabling`.
    pub(crate) fn attach(&mut self, channel: Box<dyn Channel>, peers: &[usize], cabling: Cabling) {
        let c = self.engine.channels.len();
        self.engine.channels.push(channel);
        for &p in peers {
            self.engine.route[p] = c;
        }
        self.cabling = cabling;
    }
}

impl Transport for Mesh {
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
        self.engine.control.abort(cause);
        for c in self.engine.channels.iter_mut() {
            c.close();
        }
    }

    fn cabling(&self) -> Cabling {
        self.cabling.clone()
    }
}
