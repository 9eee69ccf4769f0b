"""Every collective of the boltccl torch.distributed backend, checked against plain Python on
every rank: dtypes (bfloat16 included), reduce ops, non-contiguous tensors, async Works and
their futures, send/recv and isend/irecv, new_group. Prints one RESULT line."""

import math

import torch
import torch.distributed as dist
from torch_checks import Checks

import boltccl.torch  # noqa: F401  registers "boltccl"

dist.init_process_group("boltccl")
rank, n = dist.get_rank(), dist.get_world_size()
tri = n * (n + 1) // 2
check = Checks(rank, n)


# Values that differ along each tensor (small: exact in every dtype, int8 included), so an
# element put in the wrong place shows, not only a wrong sum.
pos = torch.arange(1000) % 7
for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64, torch.uint8):
    t = (pos + rank + 1).to(dt)
    dist.all_reduce(t)
    check(f"all_reduce sum {dt}", bool((t == (pos * n + tri).to(dt)).all()))
t = torch.arange(8, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
check("avg", torch.allclose(t, torch.arange(8, dtype=torch.float32) * tri / n))
t = torch.tensor([rank, -rank], dtype=torch.int64)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
check("max", t.tolist() == [n - 1, 0])
t = torch.tensor([rank, -rank], dtype=torch.int64)
dist.all_reduce(t, op=dist.ReduceOp.MIN)
check("min", t.tolist() == [0, -(n - 1)])
t = torch.tensor([rank + 1.0, 2.0])
dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
check("product", t.tolist() == [float(math.factorial(n)), 2.0**n])
try:
    dist.reduce_scatter_tensor(torch.ones(2), torch.ones(2 * n), op=dist.ReduceOp.PRODUCT)
    check("reduce_scatter product refused", False)
except (ValueError, RuntimeError) as e:
    check("reduce_scatter product refused", "SUM, AVG, PREMUL_SUM, MAX and MIN" in str(e))
# A parameter that requires grad, and a non-contiguous view.
p = torch.nn.Parameter(torch.full((4,), float(rank + 1)))
dist.all_reduce(p.data)
dist.all_reduce(p)
check("requires grad", bool((p.detach() == tri * n).all()))
m = torch.zeros(4, 6)
m[:, 0] = torch.arange(4.0) + rank + 1
col = m[:, 0]  # stride 6: not contiguous
check("really non-contiguous", not col.is_contiguous())
dist.all_reduce(col)
check("non-contiguous", bool((m[:, 0] == torch.arange(4.0) * n + tri).all()) and bool((m[:, 1:] == 0).all()))
# Gathers and scatters.
# Every element of every gathered block: rank q's block is 10q + its positions.
outs = [torch.empty(3, dtype=torch.bfloat16) for _ in range(n)]
dist.all_gather(outs, (torch.arange(3) + 10 * rank).to(torch.bfloat16))
check("all_gather", [o.tolist() for o in outs] == [[10.0 * q + i for i in range(3)] for q in range(n)])
big = torch.empty(n * 5, dtype=torch.int32)
dist.all_gather_into_tensor(big, (torch.arange(5) + 100 * rank).to(torch.int32))
check("all_gather_into_tensor", big.tolist() == [100 * q + i for q in range(n) for i in range(5)])
out = torch.empty(4)
dist.reduce_scatter(out, [torch.arange(4.0) + rank + 10 * r for r in range(n)])
check("reduce_scatter", out.tolist() == [sum(i + q + 10 * rank for q in range(n)) for i in range(4)])
out = torch.empty(2, dtype=torch.float64)
dist.reduce_scatter_tensor(out, torch.arange(2 * n, dtype=torch.float64) * (rank + 1), op=dist.ReduceOp.AVG)
check("reduce_scatter_tensor avg", torch.allclose(out, torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float64) * tri / n))
b = torch.arange(7.0) + 100 * rank
dist.broadcast(b, src=n - 1)
check("broadcast", b.tolist() == [100.0 * (n - 1) + i for i in range(7)])
dist.barrier()
# Async: Works, futures, and overlap of several calls.
wave = (torch.arange(1 << 16) % 13).float()
ts = [wave + rank + 1 + k for k in range(3)]
works = [dist.all_reduce(t, async_op=True) for t in ts]
fut = works[-1].get_future()
for w in works:
    w.wait()
check("async all_reduce", all(bool((t == wave * n + tri + n * k).all()) for k, t in enumerate(ts)) and works[0].is_completed())
check("future", bool((fut.wait()[0] == wave * n + tri + n * 2).all()))
w = dist.all_reduce(torch.ones(3), op=dist.ReduceOp.AVG, async_op=True)
chained = w.get_future().then(lambda f: f.value()[0] * 2)
check("future chain", bool((chained.wait() == 2).all()))
# Point to point: a ring, blocking and non-blocking.
right, left = (rank + 1) % n, (rank - 1) % n
got = torch.empty(5, dtype=torch.int64)
if rank % 2 == 0:
    dist.send(torch.full((5,), rank, dtype=torch.int64), right)
    dist.recv(got, left)
else:
    dist.recv(got, left)
    dist.send(torch.full((5,), rank, dtype=torch.int64), right)
check("send/recv", bool((got == left).all()))
if rank % 2 == 0:
    reqs = [dist.isend(torch.full((3,), 10.0 + rank), right), dist.irecv(got2 := torch.empty(3), left)]
else:
    reqs = [dist.irecv(got2 := torch.empty(3), left), dist.isend(torch.full((3,), 10.0 + rank), right)]
for r in reqs:
    r.wait()
check("isend/irecv", bool((got2 == 10.0 + left).all()))
# new_group: the even ranks.
evens = list(range(0, n, 2))
sub = dist.new_group(evens, backend="boltccl")
if rank in evens:
    s = torch.ones(2)
    dist.all_reduce(s, group=sub)
    check("new_group", bool((s == len(evens)).all()))
t = torch.ones(1)
dist.all_reduce(t)
check("world after new_group", t.item() == n)
check("backend name", dist.get_backend() == "boltccl")
dist.destroy_process_group()
check.result()
