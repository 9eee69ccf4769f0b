#!/usr/bin/env bash
# MLX programs over boltccl, side by side with MLX's other ways, in one run on this machine:
#   1. mx.distributed.all_sum (float32) through MLX's ring backend, MLX's mpi backend on Open
#      MPI's libmpi, MLX's mpi backend on libboltccl_mpi, and `boltccl bench` (no MLX), with the
#      peers' harness (shared/bench/peers); 2 and 4 ranks, 4 B to 64 MiB;
#   2. mlx-lm TP=3 greedy generation of SmolLM2-135M over the same three, and TP=1.
#   scripts/bench.sh mlx       (after scripts/test-frameworks.sh, whose venv it uses)
# Knobs: MLX_NS ("2 4"), MLX_ROUNDS (1), PEER_BUDGET_S (1.0), PEER_SIZES, MLX_TOKENS (24),
# MLX_LM=0 to leave out part 2, LIBMPI (Open MPI's libmpi.so).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PY:-$ROOT/target/frameworks-venv/bin/python}"
export PEERS_DIR="${PEERS_DIR:-$ROOT/../shared/bench/peers}"
OUT="${BENCH_OUT:-$ROOT/target/bench-mlx}"
if [ -z "${LIBMPI:-}" ]; then
  for l in /usr/lib/x86_64-linux-gnu/libmpi.so.40 /usr/lib/aarch64-linux-gnu/libmpi.so.40; do
    [ -f "$l" ] && LIBMPI="$l" && break
  done
fi
export PEER_SIZES="${PEER_SIZES:-4,1024,65536,1048576,16777216,67108864}" PEER_BUDGET_S="${PEER_BUDGET_S:-1.0}"
mkdir -p "$OUT"
"$PY" -c 'import mlx.core, boltccl.mlx' || { echo "run scripts/test-frameworks.sh first (its venv and wheel)" >&2; exit 1; }
[ -n "${LIBMPI:-}" ] || { echo "Open MPI's libmpi.so.40 is missing: apt-get install libopenmpi3" >&2; exit 1; }
cargo build --release -q --manifest-path "$ROOT/Cargo.toml" -p boltccl-cli -p boltccl-mpi --example allreduce_latency
BIN="$ROOT/target/release/boltccl"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
RES="$OUT/allsum-$(date +%Y%m%d-%H%M%S).jsonl"
: >"$RES"
B="$ROOT/scripts/bench/mlx_allsum.py"
for round in $(seq 1 "${MLX_ROUNDS:-1}"); do
  export PEER_ROUND="$round"
  for n in ${MLX_NS:-2 4}; do
    echo "--- n=$n round $round"
    MLX_BENCH_BACKEND=ring MLX_BENCH_LABEL=mlx-ring "$(dirname "$PY")/mlx.launch" -n "$n" --python "$PY" "$B" "$RES"
    "${MPIRUN[@]}" -np "$n" -x MLX_MPI_LIBNAME="$LIBMPI" -x MLX_BENCH_BACKEND=mpi -x MLX_BENCH_LABEL=mlx-openmpi \
      -x PEERS_DIR -x PEER_SIZES -x PEER_BUDGET_S -x PEER_ROUND "$PY" "$B" "$RES"
    MLX_BENCH_BACKEND=mpi MLX_BENCH_LABEL=mlx-boltccl "$PY" -m boltccl.launch -n "$n" "$B" "$RES"
    "$BIN" bench -n "$n" --ops all-sum --sizes "$PEER_SIZES" --budget-s "$PEER_BUDGET_S" \
      --json "$RES" --round "$round" --label boltccl-bench
    # The MPI layer alone (no MLX): MPI_Allreduce of 4 bytes from Rust, beside the bench's 4 B.
    "$BIN" launch -n "$n" -- "$ROOT/target/release/examples/allreduce_latency" | tee -a "$OUT/mpi-layer.txt"
  done
done
"$PY" "$ROOT/scripts/bench/mlx-table.py" "$RES" | tee "$OUT/allsum.md"

[ "${MLX_LM:-1}" = 0 ] && exit 0
MODEL="$ROOT/target/models/SmolLM2-135M-Instruct-mlx"
[ -d "$MODEL" ] || "$PY" "$ROOT/scripts/mlx-model.py" "$ROOT/target/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODEL"
GEN=("$ROOT/examples/python/mlx_lm_generate.py" "$MODEL" --max-tokens "${MLX_TOKENS:-24}" --json)
LM="$OUT/mlx-lm-$(date +%Y%m%d-%H%M%S).txt"
: >"$LM"
run() { echo "== $1" | tee -a "$LM"; shift; "$@" 2>&1 | grep RESULT | tee -a "$LM"; }
run "TP=1, one process" "$PY" "${GEN[@]}"
run "TP=3, MLX ring" "$(dirname "$PY")/mlx.launch" -n 3 --python "$PY" "${GEN[@]}"
run "TP=3, MLX mpi on Open MPI" "${MPIRUN[@]}" -np 3 -x MLX_MPI_LIBNAME="$LIBMPI" "$PY" "${GEN[@]}"
run "TP=3, MLX mpi on boltccl" "$PY" -m boltccl.launch -n 3 "${GEN[@]}"
"$PY" "$ROOT/scripts/bench/mlx-table.py" --lm "$LM"
