"""4 ranks: Python, C and Rust all_sum give, on every rank, the bits of a reference computed
here with numpy (float32 and bfloat16), not only the same bits as each other. The sums follow
the order boltccl documents for what `auto` runs at each size on 4 ranks: recursive doubling,
(x0 + x1) + (x2 + x3), up to BOLTCCL_MESH_MAX_BYTES (32 KiB); above it the direct algorithm's
rank order ((x0 + x1) + x2) + x3.

The C example and the Rust program come from scripts/test-bindings.sh (BOLTCCL_C_EXAMPLE,
BOLTCCL_RUST_DIGEST); without them those two comparisons skip, except in CI (CI set), where
they must run.
"""

import os

import numpy as np
import pytest

from boltccl import launch
from conftest import run_ranks

RANKS = 4
SIZES = (1000, 262147)
MESH_MAX_BYTES = 32768


def in_ci() -> bool:
    return os.environ.get("CI", "") not in ("", "0", "false")


def inputs(rank: int, n: int):
    """The deterministic inputs of rank `rank` (the same formulas as the three programs)."""
    i = np.arange(n, dtype=np.uint32)
    h = i * np.uint32(2654435761) + np.uint32((rank + 1) * 40503)
    f = (((h >> np.uint32(8)).astype(np.int32) - 8388608).astype(np.float32) / np.float32(1024.0)).astype(np.float32)
    bits = ((((h >> np.uint32(16)) & np.uint32(0x07FF)) + np.uint32(0x3C00)) | ((h & np.uint32(1)) << np.uint32(15))).astype(
        np.uint16
    )
    return f, bits


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even (the inputs and sums here are finite)."""
    u = x.view(np.uint32)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    return ((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)


def fnv1a(b: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in b:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def reference():
    """The digest lines every rank must print, computed without boltccl."""
    lines = []
    for n in SIZES:
        per_rank = [inputs(r, n) for r in range(RANKS)]
        f32 = [p[0] for p in per_rank]
        bf16 = [p[1] for p in per_rank]
        add_f = lambda x, y: (x + y).astype(np.float32)  # float32 add, rounded each step
        add_b = lambda x, y: f32_to_bf16(bf16_to_f32(x) + bf16_to_f32(y))
        if 4 * n <= MESH_MAX_BYTES:
            f = add_f(add_f(f32[0], f32[1]), add_f(f32[2], f32[3]))
            b = add_b(add_b(bf16[0], bf16[1]), add_b(bf16[2], bf16[3]))
        else:
            f, b = f32[0].copy(), bf16[0].copy()
            for r in range(1, RANKS):
                f, b = add_f(f, f32[r]), add_b(b, bf16[r])
        for r in range(RANKS):
            lines.append(f"digest rank {r} float32 {n} {fnv1a(f.tobytes()):016x}")
            lines.append(f"digest rank {r} bfloat16 {n} {fnv1a(b.tobytes()):016x}")
    return sorted(lines)


def digests(outs):
    return sorted(line for o in outs for line in o.splitlines() if line.startswith("digest "))


def native(path, *args):
    status, outs = launch.run(RANKS, [path, *args], timeout=120, capture=True)
    assert status == 0, "\n".join(outs)
    return digests(outs)


@pytest.fixture(scope="module")
def expected():
    return reference()


@pytest.mark.parametrize("n", SIZES)
def test_the_reference_is_not_order_blind(n):
    """The rank-order sum and the doubling's tree differ from each other and from a backward
    fold for these inputs: a fold in another order (or of the wrong values) would not match
    the reference by chance."""
    xs = [inputs(r, n)[0] for r in range(RANKS)]
    forward = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    tree = (xs[0] + xs[1]) + (xs[2] + xs[3])
    backward = ((xs[3] + xs[2]) + xs[1]) + xs[0]
    for a, b in [(forward, backward), (forward, tree), (tree, backward)]:
        assert np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)) > 0


def test_python_matches_the_reference_on_every_rank(expected):
    got = digests(run_ranks(RANKS, "digest.py", timeout=180))
    assert got == expected


@pytest.mark.parametrize("var,args", [("BOLTCCL_RUST_DIGEST", ()), ("BOLTCCL_C_EXAMPLE", ("--digest",))])
def test_native_matches_the_reference_on_every_rank(expected, var, args):
    path = os.environ.get(var)
    if not path:
        assert not in_ci(), f"{var} not set, and CI is set: scripts/test-bindings.sh sets it"
        pytest.skip(f"{var} not set (scripts/test-bindings.sh sets it)")
    assert native(path, *args) == expected
