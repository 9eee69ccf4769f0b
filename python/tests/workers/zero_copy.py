"""all_sum works on the caller's memory: the array changes in place and no temporary of
its size is allocated (neither by Python objects, seen by tracemalloc, nor anywhere in the
process, seen by the peak RSS after a warm-up call)."""

import json
import resource
import sys
import tracemalloc

import numpy as np

import boltccl

g = boltccl.init()
n = 8 << 20  # 32 MiB of float32
x = np.full(n, g.rank + 1, dtype=np.float32)
out = np.full(n, -1.0, dtype=np.float32)  # written, so its pages are resident (np.zeros may not be)
addr = x.__array_interface__["data"][0]
scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux

# Warm-up on another array: the core keeps a fixed scratch area (at most 16 MiB, whatever the
# message size) across calls; that one-time allocation is not a per-call temporary.
g.all_sum(np.ones(n, dtype=np.float32))
g.barrier()
tracemalloc.start()
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
r = g.all_sum(x)
g.all_sum(x, out=out)
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
want = g.size * (g.size + 1) / 2
print(
    "RESULT "
    + json.dumps(
        {
            "same_object": r is x,
            "same_address": x.__array_interface__["data"][0] == addr,
            "changed": bool((x == want).all()),
            "out_ok": bool((out == want * g.size).all()),
            "traced_peak": peak,
            "rss_growth": rss1 - rss0,
            "nbytes": x.nbytes,
        }
    ),
    flush=True,
)
