"""Errors through the torch backend surface as boltccl's own exceptions: rank 1 leaves without
joining an all_reduce that rank 0 started with async_op=True. Says where the error came: at
wait() (torch 2.x), or at the call (torch 1.x, where calls complete before they return).
Argument: the all_reduce's element count (default 65536: a started call; 1 runs inline)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import boltccl
import boltccl.torch  # noqa: F401

dist.init_process_group("boltccl")
rank = dist.get_rank()
dist.barrier()
if rank == 1:
    time.sleep(0.5)
    os._exit(0)  # gone without a word
t0 = time.time()
at, kind = "call", None
try:
    w = dist.all_reduce(torch.ones(int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 16), async_op=True)
    at = "wait"
    w.wait()
except boltccl.Error as e:
    kind = type(e).__name__ + ":" + e.kind
print("RESULT " + json.dumps({"rank": rank, "error": kind, "at": at, "seconds": time.time() - t0}), flush=True)
sys.stdout.flush()
os._exit(0)
