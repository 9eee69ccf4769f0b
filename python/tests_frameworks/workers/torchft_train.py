"""One torchft replica group (a single process) training a small model over boltccl.torchft:
torchft's Manager, DistributedDataParallel and OptimizerWrapper, each replica on its own
deterministic batches. Prints a `STEP {...}` line after every step (committed or not, with the
quorum's participant count and the last reconfigure's time) and, at the end, `RESULT {...}`
with a digest of the final parameters. It stops once it has committed `--steps` steps and the
last step had `--replicas` participants (so a survivor keeps training until its peer is back)."""

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from boltccl.torchft import ProcessGroupBoltccl

from torchft.ddp import DistributedDataParallel
from torchft.manager import Manager
from torchft.optim import OptimizerWrapper

ap = argparse.ArgumentParser()
ap.add_argument("--replica-id", type=int, required=True)
ap.add_argument("--lighthouse", required=True)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--replicas", type=int, default=2)
ap.add_argument("--max-steps", type=int, default=3000)
ap.add_argument("--step-sleep", type=float, default=0.1)
# Die by SIGKILL in the middle of a step (quorum formed, before its all_reduce) once this many
# steps were committed with all replicas: the others' all_reduce then loses this peer.
ap.add_argument("--die-after-steps-together", type=int, default=0)
# A replacement started ahead (its imports take seconds) joins only once this file exists.
ap.add_argument("--start-when", default="")
args = ap.parse_args()
rid = args.replica_id

torch.manual_seed(0)  # every replica starts from the same parameters
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
inner_opt = torch.optim.Adam(model.parameters(), lr=1e-2)


def state_dict() -> dict:
    return {"model": model.state_dict(), "optim": inner_opt.state_dict()}


def load_state_dict(sd: dict) -> None:
    model.load_state_dict(sd["model"])
    inner_opt.load_state_dict(sd["optim"])


if args.start_when:
    print("READY", flush=True)
    give_up = time.time() + 300
    while not os.path.exists(args.start_when):
        if time.time() > give_up:
            sys.exit(f"{args.start_when} never appeared")
        time.sleep(0.02)

store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
pg = ProcessGroupBoltccl(timeout=timedelta(seconds=10))
manager = Manager(
    pg=pg,
    load_state_dict=load_state_dict,
    state_dict=state_dict,
    min_replica_size=1,
    replica_id=str(rid),
    store_addr="localhost",
    store_port=store.port,
    rank=0,
    world_size=1,
    lighthouse_addr=args.lighthouse,
    hostname="localhost",
    timeout=timedelta(seconds=10),
    quorum_timeout=timedelta(seconds=30),
    connect_timeout=timedelta(seconds=10),
)
# Buckets of 1 KB: the 2.7 KB of gradients go in three all_reduces a step, so that a peer lost
# in the first leaves the others to a group already broken.
ddp = DistributedDataParallel(manager, model, bucket_cap_mb=0.001)
calls = 0  # the Manager's all_reduces in this step
_allreduce = manager.allreduce


def counted_allreduce(*a: object, **k: object) -> object:
    global calls
    calls += 1
    return _allreduce(*a, **k)


manager.allreduce = counted_allreduce
opt = OptimizerWrapper(manager, inner_opt)
loss_fn = nn.MSELoss()
w_true = torch.linspace(-1, 1, 16 * 4).reshape(16, 4)

steps = together = 0
while True:
    step = manager.current_step()
    g = torch.Generator().manual_seed(1000 * rid + step)  # this replica's batch for this step
    x = torch.randn(8, 16, generator=g)
    y = torch.tanh(x @ w_true)
    opt.zero_grad()  # starts the quorum (and the reconfigure, when it changed)
    calls = 0
    if args.die_after_steps_together and together >= args.die_after_steps_together:
        manager.wait_quorum()
        print("DYING " + json.dumps({"step": step, "t": time.time()}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    loss = loss_fn(ddp(x), y)
    loss.backward()  # the gradient's all_reduce over boltccl
    opt.step()  # commits only if every replica's step went through
    steps += 1
    rec = {
        "replica": rid,
        "step": manager.current_step(),
        "committed": manager.current_step() > step,
        "participants": manager.num_participants(),
        "configure_s": pg.last_configure_s,
        "all_reduces": calls,
        "error": repr(manager.errored().original_exception)[:200] if manager.errored() else None,
        "t": time.time(),
    }
    print("STEP " + json.dumps(rec), flush=True)
    together += rec["committed"] and rec["participants"] == args.replicas
    if manager.current_step() >= args.steps and rec["committed"] and rec["participants"] == args.replicas:
        break
    if steps >= args.max_steps:
        print(f"gave up after {steps} steps", flush=True)
        sys.exit(3)
    time.sleep(args.step_sleep)

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
print(
    "RESULT "
    + json.dumps(
        {
            "rank": rid,
            "step": manager.current_step(),
            "digest": hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:32],
            "params": flat[:4].tolist(),
        }
    ),
    flush=True,
)
manager.shutdown(wait=False)
pg.shutdown()
