//! What the integration tests share: the conformance workload, ranks as processes, ranks as
//! threads, and the softverbs set-up for the verbs tests. Each test binary uses part of it.
#![allow(dead_code)]

pub mod harness;
pub mod threads;
pub mod verbs;
pub mod workload;
