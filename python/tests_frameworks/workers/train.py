"""A data-parallel training loop: every rank trains the same model on its own shard of a
synthetic regression task and averages gradients with all_reduce (or through
DistributedDataParallel with --ddp). Prints the losses and a SHA-256 of the final parameters.

  torchrun --nproc-per-node 2 train.py --backend boltccl [--ddp] [--steps 30]
"""

import argparse
import hashlib
import json

import torch
import torch.distributed as dist
import torch.nn as nn

import boltccl.torch  # noqa: F401

ap = argparse.ArgumentParser()
ap.add_argument("--backend", default="boltccl")
ap.add_argument("--ddp", action="store_true")
ap.add_argument("--steps", type=int, default=30)
a = ap.parse_args()

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
dist.init_process_group(a.backend)
rank, n = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)  # the same initial model everywhere
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
net = nn.parallel.DistributedDataParallel(model) if a.ddp else model
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
gen = torch.Generator().manual_seed(1000 + rank)  # this rank's data
w_true = torch.linspace(-1, 1, 32)
losses = []
for step in range(a.steps):
    x = torch.randn(64, 32, generator=gen)
    y = torch.tanh(x @ w_true / 4).unsqueeze(1)
    opt.zero_grad()
    loss = nn.functional.mse_loss(net(x), y)
    loss.backward()
    if not a.ddp:
        for p in model.parameters():
            dist.all_reduce(p.grad)  # SUM (Gloo has no AVG)
            p.grad.div_(n)
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses.append(mean.item() / n)
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
dist.destroy_process_group()
print("RESULT " + json.dumps({"rank": rank, "size": n, "losses": losses, "params": digest}), flush=True)
