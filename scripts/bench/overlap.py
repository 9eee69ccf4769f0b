"""Overlap: each rank multiplies matrices while an async 64 MiB float32 all_sum runs, against
the same compute and the same all_sum measured apart. Prints one JSON line (rank 0).

  python -m boltccl.launch -n 2 overlap.py [--mib 64] [--reps 5]
"""

import argparse
import json
import os
import statistics
import time

import numpy as np

import boltccl

ap = argparse.ArgumentParser()
ap.add_argument("--mib", type=int, default=64)
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--dim", type=int, default=512)
a = ap.parse_args()
g = boltccl.init()
x = np.ones(a.mib << 18, dtype=np.float32)
m = np.random.default_rng(g.rank).random((a.dim, a.dim), dtype=np.float32)


def slowest(seconds):
    """Every rank's time, the slowest one (a step ends when the last rank is done)."""
    v = np.zeros(g.size)
    v[g.rank] = seconds
    g.all_sum(v)
    return float(v.max())


def comm():
    g.barrier()
    t = time.perf_counter()
    g.all_sum(x)
    return slowest(time.perf_counter() - t)


buf = np.empty_like(m)


def compute(k):
    for _ in range(k):
        np.matmul(m, m, out=buf)  # the same product each time: no denormals creep in
    return buf


def timed_compute(k):
    g.barrier()
    t = time.perf_counter()
    compute(k)
    return slowest(time.perf_counter() - t)


def overlapped(k):
    g.barrier()
    t = time.perf_counter()
    w = g.all_sum(x, async_op=True)
    compute(k)
    w.wait()
    return slowest(time.perf_counter() - t)


comm()  # warm-up (scratch, connections)
c = statistics.median(comm() for _ in range(3))
# Size the compute to take about as long as the communication alone.
t = time.perf_counter()
compute(10)
per = (time.perf_counter() - t) / 10
k = int(np.array([max(1, round(c / per))], dtype=np.int64)[0])
kk = np.array([k if g.rank == 0 else 0], dtype=np.int64)
g.all_sum(kk)
k = int(kk[0])
rounds = []
for _ in range(a.reps):
    rounds.append((comm(), timed_compute(k), overlapped(k)))
cm = statistics.median(r[0] for r in rounds)
cp = statistics.median(r[1] for r in rounds)
ov = statistics.median(r[2] for r in rounds)
if g.rank == 0:
    print(
        json.dumps(
            {
                "ranks": g.size,
                "mib": a.mib,
                "matmuls": k,
                "dim": a.dim,
                "comm_s": round(cm, 4),
                "compute_s": round(cp, 4),
                "sum_apart_s": round(cm + cp, 4),
                "overlapped_s": round(ov, 4),
                "saved": f"{(1 - ov / (cm + cp)) * 100:.0f}%",
                "threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            }
        ),
        flush=True,
    )
