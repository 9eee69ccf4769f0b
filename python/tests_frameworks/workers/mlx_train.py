"""A tiny data-parallel training loop in plain MLX: each rank trains on its own batches and
averages the gradients with mlx.nn.average_gradients (mx.distributed.all_sum inside), over
whatever backend mx.distributed.init() chooses. Prints a digest of the final parameters and a
few of them. `--emulate N` trains one process on the N ranks' batches at once (the mean loss
over all of them has the averaged gradient): the reference a distributed run must match."""

import hashlib
import json
import sys

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

world = mx.distributed.init()
rank, n = world.rank(), world.size()
emulate = int(sys.argv[2]) if sys.argv[1:2] == ["--emulate"] else 0
streams = range(emulate) if emulate else [rank]
mx.random.seed(0)  # the same initial parameters on every rank
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
opt = optim.SGD(learning_rate=0.05)


def loss_fn(model, x, y):
    return nn.losses.mse_loss(model(x), y)


grad_fn = nn.value_and_grad(model, loss_fn)
rngs = [np.random.default_rng(100 + r) for r in streams]  # each rank its own data
w_true = np.linspace(-1, 1, 16).astype(np.float32)
for step in range(30):
    x = np.concatenate([rng.standard_normal((32, 16)).astype(np.float32) for rng in rngs])
    y = (x @ w_true)[:, None]
    loss, grads = grad_fn(model, mx.array(x), mx.array(y))
    if not emulate:
        grads = nn.average_gradients(grads)
    opt.update(model, grads)
    mx.eval(model.parameters(), opt.state)
params = b"".join(np.array(v).tobytes() for _, v in tree_flatten(model.parameters()))
first = np.concatenate([np.array(v).ravel() for _, v in tree_flatten(model.parameters())])[:64]
result = {"rank": rank, "size": n, "digest": hashlib.sha256(params).hexdigest()[:16], "params": first.tolist()}
print("RESULT " + json.dumps(result), flush=True)
