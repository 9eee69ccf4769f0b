//! Python bindings for boltccl. Intentionally empty until the bindings issue lands.
