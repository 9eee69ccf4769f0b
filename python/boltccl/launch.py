"""Run N local ranks of a program: ``python -m boltccl.launch -n 4 script.py [args...]``.

Every rank gets ``BOLTCCL_RANK``, ``BOLTCCL_WORLD_SIZE``, ``BOLTCCL_COORDINATOR`` (a free
loopback port), ``BOLTCCL_JOB_KEY`` (random) and ``BOLTCCL_LOCAL_WORLD_SIZE``. A command
ending in ``.py`` runs under this Python; anything else is run as given (``-- ./prog``).

If a rank fails, the others get a grace period and are then killed; with ``--timeout`` the
whole job is killed when it runs too long. The exit status is the first failing rank's.

This module imports nothing from the compiled extension, so it also works as a plain
script (``python3 python/boltccl/launch.py -n 2 -- ./a.out``), for C programs.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional, Sequence

__all__ = ["free_port", "rank_env", "run", "main"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, n: int, coordinator: str, job_key: str, base: Optional[dict] = None) -> dict:
    """The environment for one rank."""
    env = dict(os.environ if base is None else base)
    env.update(
        BOLTCCL_RANK=str(rank),
        BOLTCCL_WORLD_SIZE=str(n),
        BOLTCCL_COORDINATOR=coordinator,
        BOLTCCL_JOB_KEY=job_key,
        BOLTCCL_LOCAL_WORLD_SIZE=str(n),
    )
    return env


def _command(cmd: Sequence[str]) -> List[str]:
    cmd = list(cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise SystemExit("boltccl.launch: no command given (usage: python -m boltccl.launch -n N script.py [args])")
    if cmd[0].endswith(".py"):
        cmd = [sys.executable] + cmd
    return cmd


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            p.kill()


def run(
    n: int,
    cmd: Sequence[str],
    timeout: Optional[float] = None,
    env: Optional[dict] = None,
    grace: float = 10.0,
    capture: bool = False,
) -> "tuple[int, list[str]]":
    """Run ``cmd`` as ranks 0..n-1 and wait. Returns (exit status, outputs).

    ``outputs`` holds each rank's combined stdout and stderr when ``capture`` is true (else
    empty strings). The status is 0 when every rank exited 0, 124 on timeout, else the
    first failing rank's status (or 128 + signal number).
    """
    if n < 1:
        raise ValueError(f"-n must be at least 1, got {n}")
    argv = _command(cmd)
    coordinator = f"127.0.0.1:{free_port()}"
    key = secrets.token_hex(16)
    procs: List[subprocess.Popen] = []
    outs: List[Optional[int]] = []
    import tempfile

    files = []
    for r in range(n):
        f = tempfile.TemporaryFile(mode="w+b") if capture else None
        files.append(f)
        procs.append(
            subprocess.Popen(
                argv,
                env=rank_env(r, n, coordinator, key, env),
                stdout=f if capture else None,
                stderr=subprocess.STDOUT if capture else None,
                start_new_session=True,
            )
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    first_fail: Optional[int] = None
    fail_at: Optional[float] = None
    status = 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            if first_fail is None:
                for c in codes:
                    if c is not None and c != 0:
                        first_fail = c if c > 0 else 128 - c
                        fail_at = time.monotonic()
                        break
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if deadline is not None and now > deadline:
                status = 124
                print(f"boltccl.launch: timed out after {timeout:.0f} s; killing the ranks", file=sys.stderr)
                break
            if fail_at is not None and now - fail_at > grace:
                print("boltccl.launch: a rank failed; killing the others", file=sys.stderr)
                break
            time.sleep(0.02)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
        time.sleep(1.0)
        status = 130
    finally:
        for p in procs:
            _kill(p)
        for p in procs:
            p.wait()
    if status == 0 and first_fail is not None:
        status = first_fail
    outputs = []
    for f in files:
        if f is None:
            outputs.append("")
        else:
            f.seek(0)
            outputs.append(f.read().decode("utf-8", "replace"))
            f.close()
    return status, outputs


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m boltccl.launch",
        description="Run N local ranks of a Python script or program.",
    )
    ap.add_argument("-n", "--nranks", type=int, required=True, help="number of ranks")
    ap.add_argument("--timeout", type=float, default=None, help="kill the job after this many seconds")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="script.py [args] or -- program [args]")
    a = ap.parse_args(argv)
    status, _ = run(a.nranks, a.cmd, timeout=a.timeout)
    return status


if __name__ == "__main__":
    sys.exit(main())
