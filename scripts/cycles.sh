#!/usr/bin/env bash
# The long init/teardown run over softverbs: 2-rank groups formed and torn down again and
# again under 11 fault settings (no fault, then SOFTVERBS_FAIL_AFTER at every step of set-up and
# mid-collective), checking after every cycle that no provider object is alive, and that open
# files stay within +8 and RSS within +64 MiB of cycle 10.
#
#   scripts/cycles.sh [CYCLES_PER_SETTING]     # default 910: 10,010 cycles in all
#
# CI runs the same test with 80 cycles per setting (880 in all).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
per="${1:-910}"
export BOLTCCL_TEST_CYCLES="$per" CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
start=$(date +%s)
echo "== $per init/teardown cycles per fault setting, 11 settings ($((per * 11)) cycles)"
cargo test -p boltccl --test verbs_faults init_teardown_cycles_with_injected_failures_leak_nothing -- --include-ignored --nocapture 2>&1 |
    grep -E 'init/teardown|test result|panicked|cycle [0-9]+:'
echo "== $(( $(date +%s) - start )) s"
