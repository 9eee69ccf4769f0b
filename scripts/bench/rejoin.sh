#!/usr/bin/env bash
# Kill / shrink / join / verify in a loop, 3 ranks, over TCP then shared memory, each for
# REJOIN_SECS seconds (default 600), release build. Prints, per transport, the rounds, the
# longest-lived rank's open files and resident memory after its first and last round (the
# test fails if they grew), and the median kill -> shrunk and grow -> grown times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export REJOIN_SECS="${REJOIN_SECS:-600}"
cargo test --release -q -p boltccl --test rejoin -- --exact kill_shrink_join_verify_over_tcp \
    kill_shrink_join_verify_over_shared_memory --test-threads=1 --nocapture 2>&1 \
    | grep -E '^(tcp|shm): |panicked|FAILED|test result'
