"""abort() and shutdown() of the boltccl torch.distributed backend, at 2 ranks (run with
BOLTCCL_TIMEOUT_MS well above the times checked, so that a deadline cannot pass for either).

  abort:    each rank blocks in a recv that the other never sends; on rank 0 another thread
            calls the group's abort(). Both calls must fail at once as aborted.
  shutdown: rank 0 calls destroy_process_group() (the group's shutdown()): a later call on the
            group is a clear RuntimeError, and rank 1, still in the group, learns that rank 0
            left at its next call, rather than at the deadline.
Prints one RESULT line per rank: the error kind and the seconds the failing call took."""

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import boltccl
import boltccl.torch  # noqa: F401

mode = sys.argv[1]
dist.init_process_group("boltccl")
rank = dist.get_rank()
pg = dist.group.WORLD
t = torch.ones(4)
dist.all_reduce(t)
assert t.tolist() == [2.0] * 4
res = {"rank": rank, "mode": mode}


def failing(call):
    """The boltccl error kind `call` raised, and how long it took."""
    t0 = time.time()
    try:
        call()
        kind = None
    except boltccl.Error as e:
        kind = type(e).__name__ + ":" + e.kind
    return kind, time.time() - t0


if mode == "abort":
    if rank == 0:
        threading.Timer(0.5, pg.abort).start()
        res["error"], res["seconds"] = failing(lambda: dist.recv(torch.empty(4), src=1))
        # Aborted: later calls fail at once too.
        res["after"], _ = failing(lambda: dist.all_reduce(torch.ones(2)))
    else:
        res["error"], res["seconds"] = failing(lambda: dist.recv(torch.empty(4), src=0))
elif mode == "shutdown":
    dist.barrier()
    if rank == 0:
        dist.destroy_process_group()
        try:
            pg.allreduce([torch.ones(2)]).wait()
            res["after"] = "ran"
        except RuntimeError as e:
            res["after"] = "shut down" if "shut down" in str(e) else str(e)
        time.sleep(3)  # alive, with the group released, while rank 1 calls
    else:
        time.sleep(0.5)
        res["error"], res["seconds"] = failing(lambda: dist.all_reduce(torch.ones(2)))
print("RESULT " + json.dumps(res), flush=True)
sys.stdout.flush()
os._exit(0)
