"""Result allocation for all_gather/reduce_scatter when no ``out=`` is given."""

from __future__ import annotations

import array
import sys
from typing import Any, List


def _scaled(shape: List[int], num: int, den: int, what: str) -> List[int]:
    shape = list(shape) or [1]
    if (shape[0] * num) % den:
        raise ValueError(f"x has {shape[0]} {what}, not divisible by the group size {den}: pass out= explicitly")
    shape[0] = shape[0] * num // den
    return shape


def like(x: Any, num: int, den: int, dtype: Any = None) -> Any:
    """A new writable buffer of x's kind with ``len(x) * num / den`` elements (first axis scaled).

    numpy arrays give numpy arrays, torch tensors torch tensors, mlx arrays mlx arrays, JAX
    arrays (immutable) numpy arrays; ``array.array`` gives an ``array.array``, anything else a
    ``bytearray`` (wrapped in a memoryview of x's format).
    """
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    mx = sys.modules.get("mlx.core")
    if np is not None and isinstance(x, np.ndarray):
        return np.empty(_scaled(x.shape, num, den, "rows"), dtype=x.dtype)
    if torch is not None and isinstance(x, torch.Tensor):
        return torch.empty(_scaled(x.shape, num, den, "rows"), dtype=x.dtype)
    if mx is not None and isinstance(x, mx.array):
        return mx.zeros(_scaled(x.shape, num, den, "rows"), dtype=x.dtype)
    if np is not None and type(x).__module__.startswith("jax"):
        return np.empty(_scaled(x.shape, num, den, "rows"), dtype=np.dtype(x.dtype))
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
