//! C ABI for boltccl (see issue: C and Python bindings). Intentionally empty until then.
