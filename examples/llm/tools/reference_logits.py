#!/usr/bin/env python3
"""Independent cross-check of boltccl-llm on a GGUF model (development tool, not a test).

Reads the GGUF with the `gguf` Python package (llama.cpp's reader and dequantisers, a
different code base from ours), runs a plain NumPy Llama forward pass over the prompt ids
(no KV cache, float64), and compares the last position's logits with the f32 logits that
`boltccl-llm --dump-logits FILE` wrote for the same ids.

    python3 -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install numpy gguf
    ./target/release/boltccl-llm --model M.gguf --prompt-ids 1,9690,198 --max-tokens 1 \
        --dump-logits /tmp/logits.f32
    /tmp/refvenv/bin/python tools/reference_logits.py M.gguf 1,9690,198 /tmp/logits.f32
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]].tolist()[0]


def main():
    path, ids, dump = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]
    r = GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    assert arch == "llama", arch
    n_layer = field(r, "llama.block_count")
    n_head = field(r, "llama.attention.head_count")
    n_kv = field(r, "llama.attention.head_count_kv")
    eps = field(r, "llama.attention.layer_norm_rms_epsilon")
    theta = field(r, "llama.rope.freq_base")
    t = {x.name: x for x in r.tensors}

    def w(name):
        x = t[name]
        return dequantize(x.data, x.tensor_type).astype(np.float64).reshape(
            [int(d) for d in reversed(x.shape)])

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    emb = w("token_embd.weight")
    x = emb[ids]
    T, H = x.shape
    hd = H // n_head
    pos = np.arange(T)[:, None]
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = pos * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):  # v: [T, heads, hd], llama GGUF: adjacent pairs (2i, 2i+1)
        a, b = v[..., 0::2], v[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(v)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(n_layer):
        p = f"blk.{i}."
        xn = norm(x, w(p + "attn_norm.weight"))
        q = rope((xn @ w(p + "attn_q.weight").T).reshape(T, n_head, hd))
        k = rope((xn @ w(p + "attn_k.weight").T).reshape(T, n_kv, hd))
        v = (xn @ w(p + "attn_v.weight").T).reshape(T, n_kv, hd)
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, H)
        x = x + a @ w(p + "attn_output.weight").T
        xn = norm(x, w(p + "ffn_norm.weight"))
        g = xn @ w(p + "ffn_gate.weight").T
        u = xn @ w(p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ w(p + "ffn_down.weight").T
    head = w("output.weight") if "output.weight" in t else emb
    ref = norm(x[-1], w("output_norm.weight")) @ head.T
    ours = np.fromfile(dump, dtype="<f4").astype(np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    d = np.abs(ours - ref).max()
    print(f"max |ours - reference| = {d:.3e} (logit range {ref.min():.2f}..{ref.max():.2f})")
    print("top-5 reference:", np.argsort(-ref)[:5].tolist(), " ours:", np.argsort(-ours)[:5].tolist())
    sys.exit(0 if d < 1e-2 and np.argmax(ours) == np.argmax(ref) else 1)


if __name__ == "__main__":
    main()
