#!/usr/bin/env bash
# SmolLM2-135M-Instruct in Q4_K_M, the format most published GGUFs use, made from the Q4_1 file
# that fetch-model.sh brings, with llama.cpp's own quantiser (llama-cpp-python 0.3.36's
# llama_model_quantize; requantising from Q4_1, so the weights carry both roundings). The file
# mixes what llama.cpp's Q4_K_M recipe picks for this shape: Q5_0 where a row (576 wide) is not
# whole 256-element super-blocks, Q4_K / Q6_K for down_proj, Q8_0 / Q6_K elsewhere.
# Idempotent: does nothing if the file is already there.
# Usage: make-q4km.sh [CACHE_DIR]   (default: <repo>/target/models)
# LLAMA_PY: a Python with llama_cpp importable; by default target/llama-venv/bin/python, made
# on first use by scripts/llama-venv.sh (pip builds llama.cpp: minutes).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${1:-$ROOT/target/models}"
OUT="$CACHE/SmolLM2-135M-Instruct.Q4_K_M.gguf"
if [ -s "$OUT" ]; then
  echo "$OUT"
  exit 0
fi
SRC="$(bash "$HERE/fetch-model.sh" "$CACHE")"
LLAMA_PY="${LLAMA_PY:-$(bash "$ROOT/scripts/llama-venv.sh")}"
"$LLAMA_PY" - "$SRC" "$OUT" <<'PY'
import hashlib, os, sys
import llama_cpp
src, out = sys.argv[1:]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
params.allow_requantize = True
params.nthread = 2
tmp = out + ".part"
rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), params)
if rc != 0:
    sys.exit(f"llama_model_quantize failed ({rc})")
h = hashlib.sha256(open(tmp, "rb").read()).hexdigest()
print(f"{out}: sha256 {h}", file=sys.stderr)
# Rename last, so an interrupted run never leaves a partial file under the final name.
os.replace(tmp, out)
PY
echo "$OUT"
