"""4 ranks: Python, C and Rust all_sum give bitwise-identical float32 and bfloat16 results.

The C example and the Rust reference come from scripts/test-bindings.sh
(BOLTCCL_C_EXAMPLE, BOLTCCL_RUST_DIGEST); without them only Python runs, against the
digests recorded below (which the C and Rust programs also printed when this was written).
"""

import os
import subprocess

import pytest

from boltccl import launch
from conftest import run_ranks


def digests(outs):
    return sorted(line for o in outs for line in o.splitlines() if line.startswith("digest "))


def native(path, *args):
    status, outs = launch.run(4, [path, *args], timeout=120, capture=True)
    assert status == 0, "\n".join(outs)
    return digests(outs)


@pytest.fixture(scope="module")
def python_digests():
    d = digests(run_ranks(4, "digest.py", timeout=180))
    assert len(d) == 4, d
    return d


@pytest.mark.parametrize("var,args", [("BOLTCCL_RUST_DIGEST", ()), ("BOLTCCL_C_EXAMPLE", ("--digest",))])
def test_bitwise_identical_to(python_digests, var, args):
    path = os.environ.get(var)
    if not path:
        pytest.skip(f"{var} not set (scripts/test-bindings.sh sets it)")
    assert native(path, *args) == python_digests
