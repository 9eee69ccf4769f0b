"""Result allocation for all_gather/reduce_scatter when no ``out=`` is given."""

from __future__ import annotations

import array
from typing import Any


def like(x: Any, num: int, den: int, dtype: Any = None) -> Any:
    """A new writable buffer of x's type with ``len(x) * num / den`` elements.

    numpy arrays give numpy arrays (the first axis is scaled), ``array.array`` gives an
    ``array.array``, anything else a ``bytearray`` (wrapped in a memoryview of x's format).
    """
    np = _numpy()
    if np is not None and isinstance(x, np.ndarray):
        shape = list(x.shape) or [1]
        if (shape[0] * num) % den:
            raise ValueError(
                f"x has {shape[0]} rows, not divisible by the group size {den}: pass out= explicitly"
            )
        shape[0] = shape[0] * num // den
        return np.empty(shape, dtype=x.dtype)
    mv = memoryview(x)
    if (mv.nbytes * num) % den:
        raise ValueError(f"x has {mv.nbytes} bytes, not divisible by the group size {den}: pass out= explicitly")
    nbytes = mv.nbytes * num // den
    if isinstance(x, array.array):
        return array.array(x.typecode, bytes(nbytes))
    out = memoryview(bytearray(nbytes))
    try:
        return out.cast(mv.format) if dtype is None else out
    except (TypeError, ValueError):
        return out


def _numpy() -> Any:
    import sys

    return sys.modules.get("numpy")
