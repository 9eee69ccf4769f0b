//! Forming a verbs mesh: devices opened, one UC queue pair per cable, endpoints exchanged over
//! the TCP bootstrap, queue pairs brought to RTS with every receive posted before anyone sends.

use super::errors::Verb;
use super::ffi::Context;
use super::link::{Link, Shape, LINK_HDR};
use super::loader::Verbs;
use super::topology::{self, DeviceMatrix, MAX_CABLES};
use super::{VerbsChannel, MAX_MESSAGE, PORT};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::topology::Cabling;
use crate::transport::links::Links;
use crate::transport::{Limits, RecvOp, SendOp, Transport};
use crate::types::{Collective, DType, ReduceOp};
use crate::wire::verbs::{parse_endpoints, Endpoint, ENDPOINT_LEN};
use crate::wire::{Header, HEADER_LEN};
use std::sync::Arc;
use std::time::Duration;
use verbs_abi::*;
/// The IPv4-mapped GIDs of `ctx`'s port, in table order, and the port's attributes.
pub fn ipv4_gids(ctx: &Context) -> Result<(ibv_port_attr, Vec<(i32, ibv_gid)>)> {
    let port = ctx.query_port(PORT)?;
    let mut found = Vec::new();
    for i in 0..port.gid_tbl_len.clamp(0, 256) {
        // Some entries of a sparse table fail to read; only the mapped ones matter.
        if let Ok(g) = ctx.query_gid(PORT, i) {
            if g.ipv4_mapped().is_some() {
                found.push((i, g));
            }
        }
    }
    Ok((port, found))
}

/// A link before its peer's endpoint is known.
struct Pending {
    link: Link,
    gids: Vec<(i32, ibv_gid)>,
    mtu: ibv_mtu,
    lid: u16,
    psn: u32,
}

impl Pending {
    /// What the peer needs to connect to this link's queue pair.
    fn endpoint(&self, shape: Shape) -> Endpoint {
        Endpoint {
            gid: self.gids[0].1.bytes(),
            qpn: self.link.qp.qp_num(),
            psn: self.psn,
            mtu: self.mtu,
            lid: self.lid,
            recv_depth: shape.recv_depth as u32,
            slot: shape.slot as u32,
            reserved: 0,
        }
    }
}

fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).expect("the OS random source works");
    u32::from_le_bytes(b) & 0x00ff_ffff
}

/// Open the device toward `peer`, create the PD, CQ, UC QP and staging, move the QP to INIT.
fn open_link(verbs: &Arc<Verbs>, device: &str, peer: usize, shape: Shape, mr_cache: Option<usize>) -> Result<Pending> {
    let ctx = Context::open(verbs, device)?;
    let (port, gids) = ipv4_gids(&ctx)?;
    if port.state != IBV_PORT_ACTIVE {
        return Err(Error::Verbs {
            device: device.into(),
            what: format!(
                "port {PORT} is not active (state {}): the cable to rank {peer} is unplugged or the link is down; \
                 check it with `boltccl doctor`",
                port.state
            ),
        });
    }
    if gids.is_empty() {
        return Err(Error::Verbs {
            device: device.into(),
            what: "no IPv4-mapped GID: the interface has no IPv4 address. Assign one (a link-local address is \
                   enough, e.g. `sudo ifconfig <iface> inet 169.254.0.1 netmask 255.255.0.0 alias` on a Mac) and \
                   check that the Thunderbolt Bridge is disabled"
                .into(),
        });
    }
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq((shape.send_depth + shape.recv_depth + 4) as i32)?;
    let qp = pd.create_uc_qp(&cq, shape.send_depth as u32, shape.recv_depth as u32).map_err(|e| at_peer(e, peer))?;
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: PORT,
        qp_access_flags: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        ..Default::default()
    };
    qp.modify(&mut attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, Verb::ToInit, peer)?;
    let link = Link::new(peer, ctx, pd, cq, qp, shape, mr_cache)?;
    Ok(Pending { link, gids, mtu: port.active_mtu, lid: port.lid, psn: random_psn() })
}

fn at_peer(e: Error, peer: usize) -> Error {
    match e {
        Error::Verbs { device, what } => Error::Verbs { device, what: format!("{what} (link to rank {peer})") },
        other => other,
    }
}

/// RTR then RTS against the peer's endpoint, trying our IPv4-mapped GIDs in order while the
/// provider rejects the address vector (errno 22).
fn bring_up(p: &mut Pending, peer: &Endpoint) -> Result<()> {
    let qp = &p.link.qp;
    let mtu = p.mtu.min(peer.mtu);
    let mut last = None;
    for &(index, _) in &p.gids {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid { raw: peer.gid },
                    sgid_index: index as u8,
                    hop_limit: 1,
                    ..Default::default()
                },
                dlid: peer.lid,
                is_global: 1,
                port_num: PORT,
                ..Default::default()
            },
            ..Default::default()
        };
        let mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        match qp.modify(&mut attr, mask, Verb::ToRtr, p.link.peer) {
            Ok(()) => {
                tracing::debug!(peer = p.link.peer, gid_index = index, "queue pair ready to receive");
                last = None;
                break;
            }
            Err(e) => {
                tracing::debug!(peer = p.link.peer, gid_index = index, "RTR failed: {e}");
                last = Some(e);
            }
        }
    }
    if let Some(e) = last {
        return Err(e);
    }
    let mut attr = ibv_qp_attr { qp_state: IBV_QPS_RTS, sq_psn: p.psn, ..Default::default() };
    qp.modify(&mut attr, IBV_QP_STATE | IBV_QP_SQ_PSN, Verb::ToRts, p.link.peer)
}

/// A round over the TCP mesh with every peer: send `mine(peer)`, receive `len(peer)` bytes from each.
fn tcp_round(
    mesh: &mut Links,
    peers: &[usize],
    seq: u32,
    len: impl Fn(usize) -> usize,
    mine: impl Fn(usize) -> Vec<u8>,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    let h =
        |n: usize| Header::data(Collective::Barrier, u32::MAX, seq, DType::U8, ReduceOp::Sum, n as u64, 0).piece(0, n);
    let payloads: Vec<Vec<u8>> = peers.iter().map(|&p| mine(p)).collect();
    let sends: Vec<SendOp<'_>> =
        peers.iter().zip(&payloads).map(|(&peer, d)| SendOp { peer, header: h(d.len()), data: d }).collect();
    let mut bufs: Vec<Vec<u8>> = peers.iter().map(|&p| vec![0u8; len(p)]).collect();
    let mut recvs: Vec<RecvOp<'_>> =
        peers.iter().zip(bufs.iter_mut()).map(|(&peer, b)| RecvOp { peer, expect: h(b.len()), buf: b }).collect();
    let limits = Limits { timeout, op: "RDMA set-up", interrupt: None, bytes: 0, abort: None };
    mesh.exchange(&sends, &mut recvs, &mut |_, _| Ok(()), &limits)?;
    drop(recvs);
    Ok(bufs)
}

/// Bring up the queue pairs toward `peer`, one per cable, given the peer's endpoints (in its
/// own cable order). Returns the links in the lower rank's cable order.
fn connect_peer(rank: usize, peer: usize, mut mine: Vec<Pending>, blob: &[u8], shape: Shape) -> Result<Vec<Link>> {
    let eps = parse_endpoints(peer, blob, mine.len(), shape.slot)?;
    // Which cable is which: the matrix may list a pair's cables in a different order on the
    // two ranks (interface numbers change after re-cabling). Match by subnet when the
    // addresses tell; otherwise assume the listed order.
    let perm = if mine.len() == 1 {
        vec![0]
    } else {
        let here: Vec<_> = mine
            .iter()
            .map(|l| {
                let ip = l.gids[0].1.ipv4_mapped().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
                let iface = l.link.ctx.name().strip_prefix("rdma_").unwrap_or("");
                (ip, topology::interface_ipv4(iface).map(|(_, prefix)| prefix))
            })
            .collect();
        let there: Vec<_> = eps
            .iter()
            .map(|e| ibv_gid { raw: e.gid }.ipv4_mapped().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED))
            .collect();
        match topology::match_cables(&here, &there) {
            Some(perm) => {
                if perm.iter().enumerate().any(|(x, &y)| x != y) {
                    tracing::info!(
                        peer,
                        ?perm,
                        "the cables toward this rank are listed in another order there: matched by subnet"
                    );
                }
                perm
            }
            None => {
                tracing::warn!(
                    peer,
                    "cannot tell which of the {} cables toward rank {peer} is which from their addresses; assuming \
                     the same order on both ranks (give each cable its own subnet, e.g. a /30, to have them matched)",
                    mine.len()
                );
                (0..mine.len()).collect()
            }
        }
    };
    let mut links: Vec<Option<Link>> = (0..mine.len()).map(|_| None).collect();
    for (x, mut l) in mine.drain(..).enumerate() {
        let ep = &eps[perm[x]];
        bring_up(&mut l, ep)?;
        l.link.post_all_receives(ep.recv_depth as usize)?;
        // Both ranks number cables in the lower rank's order, so `part % cables` agrees.
        let logical = if rank < peer { x } else { perm[x] };
        links[logical] = Some(l.link);
    }
    Ok(links.into_iter().map(|l| l.expect("a permutation fills every cable")).collect())
}

/// What this rank can check alone before the group forms: the verbs library loads, the
/// device matrix reads, and its cable counts agree. Failing here fails fast, without waiting
/// for the other ranks.
pub(crate) struct Plan {
    verbs: Arc<Verbs>,
    matrix: DeviceMatrix,
    path: std::path::PathBuf,
}

/// Check what [`Plan`] says, for the verbs backend (the device matrix is required).
pub(crate) fn plan(cfg: &Config) -> Result<Plan> {
    let verbs = Verbs::load(cfg.ibv_library.as_deref())?;
    let path = cfg.ibv_devices.clone().ok_or_else(|| {
        Error::Config(
            "the verbs backend needs the device matrix: set BOLTCCL_IBV_DEVICES (or MLX_IBV_DEVICES) to its \
             JSON file (`boltccl doctor --hosts ...` writes one)"
                .into(),
        )
    })?;
    let matrix = DeviceMatrix::load(&path, cfg.world_size)?;
    let rank = cfg.rank;
    for p in (0..cfg.world_size).filter(|&p| p != rank) {
        let (here, there) = (matrix.cells[rank][p].len(), matrix.cells[p][rank].len());
        if here != there || here > MAX_CABLES {
            return Err(Error::Config(format!(
                "{}: rank {rank} lists {here} cable(s) toward rank {p} but rank {p} lists {there} toward rank {rank} \
                 (each pair needs the same count on both sides, at most {MAX_CABLES})",
                path.display()
            )));
        }
    }
    Ok(Plan { verbs, matrix, path })
}

/// Move the pairs the device matrix cables from `mesh`'s TCP links to RDMA queue pairs, but
/// for those in `elsewhere` (served by another channel, such as shared memory on one host).
pub(crate) fn attach(mesh: &mut Links, plan: Plan, cfg: &Config, elsewhere: &[usize]) -> Result<()> {
    let Plan { verbs, matrix, path } = plan;
    let (rank, size) = (cfg.rank, cfg.world_size);
    let tcp_peers = matrix.uncabled(rank);
    if !tcp_peers.is_empty() {
        tracing::info!(rank, ?tcp_peers, "no RDMA device toward these ranks in the matrix: using TCP for them");
    }
    // An RDMA group is never all shared memory: its pieces are the network's.
    let slot = (LINK_HDR + HEADER_LEN + crate::topology::chunk_bytes(cfg, cfg.world_size, false)).min(MAX_MESSAGE);
    let shape = Shape { slot, recv_depth: cfg.ibv_recv_depth, send_depth: cfg.ibv_send_depth };
    let peers: Vec<usize> =
        (0..size).filter(|&p| p != rank && !tcp_peers.contains(&p) && !elsewhere.contains(&p)).collect();
    let cables: Vec<&[String]> = (0..size).map(|p| matrix.cells[rank][p].as_slice()).collect();
    let timeout = cfg.init_timeout;
    same_cabling_everywhere(mesh, &matrix, &path, rank, size, timeout)?;
    let fail = |mesh: &mut Links, e: Error| -> Error {
        mesh.abort(&e);
        e
    };
    // Local set-up: one queue pair per cable. On error every object made so far is dropped
    // (released) on the way out.
    let mr_cache = cfg.ibv_zero_copy.then_some(cfg.ibv_mr_cache);
    let mut pending: Vec<Vec<Pending>> = (0..size).map(|_| Vec::new()).collect();
    for &p in &peers {
        for device in cables[p] {
            match open_link(&verbs, device, p, shape, mr_cache) {
                Ok(l) => pending[p].push(l),
                Err(e) => return Err(fail(mesh, e)),
            }
        }
    }
    let mine = |p: usize| pending[p].iter().flat_map(|l| l.endpoint(shape).encode()).collect();
    let theirs = tcp_round(mesh, &peers, 0, |p| cables[p].len() * ENDPOINT_LEN, mine, timeout)?;
    let mut links: Vec<Vec<Link>> = (0..size).map(|_| Vec::new()).collect();
    for (&p, blob) in peers.iter().zip(&theirs) {
        match connect_peer(rank, p, std::mem::take(&mut pending[p]), blob, shape) {
            Ok(l) => links[p] = l,
            Err(e) => return Err(fail(mesh, e)),
        }
    }
    // Every receive is posted on this rank; wait until the same holds everywhere.
    tcp_round(mesh, &peers, 1, |_| 8, |_| b"RDMA-OK!".to_vec(), timeout)?;
    tracing::info!(rank, size, slot, "RDMA verbs mesh ready ({})", verbs.path.display());
    mesh.attach(Box::new(VerbsChannel { rank, links }), &peers, Some(Cabling::from_links(matrix.cabled())));
    Ok(())
}

/// Every rank picks algorithms from the whole matrix: check that all ranks read the same
/// cabling before anyone opens a device (a rank expecting a cable its peer does not list would
/// otherwise wait for endpoints that never come).
fn same_cabling_everywhere(
    mesh: &mut Links,
    matrix: &DeviceMatrix,
    path: &std::path::Path,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> Result<()> {
    let digest = matrix.digest();
    let everyone: Vec<usize> = (0..size).filter(|&p| p != rank).collect();
    let digests = tcp_round(mesh, &everyone, 2, |_| 4, |_| digest.to_le_bytes().to_vec(), timeout)?;
    for (&p, d) in everyone.iter().zip(&digests) {
        let theirs = u32::from_le_bytes(d[..4].try_into().expect("4 bytes"));
        if theirs != digest {
            let e = Error::Mismatch {
                rank: p,
                what: format!(
                    "{} describes different cabling here (digest {digest:#x}) than on rank {p} ({theirs:#x}): give \
                     every node the same device matrix (`boltccl doctor --hosts ...` writes one)",
                    path.display()
                ),
            };
            mesh.abort(&e);
            return Err(e);
        }
    }
    Ok(())
}
