#!/usr/bin/env python3
"""llama.cpp's greedy run on a GGUF, for the cross-check test (`tests/llama_cpp.rs`).

Runs llama-cpp-python (llama.cpp's own arithmetic: Q8 inputs, integer dot products) on the
prompt ids, then greedily `steps` tokens, one at a time, on one thread, and writes the logits
that chose each of the first `keep` tokens to OUT (little-endian f32, `keep` rows of the
vocabulary). Prints the greedy tokens as JSON. With a sixth argument `f32-kv` the KV cache
holds f32 instead of llama.cpp's default f16 (for float checkpoints, compared closely).

    llama_cpp_logits.py MODEL.gguf 1,9690,198 STEPS KEEP OUT.f32 [f32-kv]
"""
import json
import sys

import numpy as np
from llama_cpp import Llama


def main():
    path, ids, steps, keep, out = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], *sys.argv[3:6]
    steps, keep = int(steps), int(keep)
    kv = {}
    if sys.argv[6:] == ["f32-kv"]:
        kv = {"type_k": 0, "type_v": 0}  # GGML_TYPE_F32
    llm = Llama(model_path=path, n_ctx=512, n_threads=1, n_batch=512, logits_all=True, verbose=False, **kv)
    llm.eval(ids)
    tokens, rows = [], []
    for _ in range(steps):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        tok = int(np.argmax(logits))
        if len(rows) < keep:
            rows.append(logits)
        tokens.append(tok)
        llm.eval([tok])
    np.stack(rows).astype("<f4").tofile(out)
    print(json.dumps({"tokens": tokens, "vocab": int(rows[0].shape[0])}), flush=True)


if __name__ == "__main__":
    main()
