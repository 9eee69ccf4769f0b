"""Rank 0 blocks in all_sum (rank 1 never joins it); the test sends SIGINT to rank 0."""

import sys
import time

import numpy as np

import boltccl

g = boltccl.init(timeout=60)
g.barrier()
if g.rank == 0:
    print("waiting", flush=True)
    t0 = time.monotonic()
    try:
        g.all_sum(np.ones(1 << 20, dtype=np.float32))
    except KeyboardInterrupt:
        print(f"KeyboardInterrupt after {time.monotonic() - t0:.2f} s", flush=True)
        try:
            g.barrier()
        except boltccl.Error as e:
            print(f"then: {type(e).__name__} kind={e.kind}", flush=True)
        sys.exit(0)
    print("all_sum returned without an interrupt", flush=True)
    sys.exit(1)
else:
    time.sleep(30)
