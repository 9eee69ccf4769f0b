"""all_sum benchmark from Python, the same measurement as examples/allsum_bench.rs.

Run as ranks; rank 0 prints one ``BENCH {json}`` line with ``lat_us`` (4-byte all_sum, median
time per call), ``call_us`` (the same on a one-rank group: the call
itself without the network) and ``busbw_gbs`` (64 MiB float32 numpy array).
"""

import json
import os
import time

import numpy as np

import boltccl

g = boltccl.init()
iters = int(os.environ.get("BENCH_LAT_ITERS", "5000"))
big_iters = int(os.environ.get("BENCH_BW_ITERS", "5"))
all_sum = g.all_sum

small = np.ones(1, dtype=np.float32)
for _ in range(iters // 5):
    all_sum(small)
# Median of per-call times: robust to the preemptions of a loaded machine.
times = []
clock = time.perf_counter
g.barrier()
for _ in range(iters):
    t = clock()
    all_sum(small)
    times.append(clock() - t)
times.sort()
lat = times[iters // 2]

solo = boltccl.init(rank=0, world_size=1)
solo_sum = solo.all_sum
call = float("inf")
for _ in range(5):
    t = time.perf_counter()
    for _ in range(iters * 20):
        solo_sum(small)
    call = min(call, (time.perf_counter() - t) / (iters * 20))

n = 16 << 20
big = np.ones(n, dtype=np.float32)
all_sum(big)
best = float("inf")
for _ in range(5):
    g.barrier()
    t = time.perf_counter()
    for _ in range(big_iters):
        all_sum(big)
    best = min(best, (time.perf_counter() - t) / big_iters)
p = g.size
busbw = n * 4 / best * 2 * (p - 1) / p / 1e9
if g.rank == 0:
    print("BENCH " + json.dumps({"api": "python", "ranks": p, "lat_us": round(lat * 1e6, 3), "call_us": round(call * 1e6, 4), "busbw_gbs": round(busbw, 3)}))
g.barrier()
