"""boltccl: collective communication for small clusters.

>>> import boltccl, numpy as np
>>> g = boltccl.init()                 # from BOLTCCL_* (set by the launcher) or keywords
>>> x = np.full(1024, g.rank, dtype=np.float32)
>>> g.all_sum(x)                       # in place, like torch.distributed.all_reduce
>>> y = g.all_gather(x)                # a new array of g.size * 1024 elements

Run ranks with ``python -m boltccl.launch -n 4 script.py``. Calls work zero-copy on any
writable C-contiguous buffer (numpy arrays, memoryview, array.array, torch CPU tensors via
``.numpy()``), release the GIL while communicating, and can be interrupted with Ctrl-C.
"""

from __future__ import annotations

from ._native import DTYPES, Group, __version__, init
from .errors import ConfigError, Error, PeerLostError, TimeoutError

__all__ = [
    "DTYPES",
    "ConfigError",
    "Error",
    "Group",
    "PeerLostError",
    "TimeoutError",
    "__version__",
    "init",
]
