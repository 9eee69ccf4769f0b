"""boltccl: collective communication for small clusters.

>>> import boltccl, numpy as np
>>> g = boltccl.init()                 # from BOLTCCL_* (set by the launcher) or keywords
>>> x = np.full(1024, g.rank, dtype=np.float32)
>>> g.all_sum(x)                       # in place, like torch.distributed.all_reduce
>>> y = g.all_gather(x)                # a new array of g.size * 1024 elements

Run ranks with ``python -m boltccl.launch -n 4 script.py`` (or under mlx.launch, torchrun,
mpirun, srun). Calls work zero-copy on C-contiguous arrays (numpy, torch CPU tensors, mlx.core
arrays, memoryview, ...; read-only ones such as JAX's out of place), release the GIL while
communicating, can be interrupted with Ctrl-C, and with ``async_op=True`` return a
:class:`Work`. ``boltccl.torch`` is a torch.distributed backend, ``boltccl.torchft`` a
process group for torchft's fault-tolerant training, ``boltccl.mlx`` returns mx arrays.
"""

from __future__ import annotations

from ._native import DTYPES, Group, Work, __version__, init
from .errors import ConfigError, Error, PeerLostError, TimeoutError

__all__ = [
    "DTYPES",
    "ConfigError",
    "Error",
    "Group",
    "PeerLostError",
    "TimeoutError",
    "Work",
    "__version__",
    "init",
]
