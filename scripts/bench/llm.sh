#!/usr/bin/env bash
# What tensor parallelism buys the inference example (SmolLM2-135M-Instruct Q4_1 GGUF, CPU
# backend, greedy), next to llama.cpp (llama-cpp-python) on the same file and the same cores.
# Each rank of a TP=2 run is a process pinned to a core of its own, so the two ranks stand in for
# two machines (joined here by shared memory, as ranks on one host are). Rows, run ROUNDS
# times interleaved (medians):
#   TP=1 on cores 0-1 (2 threads)    llama.cpp on cores 0-1 (2 threads)
#   TP=1 on core 0 (1 thread)        llama.cpp on core 0 (1 thread)
#   TP=2, rank r on core r (1 thread each), processes (shared memory between them)
#   TP=2, the same as two threads of one process (boltccl's in-memory transport)
#   TP=3, three processes on the two cores (a correctness row: more ranks than cores)
# plus the all_sum share of rank 0's decode time, rank 0's resident size, and whether each run
# printed TP=1's text. Needs 2 cores (CORE0, CORE1) and `taskset`. The llama.cpp rows run
# llama-cpp-python from LLAMA_PY, by default target/llama-venv, made on first use (pip builds
# llama.cpp from source: minutes); LLAMA_PY=none leaves them out.
#   ROUNDS=5 scripts/bench.sh llm
# Another GGUF: MODEL=path (e.g. a synthetic shape from examples/llm/tools/make_llama.py) and
# PROMPT_IDS=1,2,3 to feed token ids (both sides run the same ids, no chat template); then a
# last check compares TP=1's logits at the first 8 positions with llama.cpp's (teacher-forced).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TOKENS="${TOKENS:-128}"
PROMPT="${PROMPT:-Explain in a few sentences why the sky is blue.}"
ROUNDS="${ROUNDS:-5}"
C0="${CORE0:-0}"
C1="${CORE1:-1}"
bash examples/llm/fetch-model.sh >/dev/null
M="${MODEL:-$ROOT/target/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
IDS="${PROMPT_IDS:-}"
cargo build -q --release -p boltccl-cli -p boltccl-llm
B="$ROOT/target/release"
if [ -n "$IDS" ]; then
  LLM=("$B/boltccl-llm" --model "$M" --prompt-ids "$IDS" --max-tokens "$TOKENS")
else
  LLM=("$B/boltccl-llm" --model "$M" --prompt "$PROMPT" --max-tokens "$TOKENS")
fi
LLAMA_PY="${LLAMA_PY:-$ROOT/target/llama-venv/bin/python}"
if [ "$LLAMA_PY" = "$ROOT/target/llama-venv/bin/python" ]; then
  bash "$ROOT/scripts/llama-venv.sh" >/dev/null
fi
have_llama=0
if [ "$LLAMA_PY" != none ] && "$LLAMA_PY" -c 'import llama_cpp' 2>/dev/null; then have_llama=1; fi

# llama.cpp through llama-cpp-python: decode rate from the first streamed token to the last
# (the example's rate counts the same way), and the Python process's resident size. With
# PROMPT_IDS: the ids evaluated in one batch (prefill), then greedy steps of one token.
llama() { # cores threads
  taskset -c "$1" "$LLAMA_PY" - "$M" "$PROMPT" "$TOKENS" "$2" "$IDS" <<'PY'
import sys, time
from llama_cpp import Llama
model, prompt, n, threads, ids = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llm = Llama(model_path=model, n_ctx=512, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
if ids:
    ids = [int(x) for x in ids.split(",")]
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    print(f"prefill: {len(ids)} tokens in {t1 - t0:.3f}s = {len(ids) / (t1 - t0):.2f} tok/s")
    count, t_first = 0, time.perf_counter()
    for _ in range(n - 1):  # the first token came from the prefill's logits
        llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
        count += 1
    t_end = time.perf_counter()
    print(f"decode: {count / (t_end - t_first):.2f} tok/s")
else:
    stream = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=n, temperature=0.0, stream=True)
    t_first, count = None, 0
    for chunk in stream:
        if chunk["choices"][0]["delta"].get("content"):
            count += 1
            if t_first is None:
                t_first = time.perf_counter()
    t_end = time.perf_counter()
    print(f"decode: {(count - 1) / (t_end - t_first):.2f} tok/s")
rss = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS:")][0]
print(f"memory: process resident {int(rss) / 1024:.1f} MiB")
PY
}

# One run of configuration $1; appends "tok/s share comm wait rss md5" to $RES/$1.
run() {
  local log out
  log="$(mktemp)"
  out="$(mktemp)"
  case "$1" in
    tp1x2) taskset -c "$C0,$C1" "${LLM[@]}" --threads 2 >"$out" 2>"$log" ;;
    tp1x1) taskset -c "$C0" "${LLM[@]}" --threads 1 >"$out" 2>"$log" ;;
    # Rank r on core r: each process pins itself before it starts (the ranks tell each other
    # their cores, so each knows it has one to itself and polls while it waits).
    tp2) "$B/boltccl" launch -n 2 -- \
      bash -c 'c=('"$C0 $C1"'); exec taskset -c "${c[$BOLTCCL_RANK]}" "$@"' _ \
      "${LLM[@]}" --threads 1 >"$out" 2>"$log" ;;
    tp2mem) taskset -c "$C0,$C1" "${LLM[@]}" --local-ranks 2 --threads 1 >"$out" 2>"$log" ;;
    tp3) "$B/boltccl" launch -n 3 -- "${LLM[@]}" --threads 1 >"$out" 2>"$log" ;;
    llama2) llama "$C0,$C1" 2 >"$log" 2>&1 ;;
    llama1) llama "$C0" 1 >"$log" 2>&1 ;;
  esac
  num() { grep -o "$1" "$log" | grep -o '[0-9.]*' | head -1 || true; }
  local dec share comm wait rss sum pre
  dec="$(grep -o 'decode: .*[0-9.]* tok/s' "$log" | grep -o '[0-9.]* tok/s' | grep -o '[0-9.]*' | head -1 || true)"
  pre="$(grep -o 'prefill: .*[0-9.]* tok/s' "$log" | grep -o '[0-9.]* tok/s' | grep -o '[0-9.]*' | head -1 || true)"
  share="$(num '= [0-9.]*% of decode time')"
  comm="$(num '[0-9.]*% communicating')"
  wait="$(num '[0-9.]*% waiting')"
  rss="$(num 'resident [0-9.]* MiB')"
  sum="-"
  # `boltccl launch` tags each line of a rank's output with "[rank] ".
  case "$1" in llama*) ;; *) sum="$(sed 's/^\[[0-9]*\] //' "$out" | md5sum | cut -c1-8)" ;; esac
  echo "${dec:-?} ${share:--} ${comm:--} ${wait:--} ${rss:--} $sum ${pre:--}" >>"$RES/$1"
  rm -f "$log" "$out"
}

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "?"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v c="$2" '{ print $c }' "$RES/$1" | grep -v '^[-?]$' | median; }

RES="$(mktemp -d)"
trap 'rm -rf "$RES"' EXIT
configs=(tp1x2 tp1x1 tp2 tp2mem tp3)
[ "$have_llama" = 1 ] && configs+=(llama2 llama1)
echo "$(date -u +%Y-%m-%d) $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), cores $C0,$C1;" \
  "GGUF $(( $(stat -c %s "$M") / 1048576 )) MiB; $TOKENS tokens, $ROUNDS interleaved rounds; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$ROUNDS"); do
  for c in "${configs[@]}"; do run "$c"; done
done

tok() { col "$1" 1; }
text() { # same text as TP=1 (2 threads) in every round?
  local ref
  ref="$(awk '{ print $6 }' "$RES/tp1x2" | sort -u)"
  if [ "$(awk '{ print $6 }' "$RES/$1" | sort -u)" = "$ref" ] && [ "$(echo "$ref" | wc -l)" = 1 ]; then echo yes; else echo NO; fi
}
row() { # config label cores
  local share="-"
  [ "$(col "$1" 2)" != "?" ] && share="$(col "$1" 2)% ($(col "$1" 3)% + $(col "$1" 4)%)"
  echo "| $2 | $3 | $(tok "$1") | $(col "$1" 7) | $share | $(col "$1" 5) | $( [ "${1#llama}" = "$1" ] && text "$1" || echo '—') |"
}
echo "| run | cores | decode tok/s | prefill tok/s | all_sum share of decode (communicating + waiting) | rank 0 resident MiB | same text as TP=1 |"
echo "|---|---|---|---|---|---|---|"
row tp1x2 "boltccl-llm TP=1, 2 threads" "$C0,$C1"
[ "$have_llama" = 1 ] && row llama2 "llama.cpp, 2 threads" "$C0,$C1"
row tp1x1 "boltccl-llm TP=1, 1 thread" "$C0"
[ "$have_llama" = 1 ] && row llama1 "llama.cpp, 1 thread" "$C0"
row tp2 "boltccl-llm TP=2, 1 process per core (shared memory)" "$C0 + $C1"
row tp2mem "boltccl-llm TP=2, 2 threads of 1 process (in-memory)" "$C0,$C1"
row tp3 "boltccl-llm TP=3, 3 processes on 2 cores (shared memory)" "$C0,$C1"
echo
echo "Rounds, in order (decode tok/s):"
for c in "${configs[@]}"; do echo "  $c: $(awk '{ printf "%s ", $1 }' "$RES/$c")"; done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else print "?" }'; }
echo
echo "TP=2 (one core per rank) / TP=1 on one core: $(ratio "$(tok tp2)" "$(tok tp1x1)")"
echo "TP=2 (two threads, in-memory) / TP=1 on one core: $(ratio "$(tok tp2mem)" "$(tok tp1x1)")"
if [ "$have_llama" = 1 ]; then
  echo "TP=1 2 threads / llama.cpp 2 threads: $(ratio "$(tok tp1x2)" "$(tok llama2)")"
  echo "TP=2 (one core per rank) / llama.cpp on one core: $(ratio "$(tok tp2)" "$(tok llama1)")"
  echo "TP=2 (two threads, in-memory) / llama.cpp on one core: $(ratio "$(tok tp2mem)" "$(tok llama1)")"
else
  echo "llama.cpp rows not run (LLAMA_PY=$LLAMA_PY has no llama_cpp)"
fi
if [ "$have_llama" = 1 ] && [ -n "$IDS" ]; then
  # The first 8 positions, teacher-forced: llama.cpp runs 8 greedy steps (one thread) and keeps
  # the logits of each; TP=1 (one thread) is fed the prompt plus llama.cpp's first k tokens
  # for k = 0..7, so both sides score the same inputs at every position, whatever each would
  # have chosen on its own.
  theirs="$(taskset -c "$C0" "$LLAMA_PY" "$ROOT/examples/llm/tools/llama_cpp_logits.py" "$M" "$IDS" 8 8 "$RES/theirs.f32")"
  read -ra toks <<<"$(echo "$theirs" | "$LLAMA_PY" -c 'import json, sys; print(*json.load(sys.stdin)["tokens"])')"
  forced="$IDS"
  for k in $(seq 0 7); do
    taskset -c "$C0" "$B/boltccl-llm" --model "$M" --prompt-ids "$forced" --max-tokens 1 --threads 1 \
      --dump-logits "$RES/ours$k.f32" >/dev/null 2>&1
    forced="$forced,${toks[$k]}"
  done
  "$LLAMA_PY" - "$RES" "$theirs" <<'PY'
import json, sys
import numpy as np
res, theirs = sys.argv[1], json.loads(sys.argv[2])
rows = np.fromfile(f"{res}/theirs.f32", dtype="<f4").reshape(8, theirs["vocab"])
ours = [np.fromfile(f"{res}/ours{k}.f32", dtype="<f4")[: theirs["vocab"]] for k in range(8)]
diffs = [float(np.abs(a - b).max()) for a, b in zip(ours, rows)]
mine = [int(a.argmax()) for a in ours]
same = sum(a == b for a, b in zip(mine, theirs["tokens"]))
print(f"logits of the first 8 positions (teacher-forced with llama.cpp's tokens), TP=1 vs llama.cpp: "
      f"max |diff| per position {' '.join(f'{d:.3g}' for d in diffs)}; largest |logit| {np.abs(rows).max():.3g}")
print(f"greedy tokens: llama.cpp {theirs['tokens']}, TP=1 {mine}: {same}/8 the same")
PY
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
