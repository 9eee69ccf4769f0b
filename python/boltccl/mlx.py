"""boltccl for MLX code: collectives that take and return ``mlx.core`` arrays.

>>> import mlx.core as mx, boltccl.mlx as bmx
>>> y = bmx.all_sum(x)                 # a new mx.array; x is unchanged (like mx.distributed)

MLX has no plug-in point for another communication backend (``mx.distributed`` hard-codes
its own), so boltccl works beside MLX on evaluated arrays: each call evaluates its input, and
the result is a fresh MLX array that boltccl writes straight into (no staging copy). The
group is ``boltccl.init()``'s, made on first use, unless ``group=`` is given. Run under
``mlx.launch``, ``boltccl launch`` or any launcher boltccl knows; MLX's own ring backend may
run in the same processes (boltccl never binds its ports).
"""

from __future__ import annotations

from typing import Any, Optional

import mlx.core as mx

import boltccl

__all__ = ["group", "all_sum", "all_max", "all_min", "all_gather", "reduce_scatter", "broadcast", "send", "recv"]

_group: Optional[boltccl.Group] = None


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
