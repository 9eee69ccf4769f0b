"""boltccl for MLX code.

**Unchanged MLX programs** (``mx.distributed``, mlx-lm's sharded models,
``nn.average_gradients``) run over boltccl through MLX's own ``mpi`` backend: MLX loads the MPI
library named by ``MLX_MPI_LIBNAME``, and :func:`mpi_library` is one that serves MLX's calls
with boltccl (the subset of Open MPI's ABI that MLX uses). ``python -m boltccl.launch`` and
``boltccl launch`` set the variable for every rank; under ``mpirun`` or ``mlx.launch --backend
mpi`` pass it on (``-x MLX_MPI_LIBNAME=...``).

**boltccl's own API on mx arrays** (this module's functions) is for code that wants what
``mx.distributed`` lacks (non-blocking calls through ``boltccl.Group``, ``reduce_scatter`` on
every backend, ``broadcast``):

>>> import mlx.core as mx, boltccl.mlx as bmx
>>> y = bmx.all_sum(x)                 # a new mx.array; x is unchanged (like mx.distributed)

Each call evaluates its input, and the result is a fresh MLX array that boltccl writes straight
into (no staging copy). The group is ``boltccl.init()``'s, made on first use, unless ``group=``
is given. A process should use one of the two ways per job: both form their group from the
same environment (the same coordinator).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import mlx.core as mx

import boltccl

from . import _paths

__all__ = ["mpi_library", "group", "all_sum", "all_max", "all_min", "all_gather", "reduce_scatter", "broadcast", "send", "recv"]

_group: Optional[boltccl.Group] = None


def mpi_library() -> str:
    """The absolute path of libboltccl_mpi, for ``MLX_MPI_LIBNAME``: with it, MLX's ``mpi``
    backend (``mx.distributed.init()``) runs over boltccl."""
    lib = _paths.mpi_library()
    if lib is None:
        raise FileNotFoundError(
            f"{_paths.MPI_LIBRARY} is not in this boltccl package ({Path(boltccl.__file__).parent}): "
            "build the wheel with scripts/build-wheel.sh, which ships it"
        )
    return str(lib)


def group() -> boltccl.Group:
    """The default group (``boltccl.init()`` from the environment, made once)."""
    global _group
    if _group is None:
        _group = boltccl.init()
    return _group


def _fresh(shape: Any, dtype: Any) -> mx.array:
    out = mx.zeros(shape, dtype=dtype)
    mx.eval(out)
    return out


def _reduce(name: str, x: mx.array, g: Optional[boltccl.Group]) -> mx.array:
    out = _fresh(x.shape, x.dtype)
    getattr(g or group(), name)(x, out=out)
    return out


def all_sum(x: mx.array, *, group: Optional[boltccl.Group] = None) -> mx.array:  # noqa: A002
    """Elementwise sum of ``x`` over the ranks, as a new array."""
    return _reduce("all_sum", x, group)


def all_max(x: mx.array, *, group: Optional[boltccl.Group] = None) -> mx.array:  # noqa: A002
    """Elementwise maximum of ``x`` over the ranks, as a new array."""
    return _reduce("all_max", x, group)


def all_min(x: mx.array, *, group: Optional[boltccl.Group] = None) -> mx.array:  # noqa: A002
    """Elementwise minimum of ``x`` over the ranks, as a new array."""
    return _reduce("all_min", x, group)


def all_gather(x: mx.array, *, group: Optional[boltccl.Group] = None) -> mx.array:  # noqa: A002
    """Every rank's ``x`` concatenated along the first axis, in rank order."""
    g = group or globals()["group"]()
    shape = list(x.shape) or [1]
    shape[0] *= g.size
    out = _fresh(shape, x.dtype)
    g.all_gather(x, out=out)
    return out


def reduce_scatter(x: mx.array, *, op: str = "sum", group: Optional[boltccl.Group] = None) -> mx.array:  # noqa: A002
    """This rank's block (of ``size`` along the first axis) of ``x`` reduced over the ranks."""
    g = group or globals()["group"]()
    shape = list(x.shape) or [1]
    if shape[0] % g.size:
        raise ValueError(f"x has {shape[0]} rows, not divisible by the group size {g.size}")
    shape[0] //= g.size
    out = _fresh(shape, x.dtype)
    g.reduce_scatter(x, out=out, op=op)
    return out


def broadcast(x: mx.array, root: int = 0, *, group: Optional[boltccl.Group] = None) -> mx.array:  # noqa: A002
    """``root``'s ``x`` on every rank, as a new array."""
    g = group or globals()["group"]()
    out = _fresh(x.shape, x.dtype)
    if g.rank == root:
        out = x + 0  # a copy of x (mx arrays are values): broadcast sends it
        mx.eval(out)
    g.broadcast(out, root=root)
    return out


def send(x: mx.array, dst: int, *, group: Optional[boltccl.Group] = None) -> None:  # noqa: A002
    """Send ``x`` to rank ``dst`` (which calls ``recv`` with the same shape and dtype)."""
    (group or globals()["group"]()).send(x, dst)


def recv(shape: Any, dtype: Any, src: int, *, group: Optional[boltccl.Group] = None) -> mx.array:  # noqa: A002
    """An array of ``shape`` and ``dtype`` received from rank ``src``."""
    out = _fresh(shape, dtype)
    (group or globals()["group"]()).recv(out, src)
    return out
