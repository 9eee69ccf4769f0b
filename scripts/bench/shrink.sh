#!/usr/bin/env bash
# Shrink after a kill: 3 -> 2 and 4 -> 3 ranks over TCP, shared memory and RDMA (softverbs),
# 20 kills each (SHRINK_RUNS=n to change), release build. Prints a Markdown table: the median time from the
# kill to the first all_sum of the survivors' new group, the median `shrink()` call, and the
# TCP connections opened and queue pairs made by the shrinks (both must be 0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo test --release -q -p boltccl --test shrink -- --ignored --exact shrink_times --nocapture 2>&1 \
    | grep -E '^\|'
