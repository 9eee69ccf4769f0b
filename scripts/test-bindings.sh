#!/usr/bin/env bash
# Test the C and Python bindings from a fresh clone:
#   1. a fresh virtual environment in target/bindings-venv with python/requirements-test.txt;
#   2. the wheel built by maturin (release, abi3) and installed into it;
#   3. the C library installed into target/c-prefix, examples/allsum.c linked through
#      pkg-config in one line and run as 2 and 4 ranks;
#   4. the pytest suite (multi-rank conformance, errors, zero copy, Ctrl-C, stubs, and the
#      bitwise comparison of Python, C and Rust all_sum at 4 ranks);
#   5. the header drift check (scripts/check-header.sh).
# Idempotent (everything it makes lives under target/ and is remade) and bounded in time.
# CARGO_BUILD_JOBS (default 1) sets the build parallelism; PYTHON picks the interpreter.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"
python="${PYTHON:-python3}"
venv="$root/target/bindings-venv"
prefix="$root/target/c-prefix"
wheels="$root/target/bindings-wheels"
step() { printf '\n== test-bindings: %s\n' "$*"; }

step "fresh virtual environment ($("$python" --version))"
rm -rf "$venv" "$wheels"
"$python" -m venv "$venv"
timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check -r python/requirements-test.txt

step "wheel (maturin, release)"
bash scripts/build-wheel.sh "$venv/bin/python" "$wheels"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheels"/boltccl-*.whl

step "C library, pkg-config, example at 2 and 4 ranks"
command -v pkg-config >/dev/null || { echo "pkg-config is required (apt-get install pkg-config)" >&2; exit 1; }
timeout 1200 scripts/install-c.sh "$prefix"
mkdir -p "$prefix/bin"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# shellcheck disable=SC2046 # word splitting of pkg-config output is intended
cc -std=c99 -Wall -Wextra -Werror -pedantic -O2 examples/allsum.c $(pkg-config --cflags --libs boltccl) \
    -Wl,-rpath,"$prefix/lib" -o "$prefix/bin/allsum"
for n in 2 4; do
    timeout 150 "$venv/bin/python" -m boltccl.launch -n "$n" --timeout 120 -- "$prefix/bin/allsum"
done

step "Rust reference for the bitwise comparison"
timeout 1200 cargo build -q -p boltccl --example digest
rust_digest="${CARGO_TARGET_DIR:-$root/target}/debug/examples/digest"

step "pytest"
# Run from target/ so that python/boltccl (without the compiled module) is not imported.
(cd "$root/target" && BOLTCCL_C_EXAMPLE="$prefix/bin/allsum" BOLTCCL_RUST_DIGEST="$rust_digest" \
    timeout 1200 "$venv/bin/python" -m pytest "$root/python/tests" -q -p no:cacheprovider -r s)

step "header drift"
scripts/check-header.sh
step "all passed"
