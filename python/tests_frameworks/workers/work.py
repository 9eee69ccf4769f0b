"""async_op=True from Python: Works complete in order, overlap with the caller, keep their
arrays alive when dropped, run done callbacks; an error (rank 1 leaves) surfaces at wait()."""

import gc
import json
import os
import threading
import time

import numpy as np

import boltccl

g = boltccl.init()
rank, n = g.rank, g.size
out = {"rank": rank}
# Several in flight, results in order; a blocking call after them waits its turn.
xs = [np.full(1 << 18, rank + i, dtype=np.float32) for i in range(4)]
order = []
works = [g.all_sum(x, async_op=True) for x in xs]
for i, w in enumerate(works):
    w.add_done_callback(lambda i=i: order.append(i))
s = g.all_gather(np.array([rank], np.int64))
assert s.tolist() == list(range(n))
assert all(w.is_completed() for w in works), "a blocking call waits for the calls started before it"
for i, (w, x) in enumerate(zip(works, xs)):
    assert w.wait() is x and (x == sum(r + i for r in range(n))).all()
assert order == [0, 1, 2, 3], order
# A dropped Work keeps its arrays alive until the call completes.
w = g.all_sum(np.ones(1 << 20, np.float64), async_op=True)
del w
gc.collect()
x = np.ones(4)
g.all_sum(x)
assert (x == n).all()
# Overlap: rank 1 joins late; rank 0's call is in flight while it goes on.
y = np.ones(8)
if rank == 1:
    time.sleep(0.3)
w = g.all_sum(y, async_op=True)
out["pending_while_peer_absent"] = (not w.is_completed()) if rank == 0 else None
w.wait(timeout=30)
assert (y == n).all()
g.barrier()
# An error at wait(): rank 1 leaves.
if rank == 1:
    os._exit(0)
t = time.time()
w = g.all_sum(np.ones(16), async_op=True)
try:
    w.wait()
    out["error"] = None
except boltccl.PeerLostError as e:
    out["error"] = e.kind
out["error_after_s"] = round(time.time() - t, 2)
try:
    g.barrier()
    out["poisoned"] = False
except boltccl.Error as e:
    out["poisoned"] = True
print("RESULT " + json.dumps(out), flush=True)
os._exit(0)
