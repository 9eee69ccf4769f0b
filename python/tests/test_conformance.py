"""Multi-rank conformance: every collective and element type against numpy, 2 and 4 ranks."""

import pytest

import boltccl
from conftest import results, run_ranks

COLLS = [
    "all_to_all",
    "gather/scatter/reduce",
    "all_sum/max/min",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "send/recv",
]
CASES = [f"{c} {d} {n}" for n in (1000, 70001) for d in boltccl.DTYPES for c in COLLS] + ["other buffers", "split"]
_cache = {}


def job(n):
    if n not in _cache:
        _cache[n] = results(run_ranks(n, "conformance.py", timeout=240))
    return _cache[n]


@pytest.mark.parametrize("nranks", [2, 4])
class TestConformance:
    @pytest.mark.parametrize("case", CASES)
    def test_case(self, nranks, case):
        for rank, res in enumerate(job(nranks)):
            assert case in res, f"rank {rank} did not run {case!r}"
            assert res[case] == "ok", f"rank {rank}, {case}:\n{res[case]}"

    def test_every_rank_ran_every_case(self, nranks):
        for res in job(nranks):
            assert set(res) == set(CASES)
