"""A tensor-parallel MLP block in MLX with boltccl: the first linear split by columns, the
second by rows, one all_sum. TP=1 and TP=2 print the same digest.

  python mlx_tp.py                       # TP=1
  mlx.launch -n 2 --python $(which python) mlx_tp.py      # TP=2 (or boltccl launch -n 2)

The weights are small multiples of 1/8 and the inputs of 1/4, so every product and partial
sum is exact in float32: the split changes nothing, bit for bit.
"""

import hashlib

import mlx.core as mx
import numpy as np

import boltccl.mlx as bmx

D, H, BATCH = 256, 1024, 8
g = bmx.group()
tp, r = g.size, g.rank
assert H % tp == 0, f"hidden size {H} must split over {tp} ranks"

rng = np.random.default_rng(0)  # every rank builds the same full weights, keeps its shard
w1 = rng.integers(-4, 5, (D, H)).astype(np.float32) / 8
w2 = rng.integers(-4, 5, (H, D)).astype(np.float32) / 8
x = mx.array(rng.integers(-4, 5, (BATCH, D)).astype(np.float32) / 4)
shard = slice(r * H // tp, (r + 1) * H // tp)
w1_local = mx.array(w1[:, shard])  # column-parallel: this rank's slice of the hidden units
w2_local = mx.array(w2[shard, :])  # row-parallel: the matching rows


def block(x: mx.array) -> mx.array:
    h = mx.maximum(x @ w1_local, 0)  # this rank's hidden units, no communication
    partial = h @ w2_local  # this rank's share of the output
    return bmx.all_sum(partial) if tp > 1 else partial


y = block(x)
mx.eval(y)
digest = hashlib.sha256(np.array(y).tobytes()).hexdigest()[:16]
if r == 0:
    print(f"TP={tp}: output {tuple(y.shape)}, sum {float(y.sum()):.4f}, digest {digest}")
