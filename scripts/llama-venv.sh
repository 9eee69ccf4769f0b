#!/usr/bin/env bash
# target/llama-venv with llama-cpp-python 0.3.36 (pip builds llama.cpp from source: minutes, once)
# and gguf-py: the llama.cpp side of the inference example's cross-check test and of
# `scripts/bench/llm.sh`, and what examples/llm/tools/make_*.py (synthetic checkpoints) need.
# Idempotent: does nothing when the venv already imports both. Prints the venv's python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/target/llama-venv/bin/python"
if ! "$PY" -c 'import llama_cpp, gguf' 2>/dev/null; then
  python3 -m venv "$ROOT/target/llama-venv"
  "$PY" -m pip install -q --disable-pip-version-check "llama-cpp-python==0.3.36" numpy "gguf==0.19.0" >&2
fi
echo "$PY"
