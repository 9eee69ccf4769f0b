#!/usr/bin/env bash
# The full test command: the README's second command, and exactly what CI runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)

# System packages: rdma-core's verbs.h for the ABI layout test, iproute2 for namespace tests.
bash scripts/deps.sh libibverbs-dev iproute2 pkg-config

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

echo "== tests"
# The header is installed above, so the verbs ABI layout test must run, not skip.
export VERBS_ABI_REQUIRE=1
cargo build --workspace  # the C tests link the built libboltccl.a and libsoftverbs.so
cargo test --workspace --all-targets
cargo test --workspace --doc

echo "== C and Python bindings"
CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" bash scripts/test-bindings.sh

echo "== benches build"
cargo bench --workspace --no-run

echo "== all tests passed in $(( $(date +%s) - start )) s"
