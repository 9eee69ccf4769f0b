"""torch tensors, mlx arrays and JAX arrays given straight to boltccl (2+ ranks): results
land in the caller's memory (same address), every dtype, bfloat16 included; read-only JAX
arrays only out of place; clear errors; and no memory growth over 1,000 calls."""

import gc
import json
import resource
import sys

import jax.numpy as jnp
import mlx.core as mx
import numpy as np
import torch

import boltccl
import boltccl.mlx as bmx

g = boltccl.init()
rank, n = g.rank, g.size
tri = n * (n + 1) // 2
out = {"rank": rank}


def rss_mib():
    scale = 1 if sys.platform == "darwin" else 1024
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20) if sys.platform != "darwin" else (
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / (1 << 20)
        )


# torch: every dtype, in place, same memory.
for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
    t = torch.full((4097,), rank + 1, dtype=dt)
    p = t.data_ptr()
    r = g.all_sum(t)
    assert r is t and t.data_ptr() == p and bool((t == tri).all()), (dt, t[:4])
# A CPU tensor's numpy view is the tensor's memory too.
t = torch.ones(4)
g.all_sum(t.numpy())
assert t.tolist() == [float(n)] * 4, t
ag = g.all_gather(torch.tensor([rank, rank], dtype=torch.int32))
assert isinstance(ag, torch.Tensor) and ag.tolist() == [q for q in range(n) for _ in range(2)], ag
rs = g.reduce_scatter(torch.arange(2 * n, dtype=torch.float32), op="max")
assert isinstance(rs, torch.Tensor) and rs.tolist() == [2.0 * rank, 2.0 * rank + 1], rs
for bad, want in ((torch.ones(3, requires_grad=True), "detach()"), (torch.ones(4, 4).t(), "contiguous()")):
    try:
        g.all_sum(bad)
        raise AssertionError("accepted " + want)
    except ValueError as e:
        assert want in str(e), e
out["torch"] = True

# MLX: the buffer protocol, in place, bfloat16 by its format name "bfloat16".
# Values that differ along the array, so an element put in the wrong place shows.
pos = mx.arange(1000) % 7
for dt in (mx.float32, mx.bfloat16, mx.float16, mx.int32):
    a = (pos + rank + 1).astype(dt)
    mx.eval(a)
    # The array's own memory changes (numpy cannot view bfloat16: its values are checked only).
    addr = np.asarray(memoryview(a)).ctypes.data if dt != mx.bfloat16 else None
    g.all_sum(a)
    assert (a == (pos * n + tri).astype(dt)).all().item(), (dt, a[:8])
    if addr is not None:
        assert np.asarray(memoryview(a)).ctypes.data == addr, (dt, "all_sum moved the array")
x = mx.arange(6, dtype=mx.float32) * (rank + 1)
y = bmx.all_sum(x, group=g)
assert isinstance(y, mx.array) and (x == mx.arange(6) * (rank + 1)).all().item(), "x unchanged"
assert (y == mx.arange(6) * tri).all().item()
assert bmx.all_gather(mx.array([rank]), group=g).tolist() == list(range(n))
rows = mx.arange(2 * n * 3, dtype=mx.float32).reshape(2 * n, 3)
rsm = bmx.reduce_scatter(rows + rank, group=g)
assert rsm.shape == (2, 3), rsm.shape
assert (rsm == rows[2 * rank : 2 * rank + 2] * n + n * (n - 1) // 2).all().item(), rsm
assert bmx.broadcast(mx.array([rank + 5]), root=n - 1, group=g).item() == n - 1 + 5
assert bmx.all_max(mx.array([rank]), group=g).item() == n - 1
out["mlx"] = True

# JAX: immutable, so only out of place.
j = jnp.full((8,), rank + 1.0, dtype=jnp.float32)
try:
    g.all_sum(j)
    raise AssertionError("in place on a JAX array")
except ValueError as e:
    assert "read-only" in str(e) and "out=" in str(e), e
o = g.all_sum(j, out=np.empty(8, np.float32))
assert (o == tri).all(), o
assert np.asarray(j).tolist() == [rank + 1.0] * 8, "the JAX array is untouched"
gj = g.all_gather(jnp.arange(8, dtype=jnp.float32) + 10 * rank)
assert isinstance(gj, np.ndarray) and gj.shape == (8 * n,)
assert gj.tolist() == [10.0 * q + i for q in range(n) for i in range(8)], gj
out["jax"] = True

# Zero copy over 1,000 calls: the result is in the caller's memory and memory stays flat.
big_t = torch.full((2 << 20,), 1.0)  # 8 MiB
big_a = mx.full((2 << 20,), 1.0)
mx.eval(big_a)
ptr_t, ptr_a = big_t.data_ptr(), np.asarray(memoryview(big_a)).ctypes.data
for warm in range(20):
    g.all_sum(big_t)
    g.all_sum(big_a)
    bmx.all_sum(big_a, group=g)
gc.collect()
base = rss_mib()
for i in range(1000):
    g.all_max(big_t)
    g.all_max(big_a)
growth_inplace = rss_mib() - base
for i in range(1000):
    bmx.all_max(big_a, group=g)
gc.collect()
growth_functional = rss_mib() - base
assert big_t.data_ptr() == ptr_t and np.asarray(memoryview(big_a)).ctypes.data == ptr_a
out.update(rss_base_mib=round(base, 1), growth_inplace_mib=round(growth_inplace, 2), growth_mlx_functional_mib=round(growth_functional, 2))
print("RESULT " + json.dumps(out), flush=True)
