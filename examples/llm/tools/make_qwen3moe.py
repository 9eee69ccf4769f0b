#!/usr/bin/env python3
"""A synthetic Qwen3-MoE GGUF of realistic shape, for timing (not for text: the weights are
seeded random numbers). Writes it as F16 with gguf-py, tensor by tensor (memory holds one),
quantises it with llama.cpp's `llama_model_quantize` (llama-cpp-python) and deletes the F16.
The tokenizer keys are copied from a GGUF that has them (SmolLM2's: vocabulary 49152), so
llama.cpp loads the file too.

    make_qwen3moe.py --tokenizer SmolLM2.gguf --out moe.Q4_K_M.gguf [--layers 15 --experts 32
        --used 4 --hidden 2048 --expert-ffn 1024 --heads 16 --kv-heads 4 --head-dim 128]

Needs gguf-py and numpy in this python (e.g. target/frameworks-venv) and, for the
quantisation, `--llama-py` (a python that imports llama_cpp, e.g. target/llama-venv).
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import gguf

QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
p.nthread = int(sys.argv[3])
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p)
sys.exit(rc)
"""


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
    for k, f in tok.fields.items():
        if not k.startswith("tokenizer.") or k == "tokenizer.chat_template":
            continue
        t = gguf.GGUFValueType(f.types[0])
        v = f.contents()
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(k, v)
        elif t == gguf.GGUFValueType.BOOL:
            w.add_bool(k, v)
        else:
            w.add_uint32(k, v)
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
    for name, shape, fan in specs:
        dt = dtype(name, fan)
        w.add_tensor_info(name, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(a.seed)
    for name, shape, fan in specs:
        if fan == 0:
            x = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        else:
            std = 0.25 if fan is None else 1.0 / np.sqrt(fan)
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        w.write_tensor_data(x.astype(dtype(name, fan)))
        print(name, shape, flush=True)
    w.close()
    rc = subprocess.call([a.llama_py, "-c", QUANTIZE, f16_path, a.out, str(a.threads)])
    os.remove(f16_path)
    sys.exit(rc)


if __name__ == "__main__":
    main()
