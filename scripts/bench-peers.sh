#!/usr/bin/env bash
# boltccl's all_sum side by side with the peers (MLX ring, Open MPI over TCP and shared memory,
# Gloo) in one run on this machine, with the peers' own harness (../shared/bench/peers).
#   bash scripts/bench-peers.sh            # installs the peers on first use (apt, pip)
# Knobs: PEER_NS ("2 4"), PEER_ROUNDS (1), PEER_BUDGET_S (2.0), PEER_SIZES, BENCH_OUT.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="${PEERS_DIR:-$ROOT/../shared/bench/peers}"
OUT="${BENCH_OUT:-$ROOT/target/bench-peers}"
mkdir -p "$OUT"
export PEER_VENV="${PEER_VENV:-$OUT/venv}" PEER_BUILD="$OUT/build" PEER_OUT="$OUT"
export PEER_SIZES="${PEER_SIZES:-4,1024,65536,1048576,16777216,67108864}"
export PEER_NS="${PEER_NS:-2 4}" PEER_ROUNDS="${PEER_ROUNDS:-1}" PEER_BUDGET_S="${PEER_BUDGET_S:-2.0}"

cargo build --release --manifest-path "$ROOT/Cargo.toml"
BIN="$ROOT/target/release/boltccl"
bash "$PEERS/run_all.sh"
RES="$(ls -t "$OUT"/run-*.jsonl | head -1)"
for round in $(seq 1 "$PEER_ROUNDS"); do
  for n in $PEER_NS; do
    echo "--- n=$n boltccl (round $round)"
    "$BIN" bench -n "$n" --ops all-sum --sizes "$PEER_SIZES" --budget-s "$PEER_BUDGET_S" \
      --json "$RES" --round "$round" || echo "boltccl n=$n failed rc=$?"
  done
done
python3 "$ROOT/scripts/peers_table.py" "$RES" | tee "$OUT/side-by-side.md"
