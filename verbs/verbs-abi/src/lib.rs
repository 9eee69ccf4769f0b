//! `#[repr(C)]` definitions of the subset of the libibverbs ABI that boltccl needs.
//!
//! The layouts follow rdma-core's `<infiniband/verbs.h>` (rdma-core 44, Debian 12 package
//! `libibverbs-dev`). They are plain types: this crate links nothing. The integration test
//! `tests/layout.rs` compiles a C program against the real header and checks every `sizeof`,
//! `offsetof` and constant defined here.
//!
//! Naming keeps the C spelling (`ibv_qp_attr`, `IBV_QPS_RTR`) so code reads like the header.
//! C enums are `u32`/`i32` type aliases plus constants, because a C enum field may legally hold
//! values a Rust enum could not represent.
//!
//! Anonymous unions of the header are given names here: `ibv_wc::imm_data` (union with
//! `invalidated_rkey`, both `u32`), `ibv_send_wr::imm_data` (union with `invalidate_rkey`) and
//! `ibv_send_wr::bind_mw_tso` (the trailing `bind_mw`/`tso` union).
//!
//! Apple's SDK header has not been compared with this layout; see the boltccl platform notes.

#![allow(non_camel_case_types)]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

/// `pthread_mutex_t` as the platform's libc defines it (embedded in several verbs structs).
pub type pthread_mutex_t = libc::pthread_mutex_t;
/// `pthread_cond_t` as the platform's libc defines it (embedded in several verbs structs).
pub type pthread_cond_t = libc::pthread_cond_t;

// ---------------------------------------------------------------------------------------------
// Enums and constants
// ---------------------------------------------------------------------------------------------

/// `enum ibv_node_type`.
pub type ibv_node_type = c_int;
/// Unknown node type.
pub const IBV_NODE_UNKNOWN: ibv_node_type = -1;
/// InfiniBand channel adapter.
pub const IBV_NODE_CA: ibv_node_type = 1;
/// RDMA NIC (iWARP-style).
pub const IBV_NODE_RNIC: ibv_node_type = 4;
/// Unspecified node type.
pub const IBV_NODE_UNSPECIFIED: ibv_node_type = 7;

/// `enum ibv_transport_type`.
pub type ibv_transport_type = c_int;
/// Unknown transport.
pub const IBV_TRANSPORT_UNKNOWN: ibv_transport_type = -1;
/// InfiniBand transport (also used by RoCE).
pub const IBV_TRANSPORT_IB: ibv_transport_type = 0;
/// iWARP transport.
pub const IBV_TRANSPORT_IWARP: ibv_transport_type = 1;
/// Unspecified transport.
pub const IBV_TRANSPORT_UNSPECIFIED: ibv_transport_type = 4;

/// `enum ibv_atomic_cap`.
pub type ibv_atomic_cap = c_uint;
/// No atomic operations.
pub const IBV_ATOMIC_NONE: ibv_atomic_cap = 0;

/// `enum ibv_mtu`: path MTU encoding (not bytes).
pub type ibv_mtu = c_uint;
/// 256-byte MTU.
pub const IBV_MTU_256: ibv_mtu = 1;
/// 512-byte MTU.
pub const IBV_MTU_512: ibv_mtu = 2;
/// 1024-byte MTU.
pub const IBV_MTU_1024: ibv_mtu = 3;
/// 2048-byte MTU.
pub const IBV_MTU_2048: ibv_mtu = 4;
/// 4096-byte MTU.
pub const IBV_MTU_4096: ibv_mtu = 5;

/// Bytes of an `ibv_mtu` value, or `None` when the value is not a valid MTU.
pub fn mtu_bytes(mtu: ibv_mtu) -> Option<usize> {
    match mtu {
        IBV_MTU_256..=IBV_MTU_4096 => Some(128usize << mtu),
        _ => None,
    }
}

/// `enum ibv_port_state`.
pub type ibv_port_state = c_uint;
/// Port state: no state change.
pub const IBV_PORT_NOP: ibv_port_state = 0;
/// Port is down.
pub const IBV_PORT_DOWN: ibv_port_state = 1;
/// Port is initializing.
pub const IBV_PORT_INIT: ibv_port_state = 2;
/// Port is armed.
pub const IBV_PORT_ARMED: ibv_port_state = 3;
/// Port is active.
pub const IBV_PORT_ACTIVE: ibv_port_state = 4;

/// Link layer unspecified (`port_attr.link_layer`).
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
/// InfiniBand link layer.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// Ethernet link layer (RoCE).
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `enum ibv_wc_status`.
pub type ibv_wc_status = c_uint;
/// Success.
pub const IBV_WC_SUCCESS: ibv_wc_status = 0;
/// Local length error (receive buffer too small, message too long).
pub const IBV_WC_LOC_LEN_ERR: ibv_wc_status = 1;
/// Local QP operation error.
pub const IBV_WC_LOC_QP_OP_ERR: ibv_wc_status = 2;
/// Local EE context operation error.
pub const IBV_WC_LOC_EEC_OP_ERR: ibv_wc_status = 3;
/// Local protection error (bad lkey or address outside the MR).
pub const IBV_WC_LOC_PROT_ERR: ibv_wc_status = 4;
/// Work request flushed (QP in error state).
pub const IBV_WC_WR_FLUSH_ERR: ibv_wc_status = 5;
/// Memory window bind error.
pub const IBV_WC_MW_BIND_ERR: ibv_wc_status = 6;
/// Bad response error.
pub const IBV_WC_BAD_RESP_ERR: ibv_wc_status = 7;
/// Local access error.
pub const IBV_WC_LOC_ACCESS_ERR: ibv_wc_status = 8;
/// Remote invalid request error.
pub const IBV_WC_REM_INV_REQ_ERR: ibv_wc_status = 9;
/// Remote access error.
pub const IBV_WC_REM_ACCESS_ERR: ibv_wc_status = 10;
/// Remote operation error.
pub const IBV_WC_REM_OP_ERR: ibv_wc_status = 11;
/// Transport retry counter exceeded.
pub const IBV_WC_RETRY_EXC_ERR: ibv_wc_status = 12;
/// RNR retry counter exceeded.
pub const IBV_WC_RNR_RETRY_EXC_ERR: ibv_wc_status = 13;
/// Fatal error.
pub const IBV_WC_FATAL_ERR: ibv_wc_status = 19;
/// Response timeout error.
pub const IBV_WC_RESP_TIMEOUT_ERR: ibv_wc_status = 20;
/// General error.
pub const IBV_WC_GENERAL_ERR: ibv_wc_status = 21;

/// `enum ibv_wc_opcode`.
pub type ibv_wc_opcode = c_uint;
/// Send completion.
pub const IBV_WC_SEND: ibv_wc_opcode = 0;
/// RDMA write completion.
pub const IBV_WC_RDMA_WRITE: ibv_wc_opcode = 1;
/// RDMA read completion.
pub const IBV_WC_RDMA_READ: ibv_wc_opcode = 2;
/// Receive completion (`opcode & IBV_WC_RECV` tests for any receive).
pub const IBV_WC_RECV: ibv_wc_opcode = 1 << 7;
/// Receive of an RDMA write with immediate.
pub const IBV_WC_RECV_RDMA_WITH_IMM: ibv_wc_opcode = (1 << 7) + 1;

/// `enum ibv_wc_flags`: the completion carried a GRH.
pub const IBV_WC_GRH: c_uint = 1 << 0;
/// `enum ibv_wc_flags`: `imm_data` is valid.
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
/// `enum ibv_wc_flags`: `invalidated_rkey` is valid.
pub const IBV_WC_WITH_INV: c_uint = 1 << 3;

/// `enum ibv_access_flags`: local write (required for receive buffers).
pub const IBV_ACCESS_LOCAL_WRITE: c_uint = 1;
/// Remote write access.
pub const IBV_ACCESS_REMOTE_WRITE: c_uint = 1 << 1;
/// Remote read access.
pub const IBV_ACCESS_REMOTE_READ: c_uint = 1 << 2;
/// Remote atomic access.
pub const IBV_ACCESS_REMOTE_ATOMIC: c_uint = 1 << 3;
/// Memory window bind.
pub const IBV_ACCESS_MW_BIND: c_uint = 1 << 4;
/// Zero-based addressing.
pub const IBV_ACCESS_ZERO_BASED: c_uint = 1 << 5;
/// On-demand paging.
pub const IBV_ACCESS_ON_DEMAND: c_uint = 1 << 6;
/// Huge pages hint.
pub const IBV_ACCESS_HUGETLB: c_uint = 1 << 7;
/// First of the "optional" access flags (`IBV_ACCESS_OPTIONAL_FIRST`).
pub const IBV_ACCESS_OPTIONAL_FIRST: c_uint = 1 << 20;
/// Relaxed ordering (an optional flag).
pub const IBV_ACCESS_RELAXED_ORDERING: c_uint = IBV_ACCESS_OPTIONAL_FIRST;

/// `enum ibv_qp_type`.
pub type ibv_qp_type = c_uint;
/// Reliable connected.
pub const IBV_QPT_RC: ibv_qp_type = 2;
/// Unreliable connected (the only type Apple's provider supports).
pub const IBV_QPT_UC: ibv_qp_type = 3;
/// Unreliable datagram.
pub const IBV_QPT_UD: ibv_qp_type = 4;
/// Raw packet.
pub const IBV_QPT_RAW_PACKET: ibv_qp_type = 8;
/// XRC send.
pub const IBV_QPT_XRC_SEND: ibv_qp_type = 9;
/// XRC receive.
pub const IBV_QPT_XRC_RECV: ibv_qp_type = 10;
/// Driver-specific.
pub const IBV_QPT_DRIVER: ibv_qp_type = 0xff;

/// `enum ibv_qp_state`.
pub type ibv_qp_state = c_uint;
/// Reset.
pub const IBV_QPS_RESET: ibv_qp_state = 0;
/// Initialized.
pub const IBV_QPS_INIT: ibv_qp_state = 1;
/// Ready to receive.
pub const IBV_QPS_RTR: ibv_qp_state = 2;
/// Ready to send.
pub const IBV_QPS_RTS: ibv_qp_state = 3;
/// Send queue drained.
pub const IBV_QPS_SQD: ibv_qp_state = 4;
/// Send queue error.
pub const IBV_QPS_SQE: ibv_qp_state = 5;
/// Error.
pub const IBV_QPS_ERR: ibv_qp_state = 6;
/// Unknown.
pub const IBV_QPS_UNKNOWN: ibv_qp_state = 7;

/// `enum ibv_mig_state`.
pub type ibv_mig_state = c_uint;
/// Path migrated.
pub const IBV_MIG_MIGRATED: ibv_mig_state = 0;

/// `enum ibv_qp_attr_mask` (bits of the `attr_mask` argument of `ibv_modify_qp`).
pub type ibv_qp_attr_mask = c_int;
/// `qp_state` is valid.
pub const IBV_QP_STATE: ibv_qp_attr_mask = 1 << 0;
/// `cur_qp_state` is valid.
pub const IBV_QP_CUR_STATE: ibv_qp_attr_mask = 1 << 1;
/// `en_sqd_async_notify` is valid.
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: ibv_qp_attr_mask = 1 << 2;
/// `qp_access_flags` is valid.
pub const IBV_QP_ACCESS_FLAGS: ibv_qp_attr_mask = 1 << 3;
/// `pkey_index` is valid.
pub const IBV_QP_PKEY_INDEX: ibv_qp_attr_mask = 1 << 4;
/// `port_num` is valid.
pub const IBV_QP_PORT: ibv_qp_attr_mask = 1 << 5;
/// `qkey` is valid.
pub const IBV_QP_QKEY: ibv_qp_attr_mask = 1 << 6;
/// `ah_attr` (the address vector) is valid.
pub const IBV_QP_AV: ibv_qp_attr_mask = 1 << 7;
/// `path_mtu` is valid.
pub const IBV_QP_PATH_MTU: ibv_qp_attr_mask = 1 << 8;
/// `timeout` is valid.
pub const IBV_QP_TIMEOUT: ibv_qp_attr_mask = 1 << 9;
/// `retry_cnt` is valid.
pub const IBV_QP_RETRY_CNT: ibv_qp_attr_mask = 1 << 10;
/// `rnr_retry` is valid.
pub const IBV_QP_RNR_RETRY: ibv_qp_attr_mask = 1 << 11;
/// `rq_psn` is valid.
pub const IBV_QP_RQ_PSN: ibv_qp_attr_mask = 1 << 12;
/// `max_rd_atomic` is valid.
pub const IBV_QP_MAX_QP_RD_ATOMIC: ibv_qp_attr_mask = 1 << 13;
/// `alt_ah_attr` etc. are valid.
pub const IBV_QP_ALT_PATH: ibv_qp_attr_mask = 1 << 14;
/// `min_rnr_timer` is valid.
pub const IBV_QP_MIN_RNR_TIMER: ibv_qp_attr_mask = 1 << 15;
/// `sq_psn` is valid.
pub const IBV_QP_SQ_PSN: ibv_qp_attr_mask = 1 << 16;
/// `max_dest_rd_atomic` is valid.
pub const IBV_QP_MAX_DEST_RD_ATOMIC: ibv_qp_attr_mask = 1 << 17;
/// `path_mig_state` is valid.
pub const IBV_QP_PATH_MIG_STATE: ibv_qp_attr_mask = 1 << 18;
/// `cap` is valid.
pub const IBV_QP_CAP: ibv_qp_attr_mask = 1 << 19;
/// `dest_qp_num` is valid.
pub const IBV_QP_DEST_QPN: ibv_qp_attr_mask = 1 << 20;
/// `rate_limit` is valid.
pub const IBV_QP_RATE_LIMIT: ibv_qp_attr_mask = 1 << 25;

/// `enum ibv_wr_opcode`.
pub type ibv_wr_opcode = c_uint;
/// RDMA write.
pub const IBV_WR_RDMA_WRITE: ibv_wr_opcode = 0;
/// RDMA write with immediate.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wr_opcode = 1;
/// Send.
pub const IBV_WR_SEND: ibv_wr_opcode = 2;
/// Send with immediate data.
pub const IBV_WR_SEND_WITH_IMM: ibv_wr_opcode = 3;
/// RDMA read.
pub const IBV_WR_RDMA_READ: ibv_wr_opcode = 4;
/// Atomic compare and swap.
pub const IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wr_opcode = 5;
/// Atomic fetch and add.
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wr_opcode = 6;

/// `enum ibv_send_flags`: fence.
pub const IBV_SEND_FENCE: c_uint = 1 << 0;
/// Generate a completion for this send.
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
/// Solicited event.
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;
/// Copy the payload at post time; no lkey check.
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
/// IP checksum offload.
pub const IBV_SEND_IP_CSUM: c_uint = 1 << 4;

/// `IBV_SYSFS_NAME_MAX`: size of the name arrays of `ibv_device`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`: size of the path arrays of `ibv_device`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

// ---------------------------------------------------------------------------------------------
// Structs
// ---------------------------------------------------------------------------------------------

/// The `global` view of `union ibv_gid` (both halves big-endian).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid_global {
    /// Subnet prefix, network byte order.
    pub subnet_prefix: u64,
    /// Interface id, network byte order.
    pub interface_id: u64,
}

/// `union ibv_gid`: a 128-bit global identifier.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    /// Raw bytes.
    pub raw: [u8; 16],
    /// Prefix/interface view.
    pub global: ibv_gid_global,
}

impl Default for ibv_gid {
    fn default() -> Self {
        ibv_gid { raw: [0; 16] }
    }
}

impl ibv_gid {
    /// The raw 16 bytes.
    pub fn bytes(&self) -> [u8; 16] {
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        unsafe { self.raw }
    }

    /// The IPv4 address when this is an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4_mapped(&self) -> Option<std::net::Ipv4Addr> {
        let b = self.bytes();
        if b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff {
            Some(std::net::Ipv4Addr::new(b[12], b[13], b[14], b[15]))
        } else {
            None
        }
    }
}

impl std::fmt::Debug for ibv_gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::net::Ipv6Addr::from(self.bytes()))
    }
}

/// `struct _ibv_device_ops`: two unused legacy slots at the start of `ibv_device`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct _ibv_device_ops {
    /// Unused legacy slot.
    pub _dummy1: *mut c_void,
    /// Unused legacy slot.
    pub _dummy2: *mut c_void,
}

/// `struct ibv_device`: one RDMA device as listed by `ibv_get_device_list`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device {
    /// Legacy ops (unused).
    pub _ops: _ibv_device_ops,
    /// Node type.
    pub node_type: ibv_node_type,
    /// Transport type.
    pub transport_type: ibv_transport_type,
    /// Kernel device name, NUL-terminated (what `ibv_get_device_name` returns).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// uverbs device name.
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// sysfs path of the uverbs device.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// sysfs path of the IB device.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// A `_compat_*` placeholder slot of `ibv_context_ops` (kept so real members keep offsets).
pub type compat_slot = Option<unsafe extern "C" fn() -> *mut c_void>;

/// `struct ibv_context_ops`: the provider's dispatch table. The header's static-inline
/// `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` call through it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_context_ops {
    /// Placeholder (old query_device).
    pub _compat_query_device: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int>,
    /// Placeholder (old query_port).
    pub _compat_query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut c_void) -> c_int>,
    /// Placeholder.
    pub _compat_alloc_pd: compat_slot,
    /// Placeholder.
    pub _compat_dealloc_pd: compat_slot,
    /// Placeholder.
    pub _compat_reg_mr: compat_slot,
    /// Placeholder.
    pub _compat_rereg_mr: compat_slot,
    /// Placeholder.
    pub _compat_dereg_mr: compat_slot,
    /// Allocate a memory window.
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, c_uint) -> *mut c_void>,
    /// Bind a memory window.
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut c_void, *mut c_void) -> c_int>,
    /// Free a memory window.
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
    /// Placeholder.
    pub _compat_create_cq: compat_slot,
    /// Poll a completion queue (`ibv_poll_cq`).
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    /// Request a completion notification (`ibv_req_notify_cq`).
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    /// Placeholder.
    pub _compat_cq_event: compat_slot,
    /// Placeholder.
    pub _compat_resize_cq: compat_slot,
    /// Placeholder.
    pub _compat_destroy_cq: compat_slot,
    /// Placeholder.
    pub _compat_create_srq: compat_slot,
    /// Placeholder.
    pub _compat_modify_srq: compat_slot,
    /// Placeholder.
    pub _compat_query_srq: compat_slot,
    /// Placeholder.
    pub _compat_destroy_srq: compat_slot,
    /// Post to a shared receive queue.
    pub post_srq_recv: Option<unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    /// Placeholder.
    pub _compat_create_qp: compat_slot,
    /// Placeholder.
    pub _compat_query_qp: compat_slot,
    /// Placeholder.
    pub _compat_modify_qp: compat_slot,
    /// Placeholder.
    pub _compat_destroy_qp: compat_slot,
    /// Post send work requests (`ibv_post_send`).
    pub post_send: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    /// Post receive work requests (`ibv_post_recv`).
    pub post_recv: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    /// Placeholder.
    pub _compat_create_ah: compat_slot,
    /// Placeholder.
    pub _compat_destroy_ah: compat_slot,
    /// Placeholder.
    pub _compat_attach_mcast: compat_slot,
    /// Placeholder.
    pub _compat_detach_mcast: compat_slot,
    /// Placeholder.
    pub _compat_async_event: compat_slot,
}

/// `struct ibv_context`: an open device.
#[repr(C)]
pub struct ibv_context {
    /// The device this context was opened on.
    pub device: *mut ibv_device,
    /// Dispatch table.
    pub ops: ibv_context_ops,
    /// Command file descriptor.
    pub cmd_fd: c_int,
    /// Async event file descriptor.
    pub async_fd: c_int,
    /// Number of completion vectors.
    pub num_comp_vectors: c_int,
    /// Library-internal mutex.
    pub mutex: pthread_mutex_t,
    /// `__VERBS_ABI_IS_EXTENDED` when a `verbs_context` precedes this struct; NULL otherwise.
    pub abi_compat: *mut c_void,
}

/// `struct ibv_device_attr`: device capabilities (`ibv_query_device`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    /// Firmware version string.
    pub fw_ver: [c_char; 64],
    /// Node GUID, network byte order.
    pub node_guid: u64,
    /// System image GUID, network byte order.
    pub sys_image_guid: u64,
    /// Largest registrable region.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Max number of QPs.
    pub max_qp: c_int,
    /// Max outstanding work requests per queue.
    pub max_qp_wr: c_int,
    /// Capability flags.
    pub device_cap_flags: c_uint,
    /// Max scatter/gather entries per WR.
    pub max_sge: c_int,
    /// Max SGEs for RDMA read.
    pub max_sge_rd: c_int,
    /// Max number of CQs.
    pub max_cq: c_int,
    /// Max entries per CQ.
    pub max_cqe: c_int,
    /// Max number of MRs.
    pub max_mr: c_int,
    /// Max number of PDs.
    pub max_pd: c_int,
    /// Max outstanding RDMA reads/atomics per QP (target).
    pub max_qp_rd_atom: c_int,
    /// Max per EE context.
    pub max_ee_rd_atom: c_int,
    /// Max resources for RDMA read/atomics.
    pub max_res_rd_atom: c_int,
    /// Max outstanding RDMA reads/atomics per QP (initiator).
    pub max_qp_init_rd_atom: c_int,
    /// Max per EE context (initiator).
    pub max_ee_init_rd_atom: c_int,
    /// Atomic capability.
    pub atomic_cap: ibv_atomic_cap,
    /// Max EE contexts.
    pub max_ee: c_int,
    /// Max RDDs.
    pub max_rdd: c_int,
    /// Max memory windows.
    pub max_mw: c_int,
    /// Max raw IPv6 QPs.
    pub max_raw_ipv6_qp: c_int,
    /// Max raw Ethertype QPs.
    pub max_raw_ethy_qp: c_int,
    /// Max multicast groups.
    pub max_mcast_grp: c_int,
    /// Max QPs per multicast group.
    pub max_mcast_qp_attach: c_int,
    /// Max total multicast attachments.
    pub max_total_mcast_qp_attach: c_int,
    /// Max address handles.
    pub max_ah: c_int,
    /// Max FMRs.
    pub max_fmr: c_int,
    /// Max maps per FMR.
    pub max_map_per_fmr: c_int,
    /// Max SRQs.
    pub max_srq: c_int,
    /// Max WRs per SRQ.
    pub max_srq_wr: c_int,
    /// Max SGEs per SRQ WR.
    pub max_srq_sge: c_int,
    /// Max partition keys.
    pub max_pkeys: u16,
    /// Local CA ACK delay.
    pub local_ca_ack_delay: u8,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr`: port properties (`ibv_query_port`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    /// Logical port state.
    pub state: ibv_port_state,
    /// Max MTU supported.
    pub max_mtu: ibv_mtu,
    /// Active MTU.
    pub active_mtu: ibv_mtu,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// Capability flags.
    pub port_cap_flags: u32,
    /// Max message size.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// Base LID.
    pub lid: u16,
    /// Subnet manager LID.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Max virtual lanes.
    pub max_vl_num: u8,
    /// Subnet manager service level.
    pub sm_sl: u8,
    /// Subnet propagation delay.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Active link width.
    pub active_width: u8,
    /// Active link speed.
    pub active_speed: u8,
    /// Physical port state.
    pub phys_state: u8,
    /// Link layer (`IBV_LINK_LAYER_*`).
    pub link_layer: u8,
    /// Flags.
    pub flags: u8,
    /// Capability flags, second word.
    pub port_cap_flags2: u16,
}

/// `struct ibv_pd`: a protection domain.
#[repr(C)]
pub struct ibv_pd {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Kernel handle.
    pub handle: u32,
}

/// `struct ibv_mr`: a registered memory region.
#[repr(C)]
pub struct ibv_mr {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Start address.
    pub addr: *mut c_void,
    /// Length in bytes.
    pub length: usize,
    /// Kernel handle.
    pub handle: u32,
    /// Local key (goes into `ibv_sge::lkey`).
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_comp_channel`: a completion event channel.
#[repr(C)]
pub struct ibv_comp_channel {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Event file descriptor.
    pub fd: c_int,
    /// Reference count.
    pub refcnt: c_int,
}

/// `struct ibv_cq`: a completion queue.
#[repr(C)]
pub struct ibv_cq {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Completion channel, or NULL.
    pub channel: *mut ibv_comp_channel,
    /// User context pointer.
    pub cq_context: *mut c_void,
    /// Kernel handle.
    pub handle: u32,
    /// Number of entries.
    pub cqe: c_int,
    /// Library-internal mutex.
    pub mutex: pthread_mutex_t,
    /// Library-internal condition variable.
    pub cond: pthread_cond_t,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
}

/// `struct ibv_qp`: a queue pair.
#[repr(C)]
pub struct ibv_qp {
    /// Owning context.
    pub context: *mut ibv_context,
    /// User context pointer.
    pub qp_context: *mut c_void,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Send completion queue.
    pub send_cq: *mut ibv_cq,
    /// Receive completion queue.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue, or NULL.
    pub srq: *mut c_void,
    /// Kernel handle.
    pub handle: u32,
    /// QP number (what the peer puts in `dest_qp_num`).
    pub qp_num: u32,
    /// Current state.
    pub state: ibv_qp_state,
    /// Transport type.
    pub qp_type: ibv_qp_type,
    /// Library-internal mutex.
    pub mutex: pthread_mutex_t,
    /// Library-internal condition variable.
    pub cond: pthread_cond_t,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`: queue sizes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_qp_cap {
    /// Max outstanding send WRs.
    pub max_send_wr: u32,
    /// Max outstanding receive WRs.
    pub max_recv_wr: u32,
    /// Max SGEs per send WR.
    pub max_send_sge: u32,
    /// Max SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Max inline data bytes.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`: arguments of `ibv_create_qp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr {
    /// User context pointer.
    pub qp_context: *mut c_void,
    /// Send completion queue.
    pub send_cq: *mut ibv_cq,
    /// Receive completion queue.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue, or NULL.
    pub srq: *mut c_void,
    /// Requested capabilities (updated with the actual ones on success).
    pub cap: ibv_qp_cap,
    /// Transport type.
    pub qp_type: ibv_qp_type,
    /// Non-zero: every send generates a completion.
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`: the GRH part of an address vector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label.
    pub flow_label: u32,
    /// Index of the source GID in the local GID table.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`: an address vector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    /// Global route (valid when `is_global` is non-zero).
    pub grh: ibv_global_route,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Non-zero: `grh` is used.
    pub is_global: u8,
    /// Local port number.
    pub port_num: u8,
}

/// `struct ibv_qp_attr`: arguments of `ibv_modify_qp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    /// Target state.
    pub qp_state: ibv_qp_state,
    /// Assumed current state.
    pub cur_qp_state: ibv_qp_state,
    /// Path MTU.
    pub path_mtu: ibv_mtu,
    /// Path migration state.
    pub path_mig_state: ibv_mig_state,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive queue PSN.
    pub rq_psn: u32,
    /// Send queue PSN.
    pub sq_psn: u32,
    /// Destination QP number.
    pub dest_qp_num: u32,
    /// Access flags.
    pub qp_access_flags: c_uint,
    /// Capabilities.
    pub cap: ibv_qp_cap,
    /// Primary address vector.
    pub ah_attr: ibv_ah_attr,
    /// Alternate address vector.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQD async notify.
    pub en_sqd_async_notify: u8,
    /// SQ draining.
    pub sq_draining: u8,
    /// Max outstanding RDMA reads (initiator).
    pub max_rd_atomic: u8,
    /// Max outstanding RDMA reads (target).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Port number.
    pub port_num: u8,
    /// Local ACK timeout.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit (kbps).
    pub rate_limit: u32,
}

/// `struct ibv_sge`: one scatter/gather element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR containing the range.
    pub lkey: u32,
}

/// `wr.rdma` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_rdma {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.atomic` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_atomic {
    /// Remote address.
    pub remote_addr: u64,
    /// Compare or add operand.
    pub compare_add: u64,
    /// Swap operand.
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.ud` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_ud {
    /// Address handle.
    pub ah: *mut c_void,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// The `wr` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    /// RDMA operations.
    pub rdma: ibv_send_wr_rdma,
    /// Atomic operations.
    pub atomic: ibv_send_wr_atomic,
    /// UD sends.
    pub ud: ibv_send_wr_ud,
}

/// `qp_type.xrc` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_xrc {
    /// Remote SRQ number.
    pub remote_srqn: u32,
}

/// The `qp_type` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_qp_type {
    /// XRC.
    pub xrc: ibv_send_wr_xrc,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind_info {
    /// Memory region.
    pub mr: *mut ibv_mr,
    /// Address.
    pub addr: u64,
    /// Length.
    pub length: u64,
    /// Access flags.
    pub mw_access_flags: c_uint,
}

/// `bind_mw` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_bind_mw {
    /// Memory window.
    pub mw: *mut c_void,
    /// New rkey.
    pub rkey: u32,
    /// Bind info.
    pub bind_info: ibv_mw_bind_info,
}

/// `tso` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_tso {
    /// Header.
    pub hdr: *mut c_void,
    /// Header size.
    pub hdr_sz: u16,
    /// Max segment size.
    pub mss: u16,
}

/// The trailing anonymous `bind_mw`/`tso` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_bind_mw_tso {
    /// Memory window bind.
    pub bind_mw: ibv_send_wr_bind_mw,
    /// TSO.
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr`: a send work request.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    /// User id returned in the completion.
    pub wr_id: u64,
    /// Next WR in the list, or NULL.
    pub next: *mut ibv_send_wr,
    /// Scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Number of SGEs.
    pub num_sge: c_int,
    /// Operation.
    pub opcode: ibv_wr_opcode,
    /// `IBV_SEND_*` flags.
    pub send_flags: c_uint,
    /// Immediate data, network byte order (C: anonymous union with `invalidate_rkey`).
    pub imm_data: u32,
    /// RDMA/atomic/UD parameters.
    pub wr: ibv_send_wr_wr,
    /// XRC parameters.
    pub qp_type: ibv_send_wr_qp_type,
    /// C: anonymous union of `bind_mw` and `tso`.
    pub bind_mw_tso: ibv_send_wr_bind_mw_tso,
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        // SAFETY: ibv_send_wr is plain data; all-zero (NULL pointers, zero ints) is valid.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct ibv_recv_wr`: a receive work request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    /// User id returned in the completion.
    pub wr_id: u64,
    /// Next WR in the list, or NULL.
    pub next: *mut ibv_recv_wr,
    /// Scatter list.
    pub sg_list: *mut ibv_sge,
    /// Number of SGEs.
    pub num_sge: c_int,
}

impl Default for ibv_recv_wr {
    fn default() -> Self {
        ibv_recv_wr { wr_id: 0, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 }
    }
}

/// `struct ibv_wc`: a work completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_wc {
    /// The WR's `wr_id`.
    pub wr_id: u64,
    /// Status (`IBV_WC_*`).
    pub status: ibv_wc_status,
    /// Opcode (`IBV_WC_SEND`, `IBV_WC_RECV`, ...).
    pub opcode: ibv_wc_opcode,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// Immediate data, network byte order (C: anonymous union with `invalidated_rkey`).
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (UD).
    pub src_qp: u32,
    /// `IBV_WC_*` flags.
    pub wc_flags: c_uint,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}
