#!/usr/bin/env python3
"""A synthetic Qwen3-MoE GGUF of realistic shape, for timing (not for text: the weights are
seeded random numbers). Writes it as F16 with gguf-py, tensor by tensor (memory holds one),
quantises it with llama.cpp's `llama_model_quantize` (llama-cpp-python) and deletes the F16.
The tokenizer keys are copied from a GGUF that has them (SmolLM2's: vocabulary 49152), so
llama.cpp loads the file too.

    make_qwen3moe.py --tokenizer SmolLM2.gguf --out moe.Q4_K_M.gguf [--layers 15 --experts 32
        --used 4 --hidden 2048 --expert-ffn 1024 --heads 16 --kv-heads 4 --head-dim 128]

Needs gguf-py and numpy in this python and, for the quantisation, `--llama-py` (a python that
imports llama_cpp): target/llama-venv (scripts/llama-venv.sh) has all three.
"""
import argparse
import sys

import gguf
import numpy as np
from synthetic import copy_tokenizer, quantize_and_remove, write_tensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--llama-py", required=True)
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--used", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--expert-ffn", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    tok = gguf.GGUFReader(a.tokenizer)
    vocab = len(tok.fields["tokenizer.ggml.tokens"].contents())
    f16_path = a.out + ".f16.gguf"
    w = gguf.GGUFWriter(f16_path, "qwen3moe")
    w.add_context_length(4096)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(4 * a.hidden)
    w.add_expert_feed_forward_length(a.expert_ffn)
    w.add_expert_count(a.experts)
    w.add_expert_used_count(a.used)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(a.head_dim)
    w.add_value_length(a.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    copy_tokenizer(w, tok)
    h, f, e, hd = a.hidden, a.expert_ffn, a.experts, a.head_dim
    # (name, shape outermost first, fan-in or None for a norm)
    specs = [("token_embd.weight", (vocab, h), None), ("output_norm.weight", (h,), 0), ("output.weight", (vocab, h), h)]
    for l in range(a.layers):
        p = f"blk.{l}."
        specs += [
            (p + "attn_norm.weight", (h,), 0),
            (p + "ffn_norm.weight", (h,), 0),
            (p + "attn_q.weight", (a.heads * hd, h), h),
            (p + "attn_k.weight", (a.kv_heads * hd, h), h),
            (p + "attn_v.weight", (a.kv_heads * hd, h), h),
            (p + "attn_output.weight", (h, a.heads * hd), a.heads * hd),
            (p + "attn_q_norm.weight", (hd,), 0),
            (p + "attn_k_norm.weight", (hd,), 0),
            (p + "ffn_gate_inp.weight", (e, h), h),
            (p + "ffn_gate_exps.weight", (e, f, h), h),
            (p + "ffn_up_exps.weight", (e, f, h), h),
            (p + "ffn_down_exps.weight", (e, h, f), f),
        ]
    # Norms and the router stay f32 (as llama.cpp's converter writes them); the rest F16.
    dtype = lambda name, fan: np.float32 if fan == 0 or "gate_inp" in name else np.float16
    write_tensors(w, specs, dtype, lambda name: None, a.seed)
    rc = quantize_and_remove(a.llama_py, f16_path, a.out, a.threads)
    sys.exit(rc)


if __name__ == "__main__":
    main()
