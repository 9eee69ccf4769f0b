"""float32 all_sum through the Python binding, measured as `boltccl bench` measures it: a
warm-up, then per-call times, the median of each rank, and the slowest rank's median. Rank 0
appends records in `boltccl bench --json` form (peer "python") to the file named first.

  python -m boltccl.launch -n 2 -- python bindings-allsum.py OUT.jsonl ROUND   # 4 B and 64 MiB
  python bindings-allsum.py OUT.jsonl ROUND                                   # 4 B, one rank
"""

import json
import sys
import time

import numpy as np

import boltccl

out, rnd = sys.argv[1], int(sys.argv[2])
g = boltccl.init()
all_sum = g.all_sum
clock = time.perf_counter
sizes = [4, 64 << 20] if g.size > 1 else [4]
for size in sizes:
    x = np.ones(size // 4, dtype=np.float32)
    warm, iters = (50, 5000) if size <= 65536 else (3, 10)
    for _ in range(warm):
        all_sum(x)
    times = []
    g.barrier()
    for _ in range(iters):
        t = clock()
        all_sum(x)
        times.append(clock() - t)
    times.sort()
    med = np.array([times[iters // 2] * 1e6])
    g.all_max(med)
    p = g.size
    algbw = size / (med[0] * 1e-6) / 1e9
    if g.rank == 0:
        rec = {"peer": "python", "op": "all_sum", "n": p, "bytes": size, "iters": iters, "median_us": float(med[0]),
               "algbw_gbps": algbw, "busbw_gbps": algbw * (2 * (p - 1) / p if p > 1 else 1), "round": rnd}
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")
g.barrier()
