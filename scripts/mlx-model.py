#!/usr/bin/env python3
"""Make an MLX-format model (what mlx-lm loads) from a GGUF file, offline.

    python scripts/mlx-model.py GGUF OUTDIR [--dtype float32|float16|bfloat16]

transformers dequantises the GGUF (it needs `gguf` and `accelerate`) into a float32 model, which
is saved as a Hugging Face checkpoint and converted by `mlx_lm.convert`. transformers refuses to
save a model it still marks as GGUF-quantised, so the marker is cleared first: the weights are
plain floats by then. Used by the framework suite for SmolLM2-135M-Instruct (from
examples/llm/fetch-model.sh), cached under target/models/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    a = ap.parse_args()
    if (a.out / "config.json").exists():
        print(a.out)
        return

    import torch
    from mlx_lm import convert
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(a.gguf.parent), a.gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with tempfile.TemporaryDirectory() as hf:
        model.save_pretrained(hf)
        tok.save_pretrained(hf)
        tmp = a.out.with_name(a.out.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        convert(hf_path=hf, mlx_path=str(tmp), dtype=a.dtype)
        tmp.rename(a.out)
    print(a.out)


if __name__ == "__main__":
    main()
