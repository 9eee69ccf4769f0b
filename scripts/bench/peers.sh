#!/usr/bin/env bash
# boltccl's all_sum side by side with the peers (MLX ring, Open MPI over TCP and shared memory,
# Gloo) in one run on this machine, with the peers' own harness (../shared/bench/peers).
#   scripts/bench.sh peers            # installs the peers on first use (apt, pip)
# Knobs: PEER_NS ("2 4"), PEER_ROUNDS (1), PEER_BUDGET_S (2.0), PEER_SIZES, BENCH_OUT;
# each round runs, per rank count, the peers' harness and then boltccl, into one results file;
# boltccl runs twice: "boltccl" as a user gets it (shared memory between these local ranks) and
# "boltccl-tcp" with BOLTCCL_BACKEND=tcp. BOLTCCL_BASELINE=/path/to/an/older/boltccl adds its
# figures as column "boltccl-baseline", measured in the same run (for before/after comparisons
# of a change); BOLTCCL_BIN measures a given build instead of building this checkout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS="${PEERS_DIR:-$ROOT/../shared/bench/peers}"
OUT="${BENCH_OUT:-$ROOT/target/bench-peers}"
mkdir -p "$OUT"
export PEER_VENV="${PEER_VENV:-$OUT/venv}" PEER_BUILD="$OUT/build" PEER_OUT="$OUT"
export PEER_SIZES="${PEER_SIZES:-4,1024,65536,1048576,16777216,67108864}"
export PEER_NS="${PEER_NS:-2 4}" PEER_ROUNDS="${PEER_ROUNDS:-1}" PEER_BUDGET_S="${PEER_BUDGET_S:-2.0}"

if [ -z "${BOLTCCL_BIN:-}" ]; then
  cargo build --release --manifest-path "$ROOT/Cargo.toml" -p boltccl-cli
fi
BIN="${BOLTCCL_BIN:-$ROOT/target/release/boltccl}"
# label=backend=binary
BINS=("boltccl=auto=$BIN" "boltccl-tcp=tcp=$BIN")
[ -n "${BOLTCCL_BASELINE:-}" ] && BINS+=("boltccl-baseline=auto=$BOLTCCL_BASELINE")
RES="$OUT/side-by-side-$(date +%Y%m%d-%H%M%S).jsonl"
: >"$RES"
# Each round runs, for each rank count, the peers' harness and then boltccl, so that a change
# in the machine's state that lasts minutes (this VM has them) falls on both alike rather than
# on one side's rounds.
first=1
for round in $(seq 1 "$PEER_ROUNDS"); do
  for n in $PEER_NS; do
    skip_setup=1
    [ "$first" = 1 ] && skip_setup="${PEER_SKIP_SETUP:-0}"
    first=0
    PEER_ROUNDS=1 PEER_NS="$n" PEER_SKIP_SETUP="$skip_setup" bash "$PEERS/run_all.sh"
    sed "s/\"round\": *[0-9]*/\"round\": $round/" "$(ls -t "$OUT"/run-*.jsonl | head -1)" >>"$RES"
    for entry in "${BINS[@]}"; do
      IFS== read -r label backend bin <<<"$entry"
      echo "--- n=$n $label (round $round)"
      BOLTCCL_BACKEND="$backend" "$bin" bench -n "$n" --ops all-sum --sizes "$PEER_SIZES" --budget-s "$PEER_BUDGET_S" \
        --json "$RES" --round "$round" --label "$label" || echo "$label n=$n failed rc=$?"
    done
  done
done
python3 "$ROOT/scripts/bench/peers-table.py" "$RES" | tee "$OUT/side-by-side.md"
