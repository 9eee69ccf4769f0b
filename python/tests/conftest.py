"""Helpers: run worker scripts as N ranks (through boltccl's launcher, with a deadline)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from boltccl import launch

WORKERS = Path(__file__).parent / "workers"


_ports = itertools.count(os.getpid() * 7919)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's ephemeral range:
    no connection made meanwhile can be given it before the rank that is to listen binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = max(int(f.read().split()[0]), 10_001)
    except OSError:
        high = 32768
    for _ in range(1000):
        port = 10_000 + next(_ports) % (high - 10_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


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
