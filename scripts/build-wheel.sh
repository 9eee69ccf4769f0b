#!/usr/bin/env bash
# Build the Python wheel (maturin, release, abi3) with libboltccl_mpi inside it:
#   scripts/build-wheel.sh PYTHON OUTDIR
# maturin builds one Rust library per wheel (the extension module), so libboltccl_mpi (the
# MPI library MLX loads through MLX_MPI_LIBNAME) is built first and copied into the package,
# where pyproject.toml's `include` picks it up and boltccl.mlx.mpi_library() finds it.
set -euo pipefail
python="${1:?usage: scripts/build-wheel.sh PYTHON OUTDIR}"
out="${2:?usage: scripts/build-wheel.sh PYTHON OUTDIR}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo build --release -q -p boltccl-mpi
target="${CARGO_TARGET_DIR:-$root/target}/release"
rm -f python/boltccl/libboltccl_mpi.so python/boltccl/libboltccl_mpi.dylib
for lib in libboltccl_mpi.so libboltccl_mpi.dylib; do
    if [[ -f "$target/$lib" ]]; then cp -f "$target/$lib" python/boltccl/; fi
done
maturin="$(dirname "$python")/maturin"
(cd python && timeout 1800 "$maturin" build --release -q -i "$python" --out "$out")
