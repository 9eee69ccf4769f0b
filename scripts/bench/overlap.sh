#!/usr/bin/env bash
# Compute while communicating: matrix products during an async 64 MiB all_sum, against both
# measured apart (scripts/bench/overlap.py; medians of REPS, default 5). One BLAS thread per
# rank. Needs target/frameworks-venv or target/bindings-venv (numpy and the wheel).
#   scripts/bench.sh overlap            BENCH_RANKS=4 scripts/bench.sh overlap
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
py="${PYTHON:-$root/target/frameworks-venv/bin/python}"
[ -x "$py" ] || py="$root/target/bindings-venv/bin/python"
echo "load before: $(cat /proc/loadavg)"
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 600 "$py" -m boltccl.launch -n "${BENCH_RANKS:-2}" --timeout 580 \
    scripts/bench/overlap.py --reps "${REPS:-5}" "$@"
echo "load after: $(cat /proc/loadavg)"
