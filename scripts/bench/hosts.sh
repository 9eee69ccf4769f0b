#!/usr/bin/env bash
# Two "hosts" of two ranks each (network namespaces joined by a veth pair; root needed):
# float32 all_sum with shared memory inside each host and TCP between (BOLTCCL_BACKEND=auto)
# against TCP everywhere, side by side, from one run. Only addresses inside the namespaces this
# script creates are used (10.253.9.x).
#   scripts/bench.sh hosts            SIZES=4,1K,64K,1M,16M,64M BUDGET=1.0
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZES="${SIZES:-4,1024,65536,1048576,16777216,67108864}"
BUDGET="${BUDGET:-1.0}"
cargo build -q --release -p boltccl-cli
BIN="$PWD/target/release/boltccl"
TAG="bh$$"
cleanup() { ip netns del "${TAG}_0" 2>/dev/null || true; ip netns del "${TAG}_1" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
for k in 0 1; do ip netns add "${TAG}_$k"; ip -n "${TAG}_$k" link set lo up; done
ip link add "${TAG}a" netns "${TAG}_0" type veth peer "${TAG}b" netns "${TAG}_1"
ip -n "${TAG}_0" addr add 10.253.9.1/24 dev "${TAG}a"
ip -n "${TAG}_1" addr add 10.253.9.2/24 dev "${TAG}b"
ip -n "${TAG}_0" link set "${TAG}a" up
ip -n "${TAG}_1" link set "${TAG}b" up

run() { # backend -> JSON lines on stdout
    local json pids=() rc=0
    json=$(mktemp)
    for r in 0 1 2 3; do
        ip netns exec "${TAG}_$((r / 2))" env BOLTCCL_RANK=$r BOLTCCL_WORLD_SIZE=4 \
            BOLTCCL_COORDINATOR=10.253.9.1:29777 BOLTCCL_JOB_KEY=bench BOLTCCL_BACKEND="$1" \
            BOLTCCL_LOCAL_WORLD_SIZE=2 timeout 600 "$BIN" bench --ops all-sum --sizes "$SIZES" \
            --budget-s "$BUDGET" --json "$json" --label "$1" >/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    [ "$rc" = 0 ] || { echo "backend $1 failed" >&2; exit 1; }
    cat "$json"
    rm -f "$json"
}
out=$(mktemp)
run auto >>"$out"
run tcp >>"$out"
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
fig = {(r["peer"], r["bytes"]): r for r in rows}
print("| size | shared memory + TCP: latency us / busbw GB/s | TCP only | busbw ratio |")
print("|---|---|---|---|")
for b in sorted({r["bytes"] for r in rows}):
    a, t = fig[("auto", b)], fig[("tcp", b)]
    print(f"| {b} | {a['median_us']:.1f} / {a['busbw_gbps']:.3f} | {t['median_us']:.1f} / {t['busbw_gbps']:.3f} | {a['busbw_gbps'] / t['busbw_gbps']:.2f}x |")
PY
rm -f "$out"
