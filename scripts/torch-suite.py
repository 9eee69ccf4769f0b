#!/usr/bin/env python3
"""PyTorch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py,
shipped in the torch wheel) against a backend, as torch's test/distributed/test_distributed_spawn.py
runs it (that driver is not in the wheel): every test spawns WORLD_SIZE processes that join a
process group of BACKEND through a file:// store.

    python scripts/torch-suite.py --backend boltccl            # the whole suite, world size 2
    python scripts/torch-suite.py --backend gloo -k all_reduce  # tests whose name has "all_reduce"
    python scripts/torch-suite.py --backend boltccl --tests python/tests_frameworks/torch_suite_pass.txt
    python scripts/torch-suite.py --list

Prints one line per test (PASS, FAIL or SKIP, seconds, and for a failure its cause in one line)
and the counts; --json writes them. Exits 1 if any test failed. The backend "boltccl" is
registered by importing boltccl.torch in every spawned process (this module is re-imported there).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default=os.environ.get("BACKEND", "boltccl"))
    ap.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    ap.add_argument("-k", action="append", default=[], help="run the tests whose name contains this (repeatable)")
    ap.add_argument("--tests", help="a file of test names, one a line (# comments), to run")
    ap.add_argument("--exclude", help="a file of test names not to run")
    ap.add_argument("--timeout", type=int, default=120, help="seconds one test may take (torch's default is 300)")
    ap.add_argument("--start", choices=("spawn", "fork"), default="fork", help="how each test starts its processes (fork: seconds faster each)")
    ap.add_argument(
        "--claim",
        default="",
        help="comma-separated features of DistTestCases.backend_feature (ddp, subgroup, ...) to claim for the backend: "
        "distributed_test.py skips their tests for a backend it does not list",
    )
    ap.add_argument(
        "--as-backend",
        default="",
        help="let distributed_test.py take the backend for this one (e.g. gloo) when it picks tests and "
        "paths, while every process group it makes for that name is the backend under test: runs the "
        "tests it keeps for named backends (their failures need reading: a test may expect that backend's messages)",
    )
    ap.add_argument("--json", help="write the outcome of every test here")
    ap.add_argument("--list", action="store_true", help="print the test names and exit")
    ap.add_argument("-q", action="store_true", help="print only failures and the counts")
    ARGS = ap.parse_args()
    # Read by distributed_test.py at import, here and in every spawned process (which inherit
    # this environment).
    os.environ["BACKEND"] = ARGS.as_backend or ARGS.backend
    os.environ["TORCH_SUITE_BACKEND"] = ARGS.backend
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    if "TEMP_DIR" not in os.environ:
        # The suite's scratch files; removed when this process (not a forked rank) exits.
        os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="torch-suite-")
        atexit.register(lambda d=os.environ["TEMP_DIR"], me=os.getpid(): os.getpid() == me and shutil.rmtree(d, ignore_errors=True))
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(ARGS.timeout)
    os.environ["TORCH_SUITE_START"] = ARGS.start
    os.environ["TORCH_SUITE_CLAIM"] = ARGS.claim
    os.environ.setdefault("BOLTCCL_LOG", "error")

os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())
_BACKEND = os.environ.get("TORCH_SUITE_BACKEND", os.environ.get("BACKEND"))
if _BACKEND == "boltccl":
    import boltccl.torch  # noqa: F401  registers the backend "boltccl"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if _BACKEND != os.environ.get("BACKEND"):  # --as-backend
    _init, _as = dist.init_process_group, os.environ["BACKEND"]

    def _init_as(*args, **kwargs):
        if kwargs.get("backend") == _as:
            kwargs["backend"] = _BACKEND
        elif args and args[0] == _as:
            args = (_BACKEND, *args[1:])
        return _init(*args, **kwargs)

    dist.init_process_group = _init_as

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# Decided when distributed_test.py is imported (its skip decorators read these sets).
for _feature in filter(None, os.environ.get("TORCH_SUITE_CLAIM", "").split(",")):
    DistTestCases.backend_feature[_feature].add(os.environ["BACKEND"])

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As test_distributed_spawn.py defines it; with fork (TORCH_SUITE_START=fork) the processes
    start in a fraction of the time, as torch's former test_distributed_fork.py ran them."""

    def setUp(self):
        super().setUp()
        if os.environ.get("TORCH_SUITE_START") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def _names() -> list:
    return sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_"))


def _read(path: str) -> list:
    with open(path) as f:
        return [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]


def _cause(text: str) -> str:
    """One line that says why a test failed: the last line of the first child's exception."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ("Error" in ln or "Exception" in ln or "assert" in ln.lower()) and not ln.startswith("File "):
            return ln[:300]
    return lines[-1][:300] if lines else "?"


def main() -> int:
    import json
    import time
    import unittest

    names = _names()
    if ARGS.list:
        print("\n".join(names))
        return 0
    if ARGS.tests:
        wanted = _read(ARGS.tests)
        unknown = [n for n in wanted if n not in names]
        if unknown:
            print(f"not tests of distributed_test.py in this torch ({torch.__version__}): {unknown}", file=sys.stderr)
            return 2
        names = wanted
    if ARGS.k:
        names = [n for n in names if any(k in n for k in ARGS.k)]
    if ARGS.exclude:
        drop = set(_read(ARGS.exclude))
        names = [n for n in names if n not in drop]

    class Result(unittest.TestResult):
        def __init__(self):
            super().__init__()
            self.outcome = None

        def addSuccess(self, test):  # noqa: N802
            self.outcome = ("PASS", "")

        def addError(self, test, err):  # noqa: N802
            self.outcome = ("FAIL", self._exc_info_to_string(err, test))

        addFailure = addError

        def addSkip(self, test, reason):  # noqa: N802
            self.outcome = ("SKIP", reason)

        def addExpectedFailure(self, test, err):  # noqa: N802
            self.outcome = ("PASS", "expected failure")

        def addUnexpectedSuccess(self, test):  # noqa: N802
            self.outcome = ("FAIL", "unexpected success")

    TestDistBackendWithSpawn.setUpClass()
    rows, t_all = [], time.time()
    as_ = f" (as {ARGS.as_backend})" if ARGS.as_backend else ""
    print(f"torch {torch.__version__}, backend {ARGS.backend}{as_}, world size {ARGS.world_size}, {len(names)} tests", flush=True)
    for name in names:
        t = time.time()
        r = Result()
        TestDistBackendWithSpawn(name).run(r)
        status, detail = r.outcome or ("FAIL", "no outcome")
        secs = time.time() - t
        why = _cause(detail) if status == "FAIL" else detail.splitlines()[0][:200] if detail else ""
        rows.append({"test": name, "status": status, "seconds": round(secs, 2), "why": why, "detail": detail if status == "FAIL" else ""})
        if status == "FAIL" or not ARGS.q:
            print(f"{status} {name} {secs:.1f}s {why}", flush=True)
    TestDistBackendWithSpawn.tearDownClass()
    counts = {s: sum(r["status"] == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}
    wall = time.time() - t_all
    print(
        f"backend {ARGS.backend}{as_}: {len(rows)} run, {counts['PASS']} passed, {counts['FAIL']} failed, "
        f"{counts['SKIP']} skipped in {wall:.0f} s",
        flush=True,
    )
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"backend": ARGS.backend, "torch": torch.__version__, "world_size": ARGS.world_size, "seconds": round(wall), "counts": counts, "tests": rows}, f, indent=1)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
