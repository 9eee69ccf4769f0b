"""Error mapping across ranks. argv[1] picks the scenario; prints RESULT {...} on rank 0."""

import json
import os
import subprocess
import sys
import time

import numpy as np

import boltccl

mode = sys.argv[1]
g = boltccl.init(timeout=1.5)
g.barrier()
R = g.rank
res = {}


def describe(e):
    return {
        "type": type(e).__name__,
        "module": type(e).__module__,
        "kind": getattr(e, "kind", None),
        "rank": getattr(e, "rank", None),
        "builtin_timeout": isinstance(e, TimeoutError),
        "boltccl_error": isinstance(e, boltccl.Error),
        "msg": str(e),
    }


def call_twice():
    x = np.ones(4, dtype=np.float32)
    try:
        g.all_sum(x)
        res["first"] = None
    except Exception as e:  # noqa: BLE001 - recorded for the test
        res["first"] = describe(e)
    try:
        g.all_sum(x)
        res["second"] = None
    except Exception as e:  # noqa: BLE001
        res["second"] = describe(e)


if mode == "timeout":
    if R == 0:
        call_twice()
    else:
        time.sleep(4)  # alive but silent: rank 0 must time out, not lose the peer
elif mode == "peer_lost":
    if R == 1:
        os._exit(0)  # vanish without a goodbye
    time.sleep(0.5)
    call_twice()
elif mode == "mismatch":
    try:
        g.all_sum(np.ones(4 + R, dtype=np.float32))
        res["first"] = None
    except Exception as e:  # noqa: BLE001
        res["first"] = describe(e)
    time.sleep(0.5)
elif mode in ("shrink", "abort"):
    # 3 ranks. shrink: rank 1 vanishes; abort: rank 0 aborts from a second thread while its
    # all_sum waits for the others, who start theirs after it. The survivors shrink and sum.
    import threading

    x = np.ones(1 << 16, dtype=np.float32)
    if mode == "shrink" and R == 1:
        os._exit(0)
    if mode == "abort" and R == 0:
        threading.Timer(0.3, g.abort).start()
        t = time.monotonic()
    else:
        time.sleep(1.0)
    try:
        g.all_sum(x)
        res["first"] = None
    except Exception as e:  # noqa: BLE001
        res["first"] = describe(e)
    if mode == "abort" and R == 0:
        res["aborted_after"] = time.monotonic() - t
    g2 = g.shrink()
    y = np.full(1000, g2.rank + 1, dtype=np.float32)
    g2.all_sum(y)
    res["new"] = [g2.rank, g2.size, float(y[0]), bool((y == y[0]).all())]
    try:
        g.barrier()
        res["old"] = None
    except Exception as e:  # noqa: BLE001
        res["old"] = describe(e)
    g2.barrier()
    if mode == "shrink":
        # A replacement joins as rank 2: new rank 0 picks the address, the survivors agree on
        # it through their shrunk group, and rank 0 starts the newcomer.
        port = np.array([boltccl._native.free_coordinator_port("127.0.0.1") if g2.rank == 0 else 0], dtype=np.int64)
        g2.broadcast(port, root=0)
        addr, key = f"127.0.0.1:{int(port[0])}", "generation-2"
        newcomer = None
        if g2.rank == 0:
            env = dict(os.environ, BOLTCCL_RANK="2", BOLTCCL_WORLD_SIZE="3", BOLTCCL_COORDINATOR=addr, BOLTCCL_JOB_KEY=key)
            newcomer = subprocess.Popen([sys.executable, __file__, "newcomer"], env=env, stdout=subprocess.PIPE, text=True)
        g3 = g2.grow(3, addr, key)
        g3.barrier()
        z = np.full(1000, g3.rank + 1, dtype=np.float32)
        g3.all_sum(z)
        res["grown"] = [g3.rank, g3.size, float(z[0]), bool((z == z[0]).all())]
        g3.barrier()
        if newcomer is not None:
            out = newcomer.communicate(timeout=60)[0]
            res["newcomer"] = json.loads([x for x in out.splitlines() if x.startswith("RESULT ")][-1][7:])
elif mode == "newcomer":
    # Started by a survivor of "shrink" (the barrier above is the grown group's first call).
    z = np.full(1000, R + 1, dtype=np.float32)
    g.all_sum(z)
    res["grown"] = [R, g.size, float(z[0]), bool((z == z[0]).all())]
    g.barrier()
if R == 0 or mode in ("mismatch", "shrink", "abort", "newcomer"):
    print("RESULT " + json.dumps(res), flush=True)
os._exit(0)
