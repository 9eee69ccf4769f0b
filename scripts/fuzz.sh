#!/usr/bin/env bash
# Long fuzz runs of every parser (CI runs the same harnesses with 2,000 cases per target):
#   scripts/fuzz.sh [CASES]        # default 100000 cases per target, optimised build
# Targets: boltccl/tests/fuzz.rs (frame header and reader, control frames, handshake opening,
# bootstrap messages, RDMA endpoints, device matrix, hostfile), launch/tests/fuzz.rs (the
# launcher's hostfile) and examples/llm/tests/fuzz_loaders.rs (GGUF and safetensors).
# Prints the cases run per target and the time taken; exits non-zero on the first failure,
# with the shrunk input that failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cases="${1:-100000}"
export BOLTCCL_FUZZ_CASES="$cases" CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# Optimised, but with overflow checks and debug assertions on (an overflow is a finding, not a
# silent wrap), in a target directory of its own so the ordinary release build is untouched.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/fuzz}"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
start=$(date +%s)
run() {
    local t0=$SECONDS log status=0
    log=$(mktemp)
    cargo test --release "$@" -- --include-ignored --nocapture --test-threads=2 >"$log" 2>&1 || status=$?
    grep -E '^fuzz ' "$log" || true
    if [ "$status" -ne 0 ]; then
        grep -v '^ *[0-9]*: \|^ *at ' "$log" | tail -60 >&2
        echo "FAILED: cargo test $*" >&2
        exit 1
    fi
    rm -f "$log"
    echo "# $*: $((SECONDS - t0)) s"
}
echo "== fuzzing, $cases cases per target (release build)"
run -p boltccl --test fuzz
run -p boltccl-launch --test fuzz
if [ -e examples/llm/tests/fuzz_loaders.rs ]; then run -p boltccl-llm --test fuzz_loaders; fi
echo "== fuzz: every target passed $cases cases in $(( $(date +%s) - start )) s"
