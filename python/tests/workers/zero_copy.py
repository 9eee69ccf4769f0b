"""all_sum works on the caller's memory: the array changes in place and no temporary of
its size is allocated (neither by Python objects, seen by tracemalloc, nor anywhere in the
process, seen by the peak RSS of the calls themselves: Linux's peak is reset after the
warm-up, so a copy made and freed in every call shows)."""

import json
import sys
import tracemalloc

import numpy as np

import boltccl

g = boltccl.init()
n = 8 << 20  # 32 MiB of float32
x = np.full(n, g.rank + 1, dtype=np.float32)
out = np.full(n, -1.0, dtype=np.float32)  # written, so its pages are resident (np.zeros may not be)
addr = x.__array_interface__["data"][0]


def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


# Warm-up on another array: the core keeps a fixed scratch area (at most 16 MiB, whatever the
# message size) across calls; that one-time allocation is not a per-call temporary.
g.all_sum(np.ones(n, dtype=np.float32))
g.barrier()
tracemalloc.start()
# The process peak (VmHWM) would still hold the warm-up's temporary, hiding a copy per call:
# reset it to the present size (Linux: "5" to clear_refs), then read how far the calls raise it.
linux = sys.platform.startswith("linux")
rss0 = None
if linux:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss0 = status_kib("VmRSS") * 1024
r = g.all_sum(x)
g.all_sum(x, out=out)
rss1 = status_kib("VmHWM") * 1024 if linux else None
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
            "rss_growth": (rss1 - rss0) if linux else None,
            "nbytes": x.nbytes,
        }
    ),
    flush=True,
)
