//! Loading the verbs library at run time.
//!
//! boltccl never links to libibverbs: a build must run (and fall back to TCP) on machines
//! without RDMA. The control verbs are looked up by symbol; the data path (post send, post
//! receive, poll) is not exported by either library — the C header's static-inline functions
//! jump through `context->ops`, and so does [`super::ffi`].

use crate::error::{Error, Result};
use libc::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use verbs_abi::*;

/// The library loaded when `BOLTCCL_IBV_LIBRARY` is not set. Decided at run time, not with
/// `cfg`, so the macOS path is compiled and tested everywhere.
pub fn default_library() -> &'static str {
    if std::env::consts::OS == "macos" {
        "librdma.dylib"
    } else {
        "libibverbs.so.1"
    }
}

/// What to install or enable when the library is missing, for this OS.
pub fn install_hint() -> &'static str {
    if std::env::consts::OS == "macos" {
        "RDMA over Thunderbolt needs macOS 26.2 or later with RDMA enabled: boot into Recovery, run \
         `rdma_ctl enable`, reboot (check with `rdma_ctl status`)"
    } else {
        "install rdma-core's libibverbs (Debian/Ubuntu: apt-get install -y libibverbs1 ibverbs-providers) \
         or point BOLTCCL_IBV_LIBRARY at a verbs library"
    }
}

/// The exported verbs boltccl calls: exactly the 16 that Apple's `librdma.dylib` is known to
/// export (JACCL resolves the same set), so one code path serves both platforms.
pub struct Verbs {
    /// Where it was loaded from.
    pub path: PathBuf,
    pub(crate) get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub(crate) free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub(crate) get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub(crate) open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub(crate) close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub(crate) alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub(crate) dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub(crate) create_cq:
        unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub(crate) create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub(crate) modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub(crate) query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub(crate) query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub(crate) reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    /// Not exported by every provider (Apple's is not known to): optional.
    pub(crate) query_device: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int>,
    // Last: the library must stay loaded while the function pointers above exist.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs").field("path", &self.path).finish()
    }
}

impl Verbs {
    /// Load `path` (or the platform default) and resolve every required symbol.
    pub fn load(path: Option<&Path>) -> Result<Arc<Verbs>> {
        let (path, overridden) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(default_library()), false),
        };
        // SAFETY: loading a verbs library runs its initialisers; libibverbs and Apple's
        // librdma are ordinary C libraries whose constructors only register providers.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
            let how = if overridden {
                format!("BOLTCCL_IBV_LIBRARY={} cannot be loaded ({e}); check the path", path.display())
            } else {
                format!("the verbs library {} cannot be loaded ({e}): {}", path.display(), install_hint())
            };
            Error::Unsupported(how)
        })?;
        let missing = |name: &str, e: libloading::Error| {
            Error::Unsupported(format!(
                "{} lacks the verbs symbol {name} ({e}); it is not a usable verbs library (or is too old)",
                path.display()
            ))
        };
        macro_rules! req {
            ($name:literal) => {
                // SAFETY: the symbol's C type is the one the rdma-core header declares, which
                // the field this initialises spells out; verbs-abi's layout test checks the
                // argument structs against that header.
                *unsafe { lib.get($name) }
                    .map_err(|e| missing(std::str::from_utf8(&$name[..$name.len() - 1]).unwrap_or("?"), e))?
            };
        }
        Ok(Arc::new(Verbs {
            get_device_list: req!(b"ibv_get_device_list\0"),
            free_device_list: req!(b"ibv_free_device_list\0"),
            get_device_name: req!(b"ibv_get_device_name\0"),
            open_device: req!(b"ibv_open_device\0"),
            close_device: req!(b"ibv_close_device\0"),
            alloc_pd: req!(b"ibv_alloc_pd\0"),
            dealloc_pd: req!(b"ibv_dealloc_pd\0"),
            create_cq: req!(b"ibv_create_cq\0"),
            destroy_cq: req!(b"ibv_destroy_cq\0"),
            create_qp: req!(b"ibv_create_qp\0"),
            modify_qp: req!(b"ibv_modify_qp\0"),
            destroy_qp: req!(b"ibv_destroy_qp\0"),
            query_port: req!(b"ibv_query_port\0"),
            query_gid: req!(b"ibv_query_gid\0"),
            reg_mr: req!(b"ibv_reg_mr\0"),
            dereg_mr: req!(b"ibv_dereg_mr\0"),
            // SAFETY: as above; absence is fine.
            query_device: unsafe { lib.get(b"ibv_query_device\0") }.ok().map(|s| *s),
            path,
            _lib: lib,
        }))
    }

    /// The names of the devices the library reports.
    pub fn device_names(&self) -> Result<Vec<String>> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below on every path.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            let errno = std::io::Error::last_os_error();
            let why = if errno.raw_os_error() == Some(libc::ENOSYS) {
                "the kernel has no RDMA support here (no uverbs device: load the driver's kernel modules, e.g. \
                 ib_uverbs and your NIC's, or run on a node with an RDMA device)"
            } else {
                install_hint()
            };
            return Err(Error::Unsupported(format!(
                "{}: ibv_get_device_list failed ({errno}): {why}",
                self.path.display()
            )));
        }
        let mut names = Vec::with_capacity(n.max(0) as usize);
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` valid device pointers until it is freed.
            let name = unsafe { std::ffi::CStr::from_ptr((self.get_device_name)(*list.add(i))) };
            names.push(name.to_string_lossy().into_owned());
        }
        // SAFETY: `list` came from get_device_list and is freed once.
        unsafe { (self.free_device_list)(list) };
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_unsupported_and_says_what_to_do() {
        let e = Verbs::load(Some(Path::new("/nonexistent/libibverbs-nope.so"))).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        assert!(e.to_string().contains("BOLTCCL_IBV_LIBRARY=/nonexistent"), "{e}");
    }

    #[test]
    fn a_library_without_verbs_symbols_is_rejected_by_name() {
        // libc is loaded everywhere and exports none of the verbs.
        let libc = if std::env::consts::OS == "macos" { "libSystem.B.dylib" } else { "libc.so.6" };
        let e = Verbs::load(Some(Path::new(libc))).unwrap_err();
        assert!(e.to_string().contains("lacks the verbs symbol ibv_get_device_list"), "{e}");
    }

    #[test]
    fn defaults_per_platform() {
        assert!(default_library().starts_with("lib"));
        assert!(install_hint().contains("rdma"));
    }
}
