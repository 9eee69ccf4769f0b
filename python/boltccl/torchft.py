"""boltccl as torchft's reconfigurable process group.

>>> from boltccl.torchft import ProcessGroupBoltccl
>>> from torchft import Manager, DistributedDataParallel, OptimizerWrapper
>>> pg = ProcessGroupBoltccl(timeout=timedelta(seconds=30))
>>> manager = Manager(pg=pg, min_replica_size=1, load_state_dict=..., state_dict=..., ...)

torchft (https://github.com/pytorch/torchft) trains with replica groups that may die and come
back: each time its lighthouse forms a new quorum, the Manager calls ``configure(store_addr,
replica_id, rank, world_size, ...)`` on its process group with a fresh store prefix. This
group then aborts the previous boltccl group, if any, and forms a new one through that store
(``boltccl.torch.ProcessGroupBoltccl``: rank 0 puts its address and a fresh job key there), so
every quorum has its own TCP connections and shared-memory segments, made anew. A boltccl
error of a call (``boltccl.PeerLostError`` naming the rank that died, ``boltccl.TimeoutError``,
...) is kept for ``errored()``, which the Manager asks before it commits a step, and completes
the call's future with it; the call's ``wait()`` returns False rather than raise it (torchft's
way: its DistributedDataParallel cannot take a raising ``wait()``). ``abort()`` ends the
current group at once on every rank (a call blocked on any thread returns).

Modelled on torchft's ``ProcessGroupGloo`` (CPU tensors). Tested with torchft 0.2.0.
"""

from __future__ import annotations

import datetime
import time
from contextlib import contextmanager
from typing import Any, Generator, List, Optional

try:
    import torchft.process_group as _tf
except ImportError as e:  # pragma: no cover - exercised by the framework suite
    raise ImportError(
        f"boltccl.torchft needs torchft, which is not installed ({e}): pip install torchft "
        "(tested with torchft==0.2.0)"
    ) from e

import torch.distributed as dist

import boltccl
import boltccl.torch as _bt

__all__ = ["ProcessGroupBoltccl"]


class _Watched(dist.Work):
    """A call's Work that hands a boltccl error to the process group's ``errored()``.

    ``wait()`` does not raise it but returns False: torchft's Manager and DistributedDataParallel
    wait on a Work and then take its future, and a raising ``wait()`` leaves DDP's comm hook
    without one (an AssertionError in backward) instead of a step that is not committed. The
    future still completes with the error (torchft's ``wrap_future`` reports it)."""

    def __init__(self, work: dist.Work, owner: "ProcessGroupBoltccl", pg: Any):
        super().__init__()
        self._work, self._owner, self._pg = work, owner, pg

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        except boltccl.Error as e:
            self._owner._seen(self._pg, e)
            return False

    def get_future(self) -> Any:
        fut = self._work.get_future()

        def seen(f: Any) -> None:
            try:
                f.value()
            except boltccl.Error as e:
                self._owner._seen(self._pg, e)
            except Exception:  # noqa: BLE001 - torch may wrap it; the future keeps it anyway
                pass

        fut.add_done_callback(seen)
        return fut

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def result(self) -> List[Any]:
        return self._work.result()

    def synchronize(self) -> None:
        self.wait()


class ProcessGroupBoltccl(_tf.ProcessGroupWrapper):
    """torchft's reconfigurable process group over boltccl: a new boltccl group per quorum.

    Args:
        timeout: how long ``configure`` waits for the group to form (and the store to answer),
            and the bound on a collective that makes no progress (at most 30 s, as for
            ``boltccl.torch``; ``BOLTCCL_TIMEOUT_MS`` overrides it).
    """

    def __init__(self, timeout: datetime.timedelta = datetime.timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._errored: Optional[Exception] = None
        #: Seconds the last ``configure`` took (abort of the old group, store, new group).
        self.last_configure_s: Optional[float] = None

    # -- what torchft asks of a process group ------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torchft's name
        return "torchft-boltccl"

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: Optional[int] = None,
        group_rank: Optional[int] = None,
        group_world_size: Optional[int] = None,
        global_ranks: Optional[List[int]] = None,
    ) -> None:
        """Abort the current boltccl group (if any) and form a new one of `world_size` ranks
        through the store at `store_addr` (``host:port/prefix``, a new prefix every quorum).
        Blocks until every rank has joined; raises a boltccl error if they do not within the
        timeout."""
        t = time.perf_counter()
        super().configure(
            store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size, global_ranks
        )
        self.last_configure_s = time.perf_counter() - t

    def _create_pg(self, store: Any, rank: int, world_size: int) -> dist.ProcessGroup:
        self._errored = None
        pg = _bt.ProcessGroupBoltccl(store, rank, world_size, self._timeout)
        if self._group_rank is not None and self._group_world_size:
            pg._set_group_name(f"torchft_quorum_{self._quorum_id}_rank_{self._group_rank % self._group_world_size}")
        return pg

    def abort(self, errored: bool = True) -> None:
        """End the current boltccl group at once: blocked calls on every rank raise
        ``boltccl.PeerLostError`` (kind "aborted"). ``errored=True`` (an abort for a failure, not
        a reconfigure) also makes ``errored()`` report it until the next ``configure``."""
        if errored and self._pg is not None and self._errored is None:
            self._errored = boltccl.PeerLostError("the torchft process group was aborted")
            self._errored.kind = "aborted"
        super().abort(errored=errored)

    def shutdown(self) -> None:
        """Release the boltccl group (calls already started finish first)."""
        pg = self._pg
        self._pg = None
        if pg is not None:
            pg.shutdown()

    def errored(self) -> Optional[Exception]:
        """The boltccl error a call of the current group raised (or the abort), else None."""
        return self._errored

    def _seen(self, pg: Any, e: Exception) -> None:
        # Only an error of the current group counts: a late one of a group already replaced
        # must not fail the new quorum's step.
        if pg is self._pg and self._errored is None:
            self._errored = e

    @contextmanager
    def _run_context(self) -> Generator[None, None, None]:
        pg = self._pg
        try:
            yield
        except boltccl.Error as e:
            self._seen(pg, e)
            raise

    def _wrap_work(self, work: dist.Work, opts: object) -> dist.Work:
        return _Watched(work, self, self._pg)

    def allreduce(self, tensors: List[Any], opts: object) -> dist.Work:
        # torchft also passes a bare ReduceOp here.
        if isinstance(opts, dist.ReduceOp) or isinstance(opts, dist.ReduceOp.RedOpType):
            o = dist.AllreduceOptions()
            o.reduceOp = opts
            opts = o
        return super().allreduce(tensors, opts)
