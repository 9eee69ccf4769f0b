"""What the synthetic-checkpoint writers (make_llama.py, make_qwen3moe.py) share: the
tokenizer keys copied from a GGUF that has them, the seeded tensors written one at a time, and
llama.cpp's own quantiser run on the F16 file."""

import os
import subprocess

import gguf
import numpy as np

QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
p.nthread = int(sys.argv[3])
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""


def copy_tokenizer(w, src, pad_to=None):
    """`src`'s tokenizer keys (a GGUFReader; not its chat template) into writer `w`; with
    `pad_to`, the vocabulary padded with reserved control tokens to that many entries."""
    for k, f in src.fields.items():
        if not k.startswith("tokenizer.") or k == "tokenizer.chat_template":
            continue
        t, v = gguf.GGUFValueType(f.types[0]), f.contents()
        if pad_to and k == "tokenizer.ggml.tokens":
            v = v + [f"<|reserved_special_token_{i}|>" for i in range(pad_to - len(v))]
        elif pad_to and k == "tokenizer.ggml.token_type":
            v = v + [3] * (pad_to - len(v))  # 3: control
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(k, v)
        elif t == gguf.GGUFValueType.BOOL:
            w.add_bool(k, v)
        else:
            w.add_uint32(k, v)


def write_tensors(w, specs, dtype, fill, seed):
    """Declares then writes `specs` — (name, shape outermost first, fan-in) — in `dtype(name,
    fan)`: fan 0 is a norm (values near 1), None the embedding (std 0.25), a number a matrix
    (std 1/sqrt(fan)); `fill(name)` may give a tensor's values instead. One tensor in memory
    at a time."""
    for name, shape, fan in specs:
        dt = np.dtype(dtype(name, fan))
        w.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, fan in specs:
        x = fill(name)
        if x is None and fan == 0:
            x = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        elif x is None:
            std = 0.25 if fan is None else 1.0 / np.sqrt(fan)
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        w.write_tensor_data(x.astype(dtype(name, fan)))
        print(name, shape, flush=True)
    w.close()


def quantize_and_remove(llama_py, f16_path, out, threads):
    """Q4_K_M by llama.cpp's `llama_model_quantize` (llama-cpp-python in `llama_py`); the F16
    input is deleted either way. Returns the quantiser's exit code."""
    try:
        return subprocess.call([llama_py, "-c", QUANTIZE, f16_path, out, str(threads)])
    finally:
        os.remove(f16_path)
