"""float32 all_reduce through torch.distributed, one script for every backend (the backend is
the only thing that changes): the peers' protocol (scripts/bench/peers.sh) — warm-up, every
rank runs the same number of timed calls (from rank 0's estimate), median per rank, the
slowest rank's median reported, busbw = bytes / time * 2(n-1)/n, each result checked.

  torchrun --standalone --nproc-per-node N torch_allreduce.py --backend boltccl|gloo OUT.jsonl
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import boltccl.torch  # noqa: F401  registers "boltccl"

ap = argparse.ArgumentParser()
ap.add_argument("--backend", required=True)
ap.add_argument("--sizes", default="4,1024,1048576,16777216,67108864")
ap.add_argument("--budget-s", type=float, default=float(os.environ.get("BENCH_BUDGET_S", "1.5")))
ap.add_argument("--round", type=int, default=1)
ap.add_argument("out")
a = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group(a.backend)
rank, n = dist.get_rank(), dist.get_world_size()


def share(vals):
    t = torch.tensor(vals, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


for nbytes in (int(s) for s in a.sizes.split(",")):
    count = max(1, nbytes // 4)
    t = torch.zeros(count, dtype=torch.float32)  # zeros stay zeros: finite whatever the count
    warm = 50 if nbytes <= 65536 else (10 if nbytes <= 1 << 20 else 3)
    t0 = time.perf_counter()
    for _ in range(warm):
        dist.all_reduce(t)
    est = share([(time.perf_counter() - t0) / warm if rank == 0 else 0.0])[0]
    iters = int(min(10000, max(10, a.budget_s / max(est, 1e-9))))
    lat = []
    for _ in range(iters):
        s = time.perf_counter_ns()
        dist.all_reduce(t)
        lat.append(time.perf_counter_ns() - s)
    c = torch.full((count,), float(rank + 1))
    dist.all_reduce(c)
    ok = bool((c == n * (n + 1) / 2).all())
    med = statistics.median(lat) / 1000.0
    vec = [0.0] * (n + 1)
    vec[rank] = med
    vec[n] = 0.0 if ok else 1.0
    got = share(vec)
    if rank == 0:
        worst = max(got[:n])
        algbw = nbytes / (worst * 1e-6) / 1e9
        rec = {"peer": f"torch+{a.backend}", "n": n, "bytes": nbytes, "iters": iters, "median_us": worst,
               "busbw_gbps": algbw * 2 * (n - 1) / n, "correct": got[n] == 0, "round": a.round,
               "torch": torch.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
dist.destroy_process_group()
