#!/usr/bin/env python3
"""Reference decodings of GGML blocks by gguf-py (llama.cpp's own Python package), for
tests/quant.rs: writes tests/data/gguf_py_dequant.bin.

Each type gets seeded random blocks (every quant, high-bit and sub-scale byte random; the f16
scale fields random finite values, including zero, negative, subnormal and large ones) and the
values `gguf.quants.dequantize` decodes them to. The test decodes the same bytes with the crate
and compares. Regenerate with:

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install numpy gguf==0.19.0
    /tmp/ref/bin/python examples/llm/tools/dequant_reference.py [OUT]

File format (little-endian), one record per type: u32 GGML type id, u32 element count, u32
byte count, the block bytes, then the element count of f32 values.
"""
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# type -> (elements per block, bytes per block, byte offsets of its f16 fields)
TYPES = {
    T.Q4_0: (32, 18, [0]),
    T.Q4_1: (32, 20, [0, 2]),
    T.Q5_0: (32, 22, [0]),
    T.Q5_1: (32, 24, [0, 2]),
    T.Q8_0: (32, 34, [0]),
    T.Q4_K: (256, 144, [0, 2]),
    T.Q5_K: (256, 176, [0, 2]),
    T.Q6_K: (256, 210, [208]),
}


def f16_field(rng: np.random.Generator) -> np.float16:
    kind = rng.integers(0, 8)
    if kind == 0:
        return np.float16(0.0)
    if kind == 1:
        return np.float16(rng.uniform(-1, 1) * 3e-6)  # subnormal
    if kind == 2:
        return np.float16(rng.uniform(-1, 1) * 500.0)
    return np.float16(rng.uniform(-0.6, 1.0) * 0.02)


def main() -> None:
    here = Path(__file__).resolve().parent
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else here.parent / "tests" / "data" / "gguf_py_dequant.bin"
    rng = np.random.default_rng(20261202)
    buf = bytearray()
    for ty, (elems, size, f16s) in TYPES.items():
        nblocks = 36 if elems == 32 else 8
        blocks = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
        for b in blocks:
            for off in f16s:
                b[off : off + 2] = np.frombuffer(f16_field(rng).tobytes(), dtype=np.uint8)
        raw = blocks.reshape(-1)
        values = dequantize(raw.reshape(1, -1), ty).astype(np.float32).reshape(-1)
        assert values.size == nblocks * elems
        buf += struct.pack("<III", ty.value, values.size, raw.size)
        buf += raw.tobytes()
        buf += values.astype("<f4").tobytes()
        print(f"{ty.name}: {nblocks} blocks, {values.size} values, |x| <= {np.abs(values).max():.3g}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(bytes(buf))
    print(f"wrote {out} ({len(buf)} bytes)")


if __name__ == "__main__":
    main()
