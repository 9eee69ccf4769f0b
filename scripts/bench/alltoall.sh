#!/usr/bin/env bash
# float32 all_to_all side by side, one run on this machine: boltccl (shared memory, and TCP
# with BOLTCCL_BACKEND=tcp), each with its two schedules (BOLTCCL_ALGO=auto: every peer at once;
# BOLTCCL_ALGO=ring: pairwise rounds), against Open MPI's MPI_Alltoall over shared memory
# (vader) and TCP (C, scripts/bench/mpi_collective.c, the peers' timing protocol), and
# dist.all_to_all_single through torch with backend "gloo" and with backend "boltccl" (column
# torch-boltccl; scripts/bench/alltoall_torch.py, on the peers' harness in ../shared/bench/peers).
#   scripts/bench.sh alltoall
# Knobs: A2A_NS ("2 4"), A2A_ROUNDS (1), A2A_BUDGET_S (1.0 s a cell), A2A_SIZES (bytes per
# rank, the whole input; default 4·n, 1 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB), TORCH_PY (a
# python with torch and boltccl: target/frameworks-venv's, made by scripts/test-frameworks.sh),
# BENCH_OUT; BOLTCCL_BIN measures a given build instead of building this checkout, and
# BOLTCCL_BASELINE=/path/to/an/older/boltccl adds its shared-memory figures as column
# boltccl-baseline (a before/after of a change, in the same run). Each round runs, per rank
# count, every column into one results file, each boltccl column right after its peer; the table (each cell the
# median over the rounds of its per-round figure, then the ratios) goes to stdout and
# $BENCH_OUT/alltoall.md. This VM has states that last seconds to minutes in which small
# messages between two cores take twice as long, for Open MPI as for boltccl: with one round,
# a cell is a draw of that state; five rounds set it aside (three did not always, 2026-12-03).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS="${PEERS_DIR:-$ROOT/../shared/bench/peers}"
OUT="${BENCH_OUT:-$ROOT/target/bench-alltoall}"
NS="${A2A_NS:-2 4}"
ROUNDS="${A2A_ROUNDS:-1}"
BUDGET="${A2A_BUDGET_S:-1.0}"
mkdir -p "$OUT"
TORCH_PY="${TORCH_PY:-$ROOT/target/frameworks-venv/bin/python}"
"$TORCH_PY" -c 'import torch.distributed, boltccl.torch' ||
  { echo "$TORCH_PY cannot import torch and boltccl.torch: run scripts/test-frameworks.sh or set TORCH_PY" >&2; exit 1; }
command -v mpicc >/dev/null || { echo "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }

if [ -z "${BOLTCCL_BIN:-}" ]; then
  cargo build -q --release --manifest-path "$ROOT/Cargo.toml" -p boltccl-cli -j"${CARGO_BUILD_JOBS:-2}"
fi
BIN="${BOLTCCL_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/boltccl}"
mpicc -O2 -o "$OUT/mpi_collective" "$ROOT/scripts/bench/mpi_collective.c"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo --mca pml ob1)
RES="$OUT/alltoall-$(date +%Y%m%d-%H%M%S).jsonl"
: >"$RES"
# One boltccl column: label, backend, algorithm, binary.
boltccl_column() {
  local label=$1 backend=$2 algo=$3 bin=$4
  echo "--- n=$n $label (round $round)"
  BOLTCCL_BACKEND="$backend" BOLTCCL_ALGO="$algo" "$bin" bench -n "$n" --ops all-to-all --sizes "$sizes" \
    --budget-s "$BUDGET" --json "$RES" --label "$label" --round "$round" || echo "$label n=$n failed rc=$?"
}
for round in $(seq 1 "$ROUNDS"); do
  for n in $NS; do
    sizes="${A2A_SIZES:-$((4 * n)),1024,65536,1048576,16777216,67108864}"
    # Each boltccl column right after the peer it is compared with: a slow state of the machine
    # (they last seconds to minutes) then falls on both more often than on one.
    echo "--- n=$n mpi-shm (round $round)"
    timeout -k 10 600 "${MPIRUN[@]}" --mca btl self,vader -np "$n" "$OUT/mpi_collective" "$RES" mpi-shm "$BUDGET" "$sizes" ||
      echo "mpi-shm n=$n failed rc=$?"
    boltccl_column boltccl auto auto "$BIN"
    [ -n "${BOLTCCL_BASELINE:-}" ] && boltccl_column boltccl-baseline auto auto "$BOLTCCL_BASELINE"
    echo "--- n=$n mpi-tcp (round $round)"
    timeout -k 10 600 "${MPIRUN[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo -np "$n" \
      "$OUT/mpi_collective" "$RES" mpi-tcp "$BUDGET" "$sizes" || echo "mpi-tcp n=$n failed rc=$?"
    boltccl_column boltccl-tcp tcp auto "$BIN"
    for backend in gloo boltccl; do
      echo "--- n=$n torch $backend (round $round)"
      PEER_SIZES="$sizes" PEER_BUDGET_S="$BUDGET" timeout -k 10 600 "$TORCH_PY" "$PEERS/launch_local.py" "$n" \
        --port $((29700 + n)) --timeout 590 -- "$TORCH_PY" "$ROOT/scripts/bench/alltoall_torch.py" "$PEERS" "$RES" "$backend" ||
        echo "torch $backend n=$n failed rc=$?"
    done
    boltccl_column boltccl-pairwise auto ring "$BIN"
    boltccl_column boltccl-tcp-pairwise tcp ring "$BIN"
  done
done
echo "# $(date '+%Y-%m-%d %H:%M'), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end" | tee "$OUT/alltoall.md"
python3 "$ROOT/scripts/bench/alltoall-table.py" "$RES" | tee -a "$OUT/alltoall.md"
