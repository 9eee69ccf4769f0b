#!/usr/bin/env bash
# Regenerate the C header with the pinned cbindgen and fail if include/boltccl.h differs.
#   scripts/check-header.sh           check (CI)
#   scripts/check-header.sh --write   regenerate include/boltccl.h
# Installs the pinned cbindgen with `cargo install` when it is missing or another version.
set -euo pipefail
CBINDGEN_VERSION=0.29.0
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

if ! command -v cbindgen >/dev/null || [[ "$(cbindgen --version)" != "cbindgen $CBINDGEN_VERSION" ]]; then
    echo "check-header: installing cbindgen $CBINDGEN_VERSION" >&2
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked -j"${CARGO_BUILD_JOBS:-1}" >&2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cbindgen --quiet --config ffi/cbindgen.toml --crate boltccl-ffi --output "$tmp/boltccl.h" ffi

if [[ "${1:-}" == "--write" ]]; then
    cp "$tmp/boltccl.h" include/boltccl.h
    echo "check-header: wrote include/boltccl.h"
    exit 0
fi
if ! diff -u include/boltccl.h "$tmp/boltccl.h"; then
    echo "check-header: include/boltccl.h is stale: run scripts/check-header.sh --write and commit it" >&2
    exit 1
fi

# The header must compile as C99 and as C++ on its own.
cc="${CC:-cc}"
cxx="${CXX:-c++}"
printf '#include "boltccl.h"\nint main(void) { boltccl_config c; boltccl_config_init(&c); (void)c; return BOLTCCL_FLOAT32; }\n' >"$tmp/c.c"
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic -Iinclude -c "$tmp/c.c" -o "$tmp/c.o"
printf '#include "boltccl.h"\nint main() { boltccl_config c; boltccl_config_init(&c); (void)c; return BOLTCCL_FLOAT32; }\n' >"$tmp/cxx.cc"
"$cxx" -std=c++11 -Wall -Wextra -Werror -pedantic -Iinclude -c "$tmp/cxx.cc" -o "$tmp/cxx.o"
echo "check-header: include/boltccl.h is up to date and compiles as C99 and C++11"
