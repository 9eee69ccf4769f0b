//! Turning a failed verb into a message with its cause and its fix.
//!
//! JACCL reports "failed with errno 22" and leaves the user to search the issue tracker. The
//! errors seen in the field (see the platform notes) each have a known cause; this module
//! names it at the verb where it happens.

use crate::error::Error;
use verbs_abi::*;

/// Which verb failed (the errno means different things at different verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `ibv_open_device`
    OpenDevice,
    /// `ibv_alloc_pd`
    AllocPd,
    /// `ibv_create_cq`
    CreateCq,
    /// `ibv_create_qp`
    CreateQp,
    /// `ibv_modify_qp` to INIT
    ToInit,
    /// `ibv_modify_qp` to RTR
    ToRtr,
    /// `ibv_modify_qp` to RTS
    ToRts,
    /// `ibv_modify_qp` to ERR (flushing sends after a failure)
    ToErr,
    /// `ibv_reg_mr`
    RegMr,
    /// `ibv_query_port` / `ibv_query_gid`
    Query,
    /// `ibv_post_send`
    PostSend,
    /// `ibv_post_recv`
    PostRecv,
    /// `ibv_poll_cq`
    PollCq,
}

impl Verb {
    /// How the verb is called in messages.
    pub fn name(self) -> &'static str {
        match self {
            Verb::OpenDevice => "opening the device",
            Verb::AllocPd => "allocating a protection domain",
            Verb::CreateCq => "creating a completion queue",
            Verb::CreateQp => "creating a queue pair",
            Verb::ToInit => "changing the queue pair to INIT",
            Verb::ToRtr => "changing the queue pair to RTR",
            Verb::ToRts => "changing the queue pair to RTS",
            Verb::ToErr => "moving the queue pair to the error state",
            Verb::RegMr => "registering memory",
            Verb::Query => "querying the port",
            Verb::PostSend => "posting a send",
            Verb::PostRecv => "posting a receive",
            Verb::PollCq => "polling the completion queue",
        }
    }
}

const BRIDGE: &str = "on a Mac, make sure the Thunderbolt Bridge is disabled (System Settings > Network; macOS \
    re-enables it after updates) and that the Thunderbolt interface has an IPv4 address (a link-local 169.254.x.y \
    is enough) so it publishes an IPv4-mapped GID; `boltccl doctor` checks both";

/// The cause and fix for `errno` at `verb`. `errno` is the positive errno value (macOS and
/// Linux share 12, 16 and 22; ETIMEDOUT is 60 on macOS and 110 on Linux, both accepted).
pub fn hint(verb: Verb, errno: i32) -> String {
    let enotsup = errno == libc::EOPNOTSUPP || errno == 102 || errno == 95;
    match (verb, errno) {
        (Verb::ToRtr, 22) => format!(
            "the address vector was rejected: wrong GID index, no IPv4-mapped GID, or the Thunderbolt Bridge is \
             active; {BRIDGE}"
        ),
        (Verb::ToRtr, 60) | (Verb::ToRtr, 110) => "the peer's GID is not reachable over this device: the cable \
             goes somewhere else (check the device matrix, BOLTCCL_IBV_DEVICES, row by row with `boltccl doctor \
             --hosts ...`) or the chosen GID routes via another interface"
            .into(),
        (Verb::CreateQp, 16) | (Verb::ToInit, 16) | (Verb::ToRtr, 16) | (Verb::ToRts, 16) => {
            "the device is busy: either it already has its maximum of queue pairs (Apple's provider allows 10 \
             per device; use fewer ranks per node or a ring), or resources of a crashed job are still held \
             (stop stray processes using RDMA; if none remain, reboot)"
                .into()
        }
        (Verb::CreateQp, _) if enotsup => {
            "the provider does not support this queue pair type; boltccl only uses UC, so the library is not a \
             usable RDMA provider"
                .into()
        }
        (Verb::AllocPd, _) | (Verb::OpenDevice, _) => format!(
            "the port is down or the provider is out of protection domains (older RDMA stacks leaked one per \
             failed init; after about 60 the only cure is a reboot); check the cable and `boltccl doctor`; {BRIDGE}"
        ),
        (Verb::RegMr, 12) | (Verb::RegMr, 16) => "too many memory registrations on this device (Apple's provider \
             allows about 100): lower BOLTCCL_IBV_SEND_DEPTH/RECV_DEPTH or run fewer ranks per node"
            .into(),
        (Verb::PostRecv, 12) => "too many receives outstanding (Apple's provider fails at about 62): lower \
             BOLTCCL_IBV_RECV_DEPTH to 32 or less"
            .into(),
        (_, 5) => "the device reported an I/O error: the cable was unplugged, the port went down, or the driver \
             failed; check the link and `boltccl doctor`, then restart the job"
            .into(),
        (_, 2) => "a stale 'no such file' error: usually another rank failed during start-up and closed its side; \
             look at the other ranks' first error"
            .into(),
        _ => format!("see `boltccl doctor`; {BRIDGE}"),
    }
}

/// An error for a verb that returned `errno` on `device`, while connecting to `peer` if known.
pub fn verb_error(verb: Verb, device: &str, peer: Option<usize>, errno: i32) -> Error {
    let to = peer.map(|p| format!(" for the link to rank {p}")).unwrap_or_default();
    let os = std::io::Error::from_raw_os_error(errno);
    Error::Verbs {
        device: device.to_string(),
        what: format!("{}{to} failed with errno {errno} ({os}): {}", verb.name(), hint(verb, errno)),
    }
}

/// The name of a work-completion status.
pub fn wc_status_name(status: ibv_wc_status) -> &'static str {
    match status {
        IBV_WC_SUCCESS => "success",
        IBV_WC_LOC_LEN_ERR => "local length error",
        IBV_WC_LOC_QP_OP_ERR => "local QP operation error",
        IBV_WC_LOC_PROT_ERR => "local protection error",
        IBV_WC_WR_FLUSH_ERR => "work request flushed",
        IBV_WC_REM_ACCESS_ERR => "remote access error",
        IBV_WC_RETRY_EXC_ERR => "retry count exceeded",
        IBV_WC_FATAL_ERR => "fatal error",
        IBV_WC_GENERAL_ERR => "general error",
        _ => "error",
    }
}

/// An error for a completion with a bad status.
pub fn completion_error(device: &str, peer: usize, sending: bool, status: ibv_wc_status, vendor: u32) -> Error {
    let dir = if sending { "send to" } else { "receive from" };
    let why = match status {
        IBV_WC_WR_FLUSH_ERR => {
            "the queue pair went to the error state (an earlier error, the device failing, or \
             the link going down)"
        }
        IBV_WC_LOC_LEN_ERR => {
            "a message was longer than the receive buffer: the ranks disagree on \
             BOLTCCL_CHUNK_BYTES or run different boltccl versions"
        }
        IBV_WC_LOC_PROT_ERR => "a buffer was not registered (a bug in boltccl, please report)",
        _ => "the device or link failed",
    };
    Error::Verbs {
        device: device.to_string(),
        what: format!(
            "{dir} rank {peer} completed with status {status} ({}, vendor error {vendor}): {why}; restart the job",
            wc_status_name(status)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field error from the platform notes gets its cause and its fix.
    #[test]
    fn field_errors_are_explained() {
        let m = verb_error(Verb::ToRtr, "rdma_en3", Some(1), 22).to_string();
        assert!(m.contains("RTR") && m.contains("errno 22") && m.contains("GID index"), "{m}");
        assert!(m.contains("Thunderbolt Bridge is disabled") && m.contains("169.254"), "{m}");
        let m = verb_error(Verb::ToRtr, "rdma_en3", Some(1), 60).to_string();
        assert!(m.contains("not reachable") && m.contains("device matrix"), "{m}");
        let m = verb_error(Verb::CreateQp, "rdma_en3", Some(2), 16).to_string();
        assert!(m.contains("10") && m.contains("crashed job") && m.contains("reboot"), "{m}");
        let m = verb_error(Verb::AllocPd, "rdma_en3", None, 12).to_string();
        assert!(m.contains("port is down") && m.contains("reboot"), "{m}");
        let m = verb_error(Verb::PostRecv, "rdma_en3", Some(0), 12).to_string();
        assert!(m.contains("RECV_DEPTH"), "{m}");
        let m = verb_error(Verb::PostSend, "rdma_en3", Some(0), 2).to_string();
        assert!(m.contains("another rank failed during start-up"), "{m}");
        let m = verb_error(Verb::CreateQp, "rdma_en3", Some(0), 102).to_string();
        assert!(m.contains("only uses UC"), "{m}");
        let m = completion_error("rdma_lo", 3, false, IBV_WC_LOC_LEN_ERR, 0).to_string();
        assert!(m.contains("rank 3") && m.contains("BOLTCCL_CHUNK_BYTES"), "{m}");
    }
}
