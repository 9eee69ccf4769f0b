//! Forming a group's links: the policy of which transport serves which pair. The bootstrap
//! forms the group over TCP and hands over plain connections; the mesh starts on them, and
//! pairs move to shared memory or RDMA where they can.

use crate::config::{Backend, Config};
use crate::error::Result;
use crate::transport::links::Links;
use crate::transport::progress::WaitPolicy;
use crate::transport::{shm, verbs, Transport};
use crate::{bootstrap, host, probe, transport};

/// Form the links `cfg` describes: the policy of which transport serves which pair.
///
/// One rank: nothing to connect. Otherwise the TCP bootstrap forms the group (authenticated,
/// settings agreed) and its mesh carries every pair at first. Then, as `BOLTCCL_BACKEND`
/// allows: ranks on one host (the same kernel and network namespace) move to shared memory,
/// and the pairs the device matrix cables move to RDMA queue pairs (where the verbs library
/// lists devices); the rest stay on TCP, all in one progress loop.
pub(crate) fn connect(cfg: &Config) -> Result<Box<dyn Transport>> {
    if cfg.world_size == 1 {
        return Ok(Box::new(transport::mem::world(1, cfg).pop().expect("one rank")));
    }
    let shm = matches!(cfg.backend, Backend::Shm | Backend::Auto);
    let rdma = cfg.backend == Backend::Verbs || (cfg.backend == Backend::Auto && rdma_available(cfg));
    // What this rank can check alone fails before it waits for the others.
    let rdma = rdma.then(|| verbs::plan(cfg)).transpose()?;
    let offer = if shm { shm_offer() } else { None };
    let links = ["tcp", if offer.is_some() { "+shm" } else { "" }, if rdma.is_some() { "+rdma" } else { "" }].concat();
    let boot = bootstrap::connect(cfg, &links, offer.as_ref().map(|o| o.name()))?;
    let (peers, job) = (boot.peers, boot.job);
    // Who competes for this rank's CPUs, for the wait policy: the ranks that may run on them
    // (a launcher may have pinned each rank to a core of its own), else every rank on the host.
    let wait = match host::cpu_contention(&peers, cfg.rank) {
        Some((contenders, cores)) => WaitPolicy::for_host(contenders, cores, cfg.spin),
        None => WaitPolicy::here(cfg.local_world_size.unwrap_or_else(|| host::local_ranks(&peers, cfg.rank)), cfg.spin),
    };
    let mut mesh = Links::over_tcp(cfg, boot.links, boot.control, wait)?;
    let local = host::local_peers(&peers, cfg.rank);
    if let Some(plan) = rdma {
        verbs::attach(&mut mesh, plan, cfg, &local)?;
    }
    if let Some(offer) = offer {
        shm::setup::attach(&mut mesh, offer, &peers, job, cfg)?;
        // Every rank's host, labelled by its lowest rank: what every rank's shared-memory
        // links are, known alike everywhere from bootstrap, so algorithms can use two levels.
        let hosts = (0..peers.len()).map(|r| host::local_peers(&peers, r).into_iter().fold(r, usize::min));
        mesh.set_hosts(hosts.collect());
    }
    Ok(Box::new(mesh))
}

/// This rank's offer of shared memory, or none (saying why) when it cannot listen for it.
fn shm_offer() -> Option<shm::setup::Offer> {
    match shm::setup::Offer::bind() {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!("shared memory unavailable ({e}); ranks on this host use TCP");
            None
        }
    }
}

/// For `BOLTCCL_BACKEND=auto`: whether a device matrix is configured and the verbs library
/// lists devices — saying why not in the log. Decided before any rank connects, from what
/// this node has; bootstrap then checks the choice like any agreed setting, so a node without
/// RDMA is named at start-up instead of failing on the first collective.
fn rdma_available(cfg: &Config) -> bool {
    if cfg.ibv_devices.is_none() {
        tracing::debug!("BOLTCCL_BACKEND=auto: no RDMA device matrix configured (BOLTCCL_IBV_DEVICES)");
        return false;
    }
    match probe::RdmaProbe::load(cfg.ibv_library.as_deref()).device_names() {
        Ok(names) if !names.is_empty() => true,
        Ok(_) => {
            tracing::warn!("BOLTCCL_BACKEND=auto: the verbs library lists no RDMA device; using TCP");
            false
        }
        Err(e) => {
            tracing::warn!("BOLTCCL_BACKEND=auto: RDMA unavailable ({e}); using TCP");
            false
        }
    }
}
