"""All-to-all through torch.distributed (`dist.all_to_all_single`, CPU float32 tensors) with
backend "gloo" or "boltccl" (the only thing that changes), timed with the peers' own harness
(shared/bench/peers/common.py: the same protocol as their all_reduce and as `boltccl bench`).
One process per rank, started by the peers' launch_local.py (RANK, WORLD_SIZE, MASTER_PORT):

  PEER_SIZES=8,1024 python3 launch_local.py 2 -- python alltoall_torch.py PEERS_DIR RESULTS.jsonl gloo|boltccl
SIZE: bytes per rank (the whole input; SIZE/N to each rank). The records' peer is "gloo" or
"torch-boltccl"; their busbw is the harness's all_reduce factor:
scripts/bench/alltoall-table.py recomputes it from the latency.
"""

import os
import sys

sys.path.insert(0, sys.argv[1])
import common  # noqa: E402  (the peers' harness)

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

out, backend = sys.argv[2], sys.argv[3]
if backend == "boltccl":
    import boltccl.torch  # noqa: F401, E402  registers the backend
elif backend != "gloo":
    sys.exit(f"backend {backend!r}: give gloo or boltccl")
rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{os.environ.get('MASTER_PORT', '29500')}", rank=rank, world_size=n)


def value(r, idx):
    return ((r * 131 + idx * 7) % 1021).to(torch.float32)


def make_op(nbytes):
    count = nbytes // 4
    m = count // n
    x, y = torch.zeros(count), torch.empty(count)

    def op():
        dist.all_to_all_single(y, x)

    def check():
        idx = torch.arange(count)
        src = value(rank, idx)
        got = torch.full((count,), -1.0)
        dist.all_to_all_single(got, src)
        return bool(torch.equal(got, value(idx // m, rank * m + idx % m)))

    return op, check


def share(vals):
    t = torch.tensor(vals, dtype=torch.float32)
    dist.all_reduce(t)
    return [float(v) for v in t.tolist()]


label = "gloo" if backend == "gloo" else "torch-boltccl"
ok = common.run_suite(label, rank, n, make_op, share, out, extra={"op": "all_to_all", "version": f"torch {torch.__version__}"})
dist.destroy_process_group()
sys.exit(0 if ok else 1)
