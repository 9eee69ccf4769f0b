"""Data-parallel training with PyTorch over boltccl: DistributedDataParallel averages the
gradients with boltccl's all_reduce (overlapped with the backward pass by DDP's buckets).

  torchrun --nproc-per-node 2 torch_ddp.py          # or: boltccl launch -n 2 -- python torch_ddp.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn

import boltccl.torch  # noqa: F401  registers the "boltccl" backend

dist.init_process_group("boltccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(rank)  # each rank its own data
w = torch.randn(32, generator=torch.Generator().manual_seed(42))
for step in range(50):
    x = torch.randn(64, 32, generator=gen)
    loss = nn.functional.mse_loss(ddp(x), (x @ w).unsqueeze(1))
    opt.zero_grad()
    loss.backward()  # gradients all-reduced here, bucket by bucket
    opt.step()
    if rank == 0 and step % 10 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}")
# Every rank holds the same parameters, bit for bit.
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
mine = flat.clone()
dist.broadcast(flat, src=0)
assert torch.equal(flat, mine), "parameters differ between ranks"
if rank == 0:
    print(f"done: {world} ranks, identical parameters")
dist.destroy_process_group()
