"""Python digests of float32/bfloat16 all_sum, for the bitwise comparison with the Rust
(boltccl/examples/digest.rs) and C (examples/allsum.c --digest) programs: same inputs, same output."""

import numpy as np

import boltccl

g = boltccl.init()
rank = g.rank


def fnv1a(b: bytes) -> int:
    # Vectorised enough: 1 MiB at most.
    h = 0xCBF29CE484222325
    for byte in b:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


for n in (1000, 262147):
    i = np.arange(n, dtype=np.uint32)
    h = i * np.uint32(2654435761) + np.uint32((rank + 1) * 40503)
    f = (((h >> np.uint32(8)).astype(np.int32) - 8388608).astype(np.float32) / np.float32(1024.0)).astype(np.float32)
    bits = ((((h >> np.uint32(16)) & np.uint32(0x07FF)) + np.uint32(0x3C00)) | ((h & np.uint32(1)) << np.uint32(15))).astype(
        np.uint16
    )
    g.all_sum(f)
    g.all_sum(bits, dtype="bfloat16")
    if rank == 0:
        print(f"digest float32 {n} {fnv1a(f.tobytes()):016x}", flush=True)
        print(f"digest bfloat16 {n} {fnv1a(bits.tobytes()):016x}", flush=True)
g.barrier()
