"""Helpers for the framework suite: run a command as a real launcher would, with a deadline,
an environment free of BOLTCCL_* variables, and every rank's RESULT line collected."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

WORKERS = Path(__file__).parent / "workers"
PY = sys.executable


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This environment without boltccl's or any launcher's variables (so only the launcher
    under test speaks), plus `extra`."""
    drop = ("BOLTCCL_", "MLX_", "OMPI_", "PMIX_", "PMI_", "SLURM_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["BOLTCCL_LOG"] = os.environ.get("BOLTCCL_LOG", "warn")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run(cmd: Sequence[str], timeout: float = 180, env: Optional[Dict[str, str]] = None, cwd=None) -> str:
    """Run `cmd`; fail the test with its output unless it exits 0 within `timeout`."""
    t = time.time()
    try:
        p = subprocess.run(
            list(cmd),
            env=env or clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s:\n{e.stdout}\n{e.stderr}")
    out = p.stdout + p.stderr
    if p.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {p.returncode} after {time.time() - t:.1f} s:\n{out}")
    return out


def results(out: str) -> List[dict]:
    """Every `RESULT {...}` record in the output (prefixes such as `[1] ` ignored, and lines
    that ranks interleaved split apart), by rank."""
    found = [json.loads(m.group(1)) for m in re.finditer(r"RESULT (\{[^{}]*\})", out)]
    return sorted(found, key=lambda r: r.get("rank", 0))
