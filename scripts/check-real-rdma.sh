#!/usr/bin/env bash
# Run once on each of two (or more) machines with real RDMA — Macs joined by a Thunderbolt 5
# cable with RDMA enabled, or Linux hosts with an RDMA NIC — to check the real path:
#   1. the verbs-abi layout test against this machine's <infiniband/verbs.h> (on a Mac, the
#      SDK's header: Apple's layouts have never been compared with rdma-core's);
#   2. `boltccl doctor` (library, devices, ports, GIDs; Thunderbolt Bridge, rdma_ctl on a Mac);
#   3. the conformance workload over the real verbs library (librdma.dylib / libibverbs.so.1),
#      for every algorithm, comparing the result with the in-process reference bit for bit.
#
# Usage, on every machine at about the same time (rank 0's address must be reachable over
# TCP from the others; the device matrix is the MLX format, `boltccl doctor --hosts` writes one):
#   scripts/check-real-rdma.sh RANK WORLD_SIZE RANK0_IP:PORT devices.json
# Prints PASS or FAIL per step; exits non-zero on any failure.
set -uo pipefail
[ $# -eq 4 ] || { sed -n '2,15p' "$0"; exit 2; }
RANK=$1 WORLD=$2 COORD=$3 MATRIX=$(cd "$(dirname "$4")" && pwd)/$(basename "$4")
cd "$(dirname "$0")/.."
fail=0
step() { if "$@"; then echo "PASS: $STEP"; else echo "FAIL: $STEP"; fail=1; fi; }

STEP="layout of <infiniband/verbs.h>"
if [ "$(uname)" = Darwin ]; then
    export VERBS_ABI_INCLUDE="$(xcrun --show-sdk-path)/usr/include"
fi
step env VERBS_ABI_REQUIRE=1 cargo test --release -p verbs-abi --test layout -- --nocapture

STEP="boltccl doctor"
step cargo run --release -p boltccl-cli -- doctor

STEP="build the conformance worker"
step cargo test --release -p boltccl --test verbs_conformance --no-run
exe=$(cargo test --release -p boltccl --test verbs_conformance --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | grep "/deps/verbs_conformance-" | tail -1)

for algo in auto mesh direct ring; do
    STEP="conformance over real RDMA, $WORLD ranks, algorithm $algo (this is rank $RANK)"
    out=$(env BOLTCCL_TEST_ROLE=worker BOLTCCL_TEST_WORKLOAD=suite BOLTCCL_TEST_REFERENCE=1 \
        BOLTCCL_RANK="$RANK" BOLTCCL_WORLD_SIZE="$WORLD" BOLTCCL_COORDINATOR="$COORD" \
        BOLTCCL_JOB_KEY="${BOLTCCL_JOB_KEY:-check-real-rdma}" BOLTCCL_BACKEND=verbs \
        BOLTCCL_IBV_DEVICES="$MATRIX" BOLTCCL_ALGO=$algo BOLTCCL_CHUNK_BYTES=4096 \
        BOLTCCL_MESH_MAX_BYTES=16384 BOLTCCL_LOG=boltccl=info \
        "$exe" --exact verbs_worker --nocapture --test-threads=1 2>&1)
    echo "$out" | grep -E "RDMA verbs mesh ready|REFERENCE|RESULT|error|panicked" | head -5
    step grep -q "REFERENCE .* MATCH" <<<"$out"
    # Give the other machines a moment to finish before the next round's coordinator binds.
    sleep 2
done
exit $fail
