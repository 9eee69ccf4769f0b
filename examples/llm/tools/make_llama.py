#!/usr/bin/env python3
"""A synthetic Llama-3 GGUF of a real model's shape, for timing and memory (not for text: the
weights are seeded random numbers). Writes it as F16 with gguf-py, tensor by tensor (memory
holds one), quantises it with llama.cpp's own `llama_model_quantize` (llama-cpp-python) and
deletes the F16.

Shapes: `1b` is Llama-3.2-1B (16 layers, hidden 2048, 32/8 heads of 64, MLP 8192, tied
embeddings), `8b` is Llama-3.1-8B (32 layers, hidden 4096, 32/8 heads of 128, MLP 14336).
Both: vocabulary 128,256, RoPE base 500,000 and Llama 3.1's `rope_freqs` scaling table. The
tokenizer keys are SmolLM2's (`--tokenizer`), padded with reserved control tokens to 128,256
entries so the embedding and output head have Llama 3's size; prompts are given as ids.

    make_llama.py --shape 1b --tokenizer SmolLM2.gguf --llama-py target/llama-venv/bin/python \\
        --out llama-1b.Q4_K_M.gguf

Needs gguf-py and numpy in this python (target/llama-venv, from scripts/llama-venv.sh, has both).
"""
import argparse
import math
import sys

import gguf
import numpy as np
from synthetic import copy_tokenizer, quantize_and_remove, write_tensors

SHAPES = {
    "1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192, tied=True),
    "8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, tied=False),
}
VOCAB = 128256

def rope_freqs(head_dim, base=500000.0, factor=32.0, low=1.0, high=4.0, original=8192):
    """Llama 3.1's frequency divisors (one per rotated pair), as its converter writes them."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=SHAPES, required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--llama-py", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    h, hd, f = s["hidden"], s["head_dim"], s["ffn"]
    f16_path = a.out + ".f16.gguf"
    w = gguf.GGUFWriter(f16_path, "llama")
    w.add_name(f"synthetic Llama 3 {a.shape}")
    w.add_context_length(131072)
    w.add_embedding_length(h)
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(f)
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    copy_tokenizer(w, gguf.GGUFReader(a.tokenizer), pad_to=VOCAB)
    # (name, shape outermost first, fan-in; 0 for a norm, None for the embedding)
    specs = [("token_embd.weight", (VOCAB, h), None), ("output_norm.weight", (h,), 0), ("rope_freqs.weight", (hd // 2,), -1)]
    if not s["tied"]:
        specs.append(("output.weight", (VOCAB, h), h))
    for layer in range(s["layers"]):
        p = f"blk.{layer}."
        specs += [
            (p + "attn_norm.weight", (h,), 0),
            (p + "attn_q.weight", (s["heads"] * hd, h), h),
            (p + "attn_k.weight", (s["kv_heads"] * hd, h), h),
            (p + "attn_v.weight", (s["kv_heads"] * hd, h), h),
            (p + "attn_output.weight", (h, s["heads"] * hd), s["heads"] * hd),
            (p + "ffn_norm.weight", (h,), 0),
            (p + "ffn_gate.weight", (f, h), h),
            (p + "ffn_up.weight", (f, h), h),
            (p + "ffn_down.weight", (h, f), f),
        ]
    # Norms and the frequency table stay f32 (as llama.cpp's converter writes them).
    dtype = lambda name, fan: np.float32 if fan in (0, -1) else np.float16
    write_tensors(w, specs, dtype, lambda name: rope_freqs(hd) if name == "rope_freqs.weight" else None, a.seed)
    rc = quantize_and_remove(a.llama_py, f16_path, a.out, a.threads)
    sys.exit(rc)


if __name__ == "__main__":
    main()
