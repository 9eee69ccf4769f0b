"""What torch.distributed costs per call with a backend that does no work: `dist.all_reduce` of
one float through torch's own no-op C++ process group ("fake", from torch.testing), in N
processes at once (N ranks on this host's cores, as the torch bench runs them). It is
`dist.all_reduce`'s own Python, which every backend pays, plus the cheapest C++ backend torch
has: the part of the torch layer's 4-byte cost in scripts/bench/torch.sh that a backend
written in C++ would still pay.

  python torch_floor.py 1 2 4        prints the slowest process's median per world size
  python torch_floor.py --rank R N   one process (what the first form starts)
"""

import statistics
import subprocess
import sys
import time

ROUNDS, CALLS = 5, 50_000


def one(rank: int, n: int) -> float:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=n)
    t = torch.zeros(1)
    res = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            dist.all_reduce(t)
        res.append((time.perf_counter() - t0) / CALLS * 1e6)
    dist.destroy_process_group()
    return statistics.median(res)


if len(sys.argv) < 2:
    sys.exit("usage: torch_floor.py N [N ...]   (world sizes, e.g. 1 2 4)")
if sys.argv[1] == "--rank":
    print(one(int(sys.argv[2]), int(sys.argv[3])))
else:
    cells = []
    for n in (int(a) for a in sys.argv[1:]):
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(n)], stdout=subprocess.PIPE, text=True)
                 for r in range(n)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        if any(p.returncode for p in procs):
            sys.exit(f"torch_floor.py: a process at world size {n} failed")
        cells.append(f"{max(float(o) for o in outs):.1f} µs at {n} rank{'s' if n > 1 else ''}")
    print("torch's own cost of a 4-byte dist.all_reduce (its no-op C++ process group, 'fake'): " + ", ".join(cells))
