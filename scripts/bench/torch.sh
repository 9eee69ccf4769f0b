#!/usr/bin/env bash
# torch.distributed all_reduce, backend "boltccl" against "gloo" (the same script, the backend
# swapped), 2 and 4 ranks under torchrun, float32 at 4 B, 1 KiB, 1 MiB, 16 MiB, 64 MiB; and
# `boltccl bench` at 4 B and 64 MiB in the same run, for what the torch layer costs, with
# torch's own per-call cost (its no-op C++ process group) beneath it. Rounds
# alternate the backends (ROUNDS, default 2); the table shows medians over rounds. The bench
# gets the torch script's time budget per size (BENCH_BUDGET_S, 1.5 s), so both warm alike,
# and buffers paged as torch's tensors are: ordinary pages, or with TORCH_THP=1 huge pages for
# all three (torch's own THP_MEM_ALLOC_ENABLE=1, and the bench's --pages huge).
# Needs target/frameworks-venv (scripts/test-frameworks.sh).
#   scripts/bench.sh torch            ROUNDS=3 BENCH_NS="2" scripts/bench.sh torch
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
py="${PYTHON:-$root/target/frameworks-venv/bin/python}"
"$py" -c "import torch, boltccl.torch" 2>/dev/null || { echo "run scripts/test-frameworks.sh first (it makes $py)" >&2; exit 1; }
cargo build -q --release -p boltccl-cli -j"${CARGO_BUILD_JOBS:-2}"
bin="${CARGO_TARGET_DIR:-$root/target}/release/boltccl"
out="${BENCH_OUT:-$root/target/bench-torch.jsonl}"
pages=small
if [ "${TORCH_THP:-0}" = 1 ]; then
    pages=huge
    export THP_MEM_ALLOC_ENABLE=1
fi
: > "$out"
echo "load before: $(cat /proc/loadavg); pages: $pages"
for round in $(seq "${ROUNDS:-2}"); do
    for n in ${BENCH_NS:-2 4}; do
        for backend in boltccl gloo; do
            timeout 900 "$py" -m torch.distributed.run --standalone --nproc-per-node "$n" \
                scripts/bench/torch_allreduce.py --backend "$backend" --round "$round" "$out" >/dev/null 2>&1 \
                || { echo "torch_allreduce.py --backend $backend at $n ranks failed" >&2; exit 1; }
        done
        timeout 600 "$bin" bench -n "$n" --ops all-sum --sizes 4,64M --budget-s "${BENCH_BUDGET_S:-1.5}" --pages "$pages" --json "$out" --round "$round" --label boltccl-bench >/dev/null
    done
done
echo "load after: $(cat /proc/loadavg)"
"$py" scripts/bench/torch-table.py "$out"
# shellcheck disable=SC2086
"$py" scripts/bench/torch_floor.py 1 ${BENCH_NS:-2 4}
