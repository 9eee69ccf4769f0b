#!/usr/bin/env bash
# Compute while communicating: matrix products during an async 64 MiB all_sum, against both
# measured apart (scripts/bench/overlap.py; medians of REPS, default 5). One BLAS thread per
# rank. Needs target/frameworks-venv or target/bindings-venv (numpy and the wheel).
#
#   scripts/bench.sh overlap               2 ranks on loopback (BENCH_RANKS=4 for 4)
#   scripts/bench.sh overlap 1gbit         2 ranks in two network namespaces joined by one veth
#                                          "cable" capped at that rate by tc tbf (root, iproute2),
#                                          as two machines on a link: only 10.253.0.x, inside them
#
# On loopback the transfer is CPU work (the kernel copies every byte) and competes with the
# compute for the same cores; over a link the wire does the waiting, and the compute fills it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
py="${PYTHON:-$root/target/frameworks-venv/bin/python}"
[ -x "$py" ] || py="$root/target/bindings-venv/bin/python"
rate="${1:-}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "load before: $(cat /proc/loadavg)"
if [ -z "$rate" ]; then
    timeout 600 "$py" -m boltccl.launch -n "${BENCH_RANKS:-2}" --timeout 580 scripts/bench/overlap.py --reps "${REPS:-5}"
else
    tag="ov$$"
    cleanup() { ip netns del "${tag}0" 2>/dev/null || true; ip netns del "${tag}1" 2>/dev/null || true; }
    trap cleanup EXIT INT TERM
    for r in 0 1; do ip netns add "$tag$r"; ip -n "$tag$r" link set lo up; done
    ip link add "${tag}a" netns "${tag}0" type veth peer "${tag}b" netns "${tag}1"
    for r in 0 1; do
        dev="${tag}$([ "$r" = 0 ] && echo a || echo b)"
        ip -n "$tag$r" addr add "10.253.0.$((r + 1))/24" dev "$dev"
        ip -n "$tag$r" link set "$dev" mtu 9000 up
        ip netns exec "$tag$r" tc qdisc add dev "$dev" root tbf rate "$rate" burst 256kb limit 64mb
    done
    key="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
    pids=()
    for r in 0 1; do
        ip netns exec "$tag$r" env BOLTCCL_RANK="$r" BOLTCCL_WORLD_SIZE=2 BOLTCCL_LOCAL_WORLD_SIZE=1 \
            BOLTCCL_COORDINATOR=10.253.0.1:29400 BOLTCCL_JOB_KEY="$key" \
            timeout 600 "$py" scripts/bench/overlap.py --reps "${REPS:-5}" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    echo "link: one veth pair, tc tbf $rate each way"
fi
echo "load after: $(cat /proc/loadavg)"
