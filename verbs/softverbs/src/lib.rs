//! # softverbs — a software verbs provider. **TEST DOUBLE, not a production transport.**
//!
//! `libsoftverbs.so` exports the libibverbs C ABI (the symbols MLX's JACCL resolves from
//! Apple's `librdma.dylib`, plus the data path reached through `ibv_context::ops` exactly as
//! the header's static-inline `ibv_post_send`/`ibv_post_recv`/`ibv_poll_cq` do) and implements
//! **UC queue pairs over UDP datagrams**, with Apple's Thunderbolt 5 RDMA limits by default and
//! fault injection from the environment. It exists so boltccl's RDMA path can be tested on
//! machines without RDMA hardware, including between network namespaces joined by veth.
//!
//! It models UC semantics strictly (a message that finds no posted receive is dropped, a
//! message missing a fragment is dropped, length and protection errors complete with
//! `IBV_WC_LOC_LEN_ERR`/`IBV_WC_LOC_PROT_ERR`), but it is not a faithful timing model, has no
//! RDMA read/write, no RC, no SRQ, no completion channels, and its limits are counted per
//! process. See `README.md` for the full list and the `SOFTVERBS_*` variables.
//!
//! A one-line warning is printed on stderr at first use (suppress with `SOFTVERBS_QUIET=1`).
//!
//! Rust tests can call the exported functions directly through the `rlib`.

#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod api;
pub mod config;
pub mod counters;
pub mod device;
pub mod error;
mod objects;
mod qp;
pub mod wire;

pub use api::*;
pub use counters::{live_objects, softverbs_counters};

static WARN: std::sync::Once = std::sync::Once::new();

/// Print the "test double" warning once per process unless `SOFTVERBS_QUIET=1`.
pub(crate) fn warn_once() {
    WARN.call_once(|| {
        if std::env::var("SOFTVERBS_QUIET").as_deref() != Ok("1") {
            eprintln!(
                "softverbs: WARNING: this is a TEST DOUBLE (software verbs over UDP), \
                 not a production RDMA transport. Set SOFTVERBS_QUIET=1 to hide this line."
            );
        }
    });
}
