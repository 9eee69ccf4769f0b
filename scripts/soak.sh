#!/usr/bin/env bash
# The chaos soak: jobs of 2-4 rank processes in network namespaces, over TCP and verbs
# (softverbs), running random collectives checked element by element, while one random fault
# per job is injected (kill -9, SIGSTOP, a partition by veth or nftables, garbage on the
# coordinator's port, lost/repeated/reordered/corrupted datagrams, a failing device, or none).
# Ranks restart their group after an error, as a user would; a dead rank ends its job.
#
#   scripts/soak.sh --minutes 30 [--seed N]     # needs root, iproute2, tc, nftables
#
# Prints jobs, faults by kind, calls completed and checked, errors by kind, wrong answers
# (must be 0), hangs (must be 0), crashes, and the largest growth of open files and RSS within a
# worker; exits non-zero on any wrong answer, hang or crash. The test is boltccl/tests/soak.rs
# (run in a release build); SOAK_LOG=debug shows the library's log of every rank.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
minutes=1
seconds=""
seed=""
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        *) echo "usage: $0 [--minutes N | --seconds N] [--seed N]" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "the soak runs ranks in network namespaces: run it as root" >&2; exit 1; }
bash scripts/deps.sh iproute2 nftables
export SOAK_SECONDS="${seconds:-$((minutes * 60))}" CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
[ -n "$seed" ] && export SOAK_SEED="$seed"
report="$(mktemp)"
export SOAK_REPORT="$report"
cargo test --release -q -p boltccl --test soak --no-run
echo "== soak for $SOAK_SECONDS s; load before: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min), $(nproc) cores"
start=$(date +%s)
status=0
cargo test --release -q -p boltccl --test soak -- --ignored --nocapture --test-threads=1 chaos_soak || status=$?
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min); $(( $(date +%s) - start )) s"
cat "$report" 2>/dev/null || true
rm -f "$report"
exit "$status"
