//! The panic boundary: no Rust panic ever unwinds into C.

use crate::error::{boltccl_result, set_last_error};

/// What a function returns when its body panicked or got a NULL it needed.
pub(crate) trait Defaulted {
    /// Value returned after a caught panic.
    fn on_panic() -> Self;
}

impl Defaulted for boltccl_result {
    fn on_panic() -> Self {
        boltccl_result::Panic
    }
}

impl Defaulted for i32 {
    fn on_panic() -> Self {
        -1
    }
}

impl Defaulted for () {
    fn on_panic() -> Self {}
}

/// Run `f`, turning a panic into `T::on_panic()` with a recorded message.
pub(crate) fn boundary<T: Defaulted>(f: impl FnOnce() -> T) -> T {
    crate::error::clear_last_error();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(format!("panic inside boltccl (a bug, please report it): {what}"));
            T::on_panic()
        }
    }
}

/// Wrap a function body in the panic boundary. Every exported function uses it.
macro_rules! ffi_panic_boundary {
    ($($body:tt)*) => {
        $crate::panic::boundary(move || { $($body)* })
    };
}
pub(crate) use ffi_panic_boundary;

/// Return `NullParameter` (recording which argument) if `$p` is NULL.
macro_rules! check_null {
    ($p:ident) => {
        if $p.is_null() {
            return $crate::error::fail_with(
                $crate::error::boltccl_result::NullParameter,
                concat!("argument `", stringify!($p), "` is NULL"),
            );
        }
    };
}
pub(crate) use check_null;

/// Evaluate a `Result<T, boltccl_result>`, returning the code on error.
macro_rules! try_ffi {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}
pub(crate) use try_ffi;
