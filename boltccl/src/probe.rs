//! What this node has to offer, as data: its identity, the verbs library, the RDMA devices it
//! lists, their ports and addresses. `BOLTCCL_BACKEND=auto` decides from it, and `boltccl
//! doctor` turns it into findings and fixes. Nothing here runs a command or prints.

use crate::error::{Error, Result};
use crate::transport::verbs::errors::{hint, Verb};
use crate::transport::verbs::ffi::Context;
use crate::transport::verbs::loader::Verbs;
use crate::transport::verbs::{ipv4_gids, topology};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;

pub use crate::host::{host_identity, host_name};
pub use crate::transport::verbs::loader::install_hint;
pub use crate::transport::verbs::topology::{same_subnet, DeviceMatrix};

/// Whether ranks on this host can share memory: the segment, the doorbell and the set-up
/// socket are made and dropped at once. `Ok` carries the host identity they would match on.
pub fn shared_memory() -> Result<String> {
    let id = host_identity();
    if id.is_empty() {
        return Err(Error::Unsupported("no host identity on this OS: ranks on one host use TCP".into()));
    }
    crate::transport::shm::ring::Inbox::create(0, 1, 4096).map_err(|e| Error::io(0, "creating shared memory", e))?;
    crate::transport::shm::setup::Offer::bind()?;
    Ok(id)
}

/// The kernel's transparent huge page mode (`always`, `madvise` or `never`; `None` where the
/// kernel has none). Shared-memory transfers of large buffers are much faster from and into
/// buffers on huge pages: under `madvise`, numpy's arrays get them and torch's tensors only
/// with `THP_MEM_ALLOC_ENABLE=1`.
pub fn transparent_huge_pages() -> Option<String> {
    let modes = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    selected_mode(&modes)
}

/// The bracketed word of a sysfs choice list (`always [madvise] never` -> `madvise`).
fn selected_mode(modes: &str) -> Option<String> {
    let word = modes.split_whitespace().find(|w| w.starts_with('[') && w.ends_with(']'))?;
    Some(word.trim_matches(['[', ']']).to_string())
}

/// One RDMA device as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Device name (`rdma_en3`).
    pub name: String,
    /// Port 1 is ACTIVE.
    pub active: bool,
    /// The port state number (`IBV_PORT_*`), for messages.
    #[serde(default)]
    pub port_state: u32,
    /// Active MTU in bytes.
    pub mtu: usize,
    /// First IPv4-mapped GID: (index, address).
    pub ipv4_gid: Option<(i32, Ipv4Addr)>,
    /// The interface's IPv4 prefix length, when the interface is known (`rdma_<iface>`).
    pub prefix: Option<u8>,
    /// Queue pairs the device reports (when `ibv_query_device` is exported).
    pub max_qp: Option<i32>,
    /// Memory regions the device reports.
    pub max_mr: Option<i32>,
}

/// The verbs library this node would use (`BOLTCCL_IBV_LIBRARY` or the platform default),
/// loaded or not.
pub struct RdmaProbe {
    verbs: Result<Arc<Verbs>>,
}

impl RdmaProbe {
    /// Load `library` (or the platform's default verbs library). Never fails: a library that
    /// does not load is reported by [`RdmaProbe::library`].
    pub fn load(library: Option<&Path>) -> RdmaProbe {
        RdmaProbe { verbs: Verbs::load(library) }
    }

    /// The library's path, or why it did not load (with what to install).
    pub fn library(&self) -> std::result::Result<&Path, &Error> {
        self.verbs.as_ref().map(|v| v.path.as_path())
    }

    /// The devices the library lists (empty when it lists none).
    pub fn device_names(&self) -> Result<Vec<String>> {
        self.verbs.as_ref().map_err(Clone::clone)?.device_names()
    }

    /// Open `name` and read its port, first IPv4-mapped GID and limits.
    pub fn device(&self, name: &str) -> Result<DeviceInfo> {
        let verbs = self.verbs.as_ref().map_err(Clone::clone)?;
        let ctx = Context::open(verbs, name)?;
        let (port, gids) = ipv4_gids(&ctx)?;
        let attr = ctx.query_device();
        Ok(DeviceInfo {
            name: name.to_string(),
            active: port.state == verbs_abi::IBV_PORT_ACTIVE,
            port_state: port.state,
            mtu: verbs_abi::mtu_bytes(port.active_mtu).unwrap_or(0),
            ipv4_gid: gids.first().and_then(|(i, g)| g.ipv4_mapped().map(|a| (*i, a))),
            prefix: name.strip_prefix("rdma_").and_then(|iface| topology::interface_ipv4(iface).map(|(_, p)| p)),
            max_qp: attr.map(|a| a.max_qp),
            max_mr: attr.map(|a| a.max_mr),
        })
    }
}

/// What to do when a device does not open.
pub fn open_device_hint() -> String {
    hint(Verb::OpenDevice, 0)
}

/// The cause and fix for an errno seen in an RDMA error message, at the verbs where field
/// reports show it (for `boltccl doctor --explain`).
pub fn explain_errno(errno: i32) -> Vec<String> {
    let mut v = vec![
        format!("at RTR: {}", hint(Verb::ToRtr, errno)),
        format!("creating a queue pair: {}", hint(Verb::CreateQp, errno)),
    ];
    if errno == 12 {
        v.push(format!("posting receives: {}", hint(Verb::PostRecv, 12)));
    }
    v.push(format!(
        "allocating a protection domain (\"Couldn't allocate protection domain\"): {}",
        hint(Verb::AllocPd, errno)
    ));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_explanations() {
        let e = explain_errno(22).join("\n");
        assert!(e.contains("GID index") && e.contains("Thunderbolt Bridge"), "{e}");
        assert!(explain_errno(60)[0].contains("not reachable"));
        assert!(explain_errno(16)[1].contains("10 per device"));
        assert!(explain_errno(12).last().unwrap().contains("reboot"));
    }

    #[test]
    fn the_selected_huge_page_mode_is_read() {
        assert_eq!(selected_mode("always [madvise] never\n").as_deref(), Some("madvise"));
        assert_eq!(selected_mode("[always] madvise never").as_deref(), Some("always"));
        assert_eq!(selected_mode("always madvise never"), None);
    }

    #[test]
    fn a_missing_library_is_reported_not_raised() {
        let p = RdmaProbe::load(Some(Path::new("/nonexistent/libibverbs.so.1")));
        assert!(p.library().is_err());
        assert!(p.device_names().is_err());
    }
}
