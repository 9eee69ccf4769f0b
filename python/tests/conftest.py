"""Helpers: run worker scripts as N ranks (through boltccl's launcher, with a deadline)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, List

import pytest

import boltccl
from boltccl import launch

WORKERS = Path(__file__).parent / "workers"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (below the ephemeral range, so no connection
    made meanwhile is given it)."""
    return boltccl._native.free_coordinator_port("127.0.0.1")


def rank_env(rank: int, n: int, coordinator: str, job_key: str) -> Dict[str, str]:
    """The environment of one rank, for tests that start ranks by hand (to signal one)."""
    env = dict(os.environ)
    env.update(
        BOLTCCL_RANK=str(rank),
        BOLTCCL_WORLD_SIZE=str(n),
        BOLTCCL_COORDINATOR=coordinator,
        BOLTCCL_JOB_KEY=job_key,
        BOLTCCL_LOCAL_WORLD_SIZE=str(n),
    )
    return env


def run_ranks(n: int, worker: str, *args: str, timeout: float = 120.0, env: Dict[str, str] | None = None) -> List[str]:
    """Run ``workers/<worker>`` as n ranks; fail the test (with every rank's output) unless all exit 0."""
    e = {"BOLTCCL_TIMEOUT_MS": os.environ.get("BOLTCCL_TIMEOUT_MS", "30000")}
    e.update(env or {})
    status, outs = launch.run(n, [sys.executable, str(WORKERS / worker), *args], timeout=timeout, env=e, capture=True)
    if status != 0:
        text = "\n".join(f"--- rank {r} ---\n{o}" for r, o in enumerate(outs))
        pytest.fail(f"{worker} on {n} ranks exited {status}:\n{text}")
    return outs


def results(outs: List[str]) -> List[dict]:
    """The ``RESULT {json}`` line of each rank."""
    found = []
    for o in outs:
        lines = [line for line in o.splitlines() if line.startswith("RESULT ")]
        assert lines, f"no RESULT line in:\n{o}"
        found.append(json.loads(lines[-1][len("RESULT ") :]))
    return found
