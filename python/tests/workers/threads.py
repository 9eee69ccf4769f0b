"""The GIL is released during a call (another thread runs), and an overlapping call on the
same group raises boltccl.Error(kind="busy") while leaving the group usable."""

import json
import threading
import time

import numpy as np

import boltccl

g = boltccl.init(timeout=30)
g.barrier()
res = {}
if g.rank == 0:
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    def overlap():
        time.sleep(0.3)  # main thread is blocked in all_sum by now
        try:
            g.all_sum(np.ones(4, dtype=np.float32))
            res["overlap"] = "no error"
        except boltccl.Error as e:
            res["overlap"] = e.kind

    threads = [threading.Thread(target=spin), threading.Thread(target=overlap)]
    for t in threads:
        t.start()
    before = ticks[0]
    x = np.ones(4, dtype=np.float32)
    g.all_sum(x)  # rank 1 joins after 1 s
    res["ticks_during_call"] = ticks[0] - before
    stop.set()
    for t in threads:
        t.join()
    res["result"] = x.tolist()
else:
    time.sleep(1.0)
    x = np.ones(4, dtype=np.float32)
    g.all_sum(x)
    res["result"] = x.tolist()
g.all_sum(np.ones(1, dtype=np.float32))  # still usable
print("RESULT " + json.dumps(res), flush=True)
