#!/usr/bin/env bash
# Build the C library and install it with its header and pkg-config file:
#   scripts/install-c.sh PREFIX [--debug]
# gives PREFIX/lib/libboltccl.{so,dylib,a}, PREFIX/include/boltccl.h and
# PREFIX/lib/pkgconfig/boltccl.pc, so that
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cc prog.c $(pkg-config --cflags --libs boltccl)
# links it in one line; and PREFIX/lib/libboltccl_mpi.{so,dylib}, the MPI library MLX loads
# (MLX_MPI_LIBNAME), which `boltccl launch` from PREFIX/bin finds in ../lib.
set -euo pipefail
prefix="${1:?usage: scripts/install-c.sh PREFIX [--debug]}"
root="$(cd "$(dirname "$0")/.." && pwd)"
profile=release
flag=(--release)
if [[ "${2:-}" == "--debug" ]]; then
    profile=debug
    flag=()
fi
cd "$root"
cargo build -p boltccl-ffi -p boltccl-mpi "${flag[@]}" -j"${CARGO_BUILD_JOBS:-1}" >&2
target="${CARGO_TARGET_DIR:-$root/target}/$profile"
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
prefix="$(cd "$prefix" && pwd)"
for lib in libboltccl.so libboltccl.dylib libboltccl.a libboltccl_mpi.so libboltccl_mpi.dylib; do
    if [[ -f "$target/$lib" ]]; then cp -f "$target/$lib" "$prefix/lib/"; fi
done
if [[ -f "$prefix/lib/libboltccl.dylib" ]]; then
    install_name_tool -id "$prefix/lib/libboltccl.dylib" "$prefix/lib/libboltccl.dylib" 2>/dev/null || true
fi
cp -f include/boltccl.h "$prefix/include/"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" ffi/boltccl.pc.in >"$prefix/lib/pkgconfig/boltccl.pc"
echo "installed boltccl $version into $prefix" >&2
