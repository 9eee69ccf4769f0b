"""FSDP2 (torch.distributed.fsdp.fully_shard) training a small transformer over the boltccl
backend: each rank its own batches, every layer and the model sharded. Prints a digest of the
full parameters (DTensor.full_tensor) and the first of them. `--emulate N` trains one process,
unsharded, on the N ranks' batches at once (FSDP2's averaged gradient is that of the mean loss
over all of them): the reference the sharded run must match up to float rounding."""

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import boltccl.torch  # noqa: F401 - registers the backend

emulate = int(sys.argv[2]) if sys.argv[1:2] == ["--emulate"] else 0
if not emulate:
    dist.init_process_group(os.environ.get("FSDP_BACKEND", "boltccl"))
    rank, n = dist.get_rank(), dist.get_world_size()
else:
    rank, n = 0, 1

torch.manual_seed(0)  # the same initial parameters everywhere
layers = [nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True) for _ in range(2)]
model = nn.Sequential(*layers, nn.Linear(32, 1))
if not emulate:
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
streams = range(emulate) if emulate else [rank]
gens = [torch.Generator().manual_seed(100 + r) for r in streams]
for step in range(8):
    x = torch.cat([torch.randn(4, 6, 32, generator=g) for g in gens])
    y = x.sum(dim=(1, 2)).unsqueeze(1) / 10
    loss = (model(x).mean(dim=1) - y).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
full = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for p in model.parameters()]
flat = torch.cat([t.detach().reshape(-1) for t in full])
result = {
    "rank": rank,
    "size": n,
    "digest": hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16],
    "params": flat[:64].tolist(),
}
print("RESULT " + json.dumps(result), flush=True)
if not emulate:
    dist.destroy_process_group()
