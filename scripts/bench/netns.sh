#!/usr/bin/env bash
# Benchmark (not a test): 4 ranks, each in its own network namespace, fully meshed by veth
# pairs (one "cable" per pair, as 4 Macs joined by 6 Thunderbolt cables), every link capped by
# `tc tbf` in both directions. The verbs transport runs over softverbs (the software UC
# provider). Compares 64 MiB all_sum with direct reduce-scatter/all-gather (uses all 3 links
# of each rank) against the bidirectional ring (uses 2 of them).
#
# BENCH_TOPOLOGY=ring instead cables only ring neighbours (i, i+1): the other pairs are joined
# by "Ethernet" links capped at BENCH_ETH_RATE (default 25mbit) that the device matrix leaves
# out, so boltccl uses TCP there. It then compares `auto` (which sees the ring and keeps the
# data on the cables with the ring algorithms) against forcing direct (which must use the
# Ethernet pairs too).
#
# Needs root, iproute2 and tc. Usage: scripts/bench.sh netns [rate, default 100mbit] [bytes, default 64 MiB]
# Environment: BENCH_ITERS (timed calls, default 3), BENCH_RANKS (default 4), BENCH_WRAP (a command
# prefix for each rank, e.g. "taskset -c 0"), BENCH_TOPOLOGY (mesh or ring), BENCH_ETH_RATE.
# Only addresses inside the namespaces this script creates are used (10.252.x.y).
set -euo pipefail

RATE="${1:-100mbit}"
BYTES="${2:-67108864}"
ITERS="${BENCH_ITERS:-3}"
N="${BENCH_RANKS:-4}"
TOPOLOGY="${BENCH_TOPOLOGY:-mesh}"
ETH_RATE="${BENCH_ETH_RATE:-25mbit}"
TAG="bb$$"
RPS_MASK=$(printf '%x' $(( (1 << $(nproc)) - 1 )))
cd "$(dirname "$0")/../.."

cargo build -j1 --release -p boltccl-cli -p softverbs >&2
EXE="$PWD/target/release/boltccl"
LIB="$PWD/target/release/deps/libsoftverbs.so"
[ -e "$LIB" ] || { echo "libsoftverbs.so not built" >&2; exit 1; }

NS=()
cleanup() {
    for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -f "$MATRIX"
}
MATRIX="$(mktemp /tmp/boltccl-bench-matrix.XXXXXX.json)"
trap cleanup EXIT INT TERM

iface() { echo "${TAG}$1$2"; }
addr() { local a=$(( $1 < $2 ? $1 : $2 )) b=$(( $1 < $2 ? $2 : $1 )); echo "10.252.$((10 * a + b)).$(($1 + 1))"; }
identity() { if [ "$1" = 0 ]; then addr 0 1; else addr "$1" 0; fi; }
# Whether ranks $1 and $2 are joined by a cable (an RDMA device in the matrix).
cabled() {
    [ "$TOPOLOGY" = mesh ] && return 0
    local d=$(( ($1 - $2 + N) % N ))
    [ "$d" = 1 ] || [ "$d" = $((N - 1)) ]
}

for k in $(seq 0 $((N - 1))); do
    ns="${TAG}_$k"
    ip netns add "$ns"
    NS+=("$ns")
    ip -n "$ns" link set lo up
done
for i in $(seq 0 $((N - 1))); do
    for j in $(seq $((i + 1)) $((N - 1))); do
        a=$(iface "$i" "$j"); b=$(iface "$j" "$i")
        ip link add "$a" netns "${TAG}_$i" type veth peer "$b" netns "${TAG}_$j"
        ip -n "${TAG}_$i" addr add "$(addr "$i" "$j")/24" dev "$a"
        ip -n "${TAG}_$j" addr add "$(addr "$j" "$i")/24" dev "$b"
        for end in "$i:$a" "$j:$b"; do
            ns="${TAG}_${end%%:*}"; dev="${end#*:}"
            # softverbs sends 4 KiB-MTU fragments as single UDP datagrams: a 1500-byte link
            # would IP-fragment them, and reassembly limits drop whole datagrams under load.
            ip -n "$ns" link set "$dev" mtu 9000 up
            # veth delivers into the backlog of whichever CPU dequeued the packet from tbf, so
            # one flow can be reordered across CPUs; RPS steers each flow to one CPU, keeping
            # the link in order as a cable is (UC drops a message whose fragments reorder).
            ip netns exec "$ns" sh -c "echo $RPS_MASK > /sys/class/net/$dev/queues/rx-0/rps_cpus"
            # A large limit: tbf delays instead of dropping, so UDP senders are paced by
            # their socket buffers (UC would turn drops into errors).
            if cabled "$i" "$j"; then rate="$RATE"; else rate="$ETH_RATE"; fi
            ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst 64kb limit 64mb
        done
    done
done
for i in $(seq 0 $((N - 1))); do
    for j in $(seq 0 $((N - 1))); do
        [ "$i" = "$j" ] && continue
        ip -n "${TAG}_$i" route replace "$(identity "$j")/32" dev "$(iface "$i" "$j")"
        # Permanent neighbour entries: while ARP resolves, the kernel queues only ~200 KB for
        # an unresolved neighbour and drops the rest, so a flow's first large UDP burst would
        # be cut. (RoCE resolves the address at RTR; softverbs does not.)
        mac=$(ip netns exec "${TAG}_$j" cat "/sys/class/net/$(iface "$j" "$i")/address")
        ip -n "${TAG}_$i" neigh replace "$(addr "$j" "$i")" lladdr "$mac" dev "$(iface "$i" "$j")" nud permanent
        if [ "$j" = 0 ] || [ "$i" = 0 ]; then :; else
            ip -n "${TAG}_$i" neigh replace "$(identity "$j")" lladdr "$mac" dev "$(iface "$i" "$j")" nud permanent
        fi
    done
done
{
    echo -n "["
    for i in $(seq 0 $((N - 1))); do
        [ "$i" -gt 0 ] && echo -n ","
        echo -n "["
        for j in $(seq 0 $((N - 1))); do
            [ "$j" -gt 0 ] && echo -n ","
            if [ "$i" = "$j" ] || ! cabled "$i" "$j"; then echo -n null; else echo -n "\"rdma_$(iface "$i" "$j")\""; fi
        done
        echo -n "]"
    done
    echo "]"
} >"$MATRIX"

run() { # algo port: prints "BENCH algo=<setting> ran=<algorithm> time_ms=... busbw_MBps=..."
    local pids=() out rc=0 json
    out=$(mktemp)
    json=$(mktemp)
    for k in $(seq 0 $((N - 1))); do
        ip netns exec "${TAG}_$k" env \
            BOLTCCL_RANK="$k" BOLTCCL_WORLD_SIZE=$N BOLTCCL_COORDINATOR="$(identity 0):$2" \
            BOLTCCL_JOB_KEY=bench BOLTCCL_BACKEND=verbs BOLTCCL_IBV_LIBRARY="$LIB" \
            BOLTCCL_IBV_DEVICES="$MATRIX" BOLTCCL_ALGO="$1" BOLTCCL_CHUNK_BYTES=262144 \
            BOLTCCL_TIMEOUT_MS=60000 SOFTVERBS_QUIET=1 ${BENCH_WRAP:-} timeout 600 \
            "$EXE" bench --ops all-sum --sizes "$BYTES" --iters "$ITERS" --warmup 1 --json "$json" >>"$out" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    if [ "$rc" != 0 ]; then
        cat "$out" >&2
        rm -f "$out"
        for ns in "${NS[@]}"; do ip netns exec "$ns" tc -s qdisc show | grep -B1 -A2 dropped | grep -v "dropped 0," >&2 || true; done
        for ns in "${NS[@]}"; do ip netns exec "$ns" grep '^Udp:' /proc/net/snmp | tail -1 >&2; done
        return 1
    fi
    python3 - "$json" "$1" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).readline())
print(f"BENCH ranks={r['n']} algo={sys.argv[2]} ran={r['algo']} bytes={r['bytes']} "
      f"time_ms={r['median_us'] / 1e3:.1f} busbw_MBps={r['busbw_gbps'] * 1e3:.1f}")
PY
    rm -f "$out" "$json"
}

bw() { sed -n 's/.*busbw_MBps=\([0-9.]*\).*/\1/p' <<<"$1"; }
if [ "$TOPOLOGY" = ring ]; then
    echo "$N ranks cabled as a ring ($RATE per direction, tc tbf), the other pairs on $ETH_RATE Ethernet (TCP); $BYTES-byte all_sum, $ITERS timed calls"
    a=$(run auto 29413); echo "$a"
    d=$(run direct 29414); echo "$d"
    awk -v a="$(bw "$a")" -v d="$(bw "$d")" 'BEGIN { printf "auto (ring over the cables) / direct (cables + Ethernet) bus bandwidth: %.2fx\n", a / d }'
    exit 0
fi
echo "$N ranks, full mesh of veth links, each direction capped at $RATE by tc tbf; $BYTES-byte all_sum, $ITERS timed calls"
d=$(run direct 29411); echo "$d"
r=$(run ring 29412); echo "$r"
awk -v d="$(bw "$d")" -v r="$(bw "$r")" 'BEGIN { printf "direct / ring bus bandwidth: %.2fx (target >= 1.3x)\n", d / r }'
