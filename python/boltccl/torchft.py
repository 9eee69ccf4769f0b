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
every quorum has its own TCP connections and shared-memory segments, made anew.

A boltccl error (``boltccl.PeerLostError`` naming the rank that died, ``boltccl.TimeoutError``,
a group that did not form) is not raised to torchft but kept for ``errored()``, which the
Manager asks before it commits a step: that step is not committed, and after a failed commit
torchft forms a new quorum, so the next ``configure`` makes a new group. (torchft's
DistributedDataParallel cannot take an error mid-step: see ``_Watched``.) ``abort()`` ends the
current group at once on every rank (a call blocked on any thread returns).

Modelled on torchft's ``ProcessGroupGloo`` (CPU tensors). Tested with torchft 0.2.0.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any, List, Optional

try:
    import torchft.process_group as _tf
except ImportError as e:  # pragma: no cover - exercised by the framework suite
    raise ImportError(
        f"boltccl.torchft needs torchft, which is not installed ({e}): pip install torchft "
        "(tested with torchft==0.2.0)"
    ) from e

import torch
import torch.distributed as dist

import boltccl
import boltccl.torch as _bt

__all__ = ["ProcessGroupBoltccl"]

_log = logging.getLogger("boltccl.torchft")


class _Watched(dist.Work):
    """A call's Work whose boltccl error goes to the process group's ``errored()`` only.

    torchft's Manager decides a step by ``errored()`` (asked in ``should_commit``); an error
    that reaches it mid-step instead breaks torchft's DistributedDataParallel: a raising
    ``wait()`` leaves its comm hook without a future, and once the Manager has seen an error
    it answers the step's next bucket with a Work whose future the hook cannot take (an
    AssertionError or AttributeError in backward). So ``wait()`` returns False instead of
    raising, and the future completes with the call's tensors (not reduced): the step is not
    committed either way, and the next quorum forms a new group."""

    def __init__(self, work: dist.Work, owner: "ProcessGroupBoltccl", pg: Any):
        super().__init__()
        self._work, self._owner, self._pg = work, owner, pg
        self._future: Optional[torch.futures.Future] = None

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        except boltccl.Error as e:
            self._owner._seen(self._pg, e)
            return False

    def get_future(self) -> Any:
        if self._future is not None:
            return self._future
        out = self._future = torch.futures.Future()

        def done(f: Any) -> None:
            try:
                out.set_result(f.value())
            except boltccl.Error as e:
                self._owner._seen(self._pg, e)
                out.set_result(getattr(self._work, "_result", None))
            except Exception as e:  # noqa: BLE001 - not boltccl's: passed on
                out.set_exception(e)

        self._work.get_future().add_done_callback(done)
        return out

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def result(self) -> List[Any]:
        self.wait()
        return getattr(self._work, "_result", [])

    def synchronize(self) -> None:
        self.wait()


class _NoGroup:
    """Where a group should be but none formed (``configure`` failed) or it was aborted for
    a failure: every call raises that error (turned into a failed Work by the caller), until
    the next ``configure``; a store's error as a ``boltccl.Error`` (kind "io")."""

    def __init__(self, error: Exception, rank: int, size: int):
        if not isinstance(error, boltccl.Error):
            cause, error = error, boltccl.Error(f"this quorum's group did not form: {error}")
            error.kind, error.__cause__ = "io", cause
        self._error, self._rank, self._size = error, rank, size

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return _bt.BACKEND

    def abort(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise self._error

        return call


class ProcessGroupBoltccl(_tf.ProcessGroupWrapper):
    """torchft's reconfigurable process group over boltccl: a new boltccl group per quorum.

    Args:
        timeout: how long ``configure`` waits for the group to form (and the store to answer),
            and the bound on a collective that makes no progress (at most 30 s, as for
            ``boltccl.torch``; ``BOLTCCL_TIMEOUT_MS`` overrides it).

    boltccl's errors (of a call, or of a group that did not form) are never raised to torchft:
    ``errored()`` reports the first one until the next ``configure`` (see ``_Watched`` for
    why). Argument errors (``ValueError``, ``TypeError``) and ``boltccl.ConfigError`` are
    raised as usual.
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
        Blocks until every rank has joined. If they do not within the timeout (or the store
        does not answer), ``errored()`` says so and every call of this quorum fails quietly:
        the step is not committed, and torchft forms a new quorum after a failed commit."""
        t = time.perf_counter()
        self._errored = None
        try:
            super().configure(
                store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size, global_ranks
            )
        except (boltccl.Error, dist.DistError) as e:
            if isinstance(e, boltccl.ConfigError):
                raise
            _log.warning("boltccl.torchft: the group of quorum %s did not form: %s", quorum_id, e)
            self._errored = e
            self._pg = _NoGroup(e, rank, world_size)
        self.last_configure_s = time.perf_counter() - t

    def _create_pg(self, store: Any, rank: int, world_size: int) -> dist.ProcessGroup:
        pg = _bt.ProcessGroupBoltccl(store, rank, world_size, self._timeout)
        if self._group_rank is not None and self._group_world_size:
            pg._set_group_name(f"torchft_quorum_{self._quorum_id}_rank_{self._group_rank % self._group_world_size}")
        return pg

    def abort(self, errored: bool = True) -> None:
        """End the current boltccl group at once: blocked calls on every rank raise
        ``boltccl.PeerLostError`` (kind "aborted"). ``errored=True`` (an abort for a failure, not
        the one before a reconfigure) also makes ``errored()`` report it, and the calls until
        the next ``configure`` fail quietly."""
        pg = self._pg
        super().abort(errored=errored)
        if errored and pg is not None:
            if self._errored is None:
                self._errored = boltccl.PeerLostError("the torchft process group was aborted")
                self._errored.kind = "aborted"
            self._pg = _NoGroup(self._errored, pg.rank(), pg.size())

    def shutdown(self) -> None:
        """Release the boltccl group (calls already started finish first)."""
        pg = self._pg
        self._pg = None
        if pg is not None:
            pg.shutdown()

    def errored(self) -> Optional[Exception]:
        """The first boltccl error of the current quorum's group (a call's, the group's that
        did not form, or the abort), else None."""
        return self._errored

    def _seen(self, pg: Any, e: Exception) -> None:
        # Only an error of the current group counts: a late one of a group already replaced
        # must not fail the new quorum's step.
        if pg is self._pg and self._errored is None:
            _log.warning("boltccl.torchft: %s", e)
            self._errored = e

    def _wrap_work(self, work: dist.Work, opts: object) -> dist.Work:
        return _Watched(work, self, self._pg)


def _quiet(name: str) -> Any:
    """torchft's wrapper method `name`, with a boltccl error at the call (a group already
    broken, or none formed) turned into a failed Work as ``_Watched`` treats it."""
    base = getattr(_tf.ProcessGroupWrapper, name)

    def method(self: ProcessGroupBoltccl, *args: Any) -> dist.Work:
        if name == "allreduce" and len(args) > 1 and isinstance(args[1], dist.ReduceOp.RedOpType):
            o = dist.AllreduceOptions()  # torchft also passes a bare ReduceOp
            o.reduceOp = args[1]
            args = (args[0], o)
        pg = self._pg
        try:
            return base(self, *args)
        except boltccl.Error as e:
            if isinstance(e, boltccl.ConfigError):
                raise
            self._seen(pg, e)
            return _Watched(_bt._Work([], [], None, error=e), self, pg)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = base.__doc__
    return method


for _name in (
    "allgather",
    "allgather_into_tensor_coalesced",
    "allreduce",
    "allreduce_coalesced",
    "alltoall_base",
    "barrier",
    "broadcast",
    "recv",
    "reduce_scatter",
    "reduce_scatter_tensor_coalesced",
    "send",
):
    setattr(ProcessGroupBoltccl, _name, _quiet(_name))
