"""Started by a real launcher with no BOLTCCL_* variable: form the group from the launcher's
own variables, check rank and size against what the launcher says, run a checked all_sum and
all_gather, and print one RESULT line. `--with-mlx-ring` also runs MLX's own ring backend in
the same process, before and after boltccl (it listens on the hostfile's ports)."""

import json
import os
import sys

import numpy as np

import boltccl

expected = {k: os.environ.get(k) for k in ("RANK", "MLX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")}
assert not any(k.startswith("BOLTCCL_") and k != "BOLTCCL_LOG" for k in os.environ), "a BOLTCCL_ variable leaked in"
mlx_ring = "--with-mlx-ring" in sys.argv
if mlx_ring:
    import mlx.core as mx

    world = mx.distributed.init(backend="ring", strict=True)
    mine = mx.distributed.all_sum(mx.ones(4), group=world)
    mx.eval(mine)
g = boltccl.init()
n = g.size
x = np.full(100_000, g.rank + 1, dtype=np.float32)
g.all_sum(x)
ranks = g.all_gather(np.array([g.rank], dtype=np.int64))
ok = bool((x == n * (n + 1) / 2).all()) and ranks.tolist() == list(range(n))
if mlx_ring:
    again = mx.distributed.all_sum(mx.ones(4) * (world.rank() + 1), group=world)
    mx.eval(again)
    ok = ok and float(mine[0]) == world.size() and float(again[0]) == n * (n + 1) / 2
launcher_rank = next((int(v) for v in expected.values() if v is not None), None)
print(
    "RESULT "
    + json.dumps(
        {
            "rank": g.rank,
            "size": n,
            "launcher_rank": launcher_rank,
            "ok": ok,
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None,
        }
    ),
    flush=True,
)
