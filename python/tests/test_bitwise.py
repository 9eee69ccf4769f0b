"""4 ranks: Python, C and Rust all_sum give, on every rank, the bits of a reference computed
here with numpy (float32 and bfloat16, summed in rank order ((x0 + x1) + x2) + x3, as boltccl's
mesh and direct algorithms document), not only the same bits as each other.

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
        f = per_rank[0][0].copy()
        b = per_rank[0][1].copy()
        for r in range(1, RANKS):
            f = (f + per_rank[r][0]).astype(np.float32)  # float32 add, rounded each step
            b = f32_to_bf16(bf16_to_f32(b) + bf16_to_f32(per_rank[r][1]))
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


def test_the_reference_is_not_order_blind():
    """The rank-order sum differs from other orders for these inputs: a fold in another order
    (or of the wrong values) would not match the reference by chance."""
    n = SIZES[1]
    xs = [inputs(r, n)[0] for r in range(RANKS)]
    forward = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    backward = ((xs[3] + xs[2]) + xs[1]) + xs[0]
    assert np.count_nonzero(forward.view(np.uint32) != backward.view(np.uint32)) > 0


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
