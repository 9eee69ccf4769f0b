#!/usr/bin/env bash
# Decode speed of the inference example (SmolLM2-135M-Instruct Q4_1, CPU backend, greedy) at
# TP = 1, 2, 3 (separate processes over TCP through `boltccl launch`), side by side with
# llama.cpp (llama-cpp-python) on the same GGUF file when LLAMA_PY points to a Python that
# has it. Prints one table of medians over ROUNDS runs (each column's median on its own).
#   scripts/bench.sh llm                      # TOKENS (128), PROMPT, ROUNDS (5), LLAMA_PY
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TOKENS="${TOKENS:-128}"
PROMPT="${PROMPT:-Explain in a few sentences why the sky is blue.}"
CORES="$(nproc)"
bash examples/llm/fetch-model.sh >/dev/null
M="$ROOT/target/models/SmolLM2-135M-Instruct.Q4_1.gguf"
cargo build -q --release -p boltccl-cli -p boltccl-llm
B="$ROOT/target/release"
ROUNDS="${ROUNDS:-5}"
# Median of the numbers on stdin.
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "?"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rows=()
for tp in 1 2 3; do
  threads=$(( CORES / tp )); [ "$threads" -ge 1 ] || threads=1
  dec=(); share=(); comm=(); wait=()
  for _ in $(seq "$ROUNDS"); do
    log="$(mktemp)"
    RAYON_NUM_THREADS=$threads "$B/boltccl" launch -n "$tp" -- "$B/boltccl-llm" --model "$M" \
      --prompt "$PROMPT" --max-tokens "$TOKENS" >"$log.out" 2>"$log"
    dec+=("$(grep -o 'decode: .*= [0-9.]* tok/s' "$log" | grep -o '[0-9.]* tok/s' | grep -o '[0-9.]*' | head -1)")
    share+=("$(grep -o '= [0-9.]*% of decode time' "$log" | grep -o '[0-9.]*' | head -1)")
    comm+=("$(grep -o '[0-9.]*% communicating' "$log" | grep -o '[0-9.]*' | head -1)")
    wait+=("$(grep -o '[0-9.]*% waiting' "$log" | grep -o '[0-9.]*' | head -1)")
    rm -f "$log" "$log.out"
  done
  m() { printf '%s\n' "$@" | median; }
  rows+=("| boltccl-llm TP=$tp ($tp process(es), $threads thread(s) each) | $(m "${dec[@]}") tok/s | $(m "${share[@]}")% | $(m "${comm[@]}")% | $(m "${wait[@]}")% |")
done
if [ -n "${LLAMA_PY:-}" ] && "$LLAMA_PY" -c 'import llama_cpp' 2>/dev/null; then
  dec=$("$LLAMA_PY" - "$M" "$PROMPT" "$TOKENS" "$CORES" <<'PY'
import sys, time
from llama_cpp import Llama
model, prompt, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=model, n_ctx=512, n_threads=threads, verbose=False)
msgs = [{"role": "user", "content": prompt}]
stream = llm.create_chat_completion(msgs, max_tokens=n, temperature=0.0, stream=True)
t_first, count = None, 0
for chunk in stream:
    if chunk["choices"][0]["delta"].get("content"):
        count += 1
        if t_first is None:
            t_first = time.perf_counter()
t_end = time.perf_counter()
print(f"{(count - 1) / (t_end - t_first):.2f} tok/s")
PY
)
  rows+=("| llama.cpp (llama-cpp-python, $CORES threads) | $dec | — | — | — |")
else
  rows+=("| llama.cpp | not run (set LLAMA_PY to a Python with llama-cpp-python) | — | — | — |")
fi
echo "| run | decode | all_sum, share of decode time (rank 0) | of which communicating | of which waiting for slower ranks |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
