"""boltccl.torchft.ProcessGroupBoltccl by itself, in one process, as torchft's Manager drives
it: configure per quorum (a one-rank group works; a two-rank group whose peer never comes, or
whose store never gets rank 0's address, is reported by errored(), not raised, and calls fail
quietly; the next configure recovers),
abort(), a bare ReduceOp, and the ImportError without torchft. Prints `RESULT {...}`."""

import importlib.abc
import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


class _NoTorchft(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchft" or name.startswith("torchft."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None


sys.meta_path.insert(0, _NoTorchft())
try:
    import boltccl.torchft  # noqa: F401
except ImportError as e:
    missing = str(e)
else:
    missing = "imported without torchft"
sys.meta_path.pop(0)
sys.modules.pop("boltccl.torchft", None)
assert "pip install torchft" in missing, missing

import boltccl  # noqa: E402
from boltccl.torchft import ProcessGroupBoltccl  # noqa: E402

store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
addr = f"localhost:{store.port}"
pg = ProcessGroupBoltccl(timeout=timedelta(seconds=2))
assert pg.getBackendName() == "torchft-boltccl"


def allreduce(op=None) -> tuple:
    t = torch.arange(4, dtype=torch.float32)
    if op is None:
        op = dist.AllreduceOptions()
        op.reduceOp = dist.ReduceOp.SUM
    w = pg.allreduce([t], op)
    ok = w.wait()
    return ok, w.get_future().value(), t.tolist()


pg.configure(f"{addr}/torchft/1/0", "0", 0, 1, quorum_id=1, group_rank=0, group_world_size=1)
assert pg.errored() is None and pg.size() == 1
ok, value, t = allreduce()
assert ok and t == [0.0, 1.0, 2.0, 3.0] and value[0].tolist() == t, (ok, value, t)

t0 = time.perf_counter()
pg.configure(f"{addr}/torchft/2/0", "0", 0, 2, quorum_id=2)  # rank 1 never comes
formed_s = time.perf_counter() - t0
err = pg.errored()
assert isinstance(err, boltccl.TimeoutError), repr(err)
assert pg.size() == 2
ok, value, t = allreduce(dist.ReduceOp.SUM)  # quietly failed: no exception, wait() False
assert ok is False and pg.errored() is err, (ok, pg.errored())

pg.configure(f"{addr}/torchft/2b/0", "1", 1, 2, quorum_id=2)  # rank 0 never puts its address
assert isinstance(pg.errored(), dist.DistError), repr(pg.errored())
ok, value, t = allreduce()
assert ok is False, ok

pg.configure(f"{addr}/torchft/3/0", "0", 0, 1, quorum_id=3)
assert pg.errored() is None
ok, value, t = allreduce(dist.ReduceOp.SUM)
assert ok and t == [0.0, 1.0, 2.0, 3.0], (ok, t)

pg.abort()
assert isinstance(pg.errored(), boltccl.PeerLostError) and pg.errored().kind == "aborted", repr(pg.errored())
ok, _, _ = allreduce()
assert ok is False

times = []
for q in range(4, 9):
    pg.configure(f"{addr}/torchft/{q}/0", "0", 0, 1, quorum_id=q)
    times.append(pg.last_configure_s)
assert pg.errored() is None and allreduce()[0]
pg.shutdown()
print(
    "RESULT "
    + json.dumps(
        {"missing": missing, "not_formed_s": round(formed_s, 2), "configure_s": min(times), "error": repr(err)[:120]}
    )
)
