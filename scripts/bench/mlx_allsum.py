"""mx.distributed.all_sum (float32) timed with the peers' harness (shared/bench/peers/common.py),
over whichever backend MLX is asked for: one script for MLX's ring backend, MLX's mpi backend
on Open MPI's libmpi, and MLX's mpi backend on libboltccl_mpi (the MLX_MPI_LIBNAME the
launcher gives). Run by scripts/bench/mlx.sh:

  MLX_BENCH_BACKEND=ring|mpi MLX_BENCH_LABEL=NAME PEERS_DIR=... python mlx_allsum.py OUT.jsonl
"""

import os
import sys

sys.path.insert(0, os.environ["PEERS_DIR"])
import common  # noqa: E402

import mlx.core as mx  # noqa: E402

out = common.out_path_from_argv()
g = mx.distributed.init(strict=True, backend=os.environ["MLX_BENCH_BACKEND"])
rank, n = g.rank(), g.size()
expected = n * (n + 1) / 2


def make_op(nbytes):
    x = mx.full((nbytes // 4,), rank + 1, dtype=mx.float32)
    mx.eval(x)

    def op():
        mx.eval(mx.distributed.all_sum(x, group=g))

    def check():
        return bool(mx.all(mx.distributed.all_sum(x, group=g) == expected).item())

    return op, check


def share(vals):
    y = mx.distributed.all_sum(mx.array(vals, dtype=mx.float32), group=g)
    mx.eval(y)
    return [float(v) for v in y.tolist()]


label = os.environ["MLX_BENCH_LABEL"]
ok = common.run_suite(label, rank, n, make_op, share, out, extra={"version": "mlx " + mx.__version__})
sys.exit(0 if ok else 1)
