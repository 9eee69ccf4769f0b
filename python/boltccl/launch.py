"""Run the ranks of a job: ``python -m boltccl.launch -n 4 script.py [args...]``.

The same launcher as the ``boltccl launch`` command (compiled into this package): every rank
gets ``BOLTCCL_RANK``, ``BOLTCCL_WORLD_SIZE``, ``BOLTCCL_COORDINATOR`` (a free loopback port,
or the first host's address), ``BOLTCCL_JOB_KEY`` (random) and ``BOLTCCL_LOCAL_WORLD_SIZE``;
output lines are prefixed with the rank; local ranks are pinned to cores when they take every
core; ``--hostfile`` starts one rank per host over ssh. A command ending in ``.py`` runs under
this Python; anything else is run as given (``-- ./prog``).

MLX programs run over boltccl unchanged: unless ``MLX_MPI_LIBNAME`` is set, every rank gets it
pointing at the ``libboltccl_mpi`` this package ships, so ``mx.distributed.init()`` (MLX's
``mpi`` backend) runs over boltccl.

If a rank fails, the others are stopped and the job exits with the first failing rank's
status; ``--timeout`` stops a job that runs too long (exit status 124).
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from ._native import launch as _launch
from ._paths import mpi_library as _mpi_library

__all__ = ["run", "main"]


def _command(cmd: Sequence[str]) -> List[str]:
    cmd = list(cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise SystemExit("boltccl.launch: no command given (usage: python -m boltccl.launch -n N script.py [args])")
    if cmd[0].endswith(".py"):
        cmd = [sys.executable] + cmd
    return cmd


def run(
    n: int,
    cmd: Sequence[str],
    timeout: Optional[float] = None,
    env: Optional[Dict[str, str]] = None,
    capture: bool = False,
) -> Tuple[int, List[str]]:
    """Run ``cmd`` as ranks 0..n-1 on this machine and wait. Returns (exit status, outputs).

    ``env`` adds variables to every rank's environment. ``outputs`` holds each rank's
    stdout and stderr, interleaved by line, when ``capture`` is true (else it is empty and
    the output is printed with a ``[rank]`` prefix).
    """
    if n < 1:
        raise ValueError(f"-n must be at least 1, got {n}")
    extra = sorted((env or {}).items())
    return _launch(_command(cmd), n=n, env=extra, timeout=timeout, capture=capture, mpi_library=_mpi_str())


def _mpi_str() -> Optional[str]:
    lib = _mpi_library()
    return None if lib is None else str(lib)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m boltccl.launch",
        description="Run the ranks of a Python script or program (the launcher of `boltccl launch`).",
        epilog="MLX programs: unless MLX_MPI_LIBNAME is set, every rank gets it pointing at the "
        "libboltccl_mpi this package ships, so mx.distributed.init() runs over boltccl.",
    )
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("-n", "--nranks", type=int, help="number of local ranks")
    where.add_argument("--hostfile", help="JSON hostfile: one rank per host, started over ssh")
    ap.add_argument("--port", type=int, default=None, help="coordinator port")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment")
    ap.add_argument("--no-bind", action="store_true", help="do not pin local ranks to cores")
    ap.add_argument("--timeout", type=float, default=None, help="stop the job after this many seconds")
    ap.add_argument(
        "--keep-going",
        action="store_true",
        help="when a rank fails, let the others run on (their survivors shrink() and go on)",
    )
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="script.py [args] or -- program [args]")
    a = ap.parse_args(argv)
    env = []
    for kv in a.env:
        if "=" not in kv:
            ap.error(f"--env {kv}: expected KEY=VALUE")
        env.append(tuple(kv.split("=", 1)))
    status, _ = _launch(
        _command(a.cmd),
        n=a.nranks,
        hostfile=a.hostfile,
        port=a.port,
        env=env,
        pin=not a.no_bind,
        timeout=a.timeout,
        mpi_library=_mpi_str(),
        keep_going=a.keep_going,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
