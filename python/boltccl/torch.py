"""boltccl as a torch.distributed backend.

>>> import torch.distributed as dist
>>> import boltccl.torch                       # registers the backend "boltccl"
>>> dist.init_process_group("boltccl")          # under torchrun, boltccl launch, ...
>>> dist.all_reduce(t)                          # CPU tensors, every dtype boltccl has

The process group forms a boltccl group through the store torch hands it (rank 0 puts its
address and a fresh job key there), so it works with every ``init_method``. Collectives run
zero-copy on contiguous CPU tensors (a non-contiguous one goes through a contiguous copy);
``async_op=True`` returns a Work whose ``wait()`` raises boltccl's own exceptions
(``boltccl.TimeoutError``, ``boltccl.PeerLostError``, ...), and whose ``get_future()``
completes when the call does (what DistributedDataParallel's hooks use).

Supported: all_reduce (SUM, AVG, PREMUL_SUM, MAX, MIN, PRODUCT, BAND, BOR, BXOR), all_gather,
all_gather_into_tensor, all_gather_coalesced, reduce_scatter, reduce_scatter_tensor (SUM, AVG,
PREMUL_SUM, MAX, MIN), the coalesced forms torch and FSDP2 call (allreduce_coalesced,
allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced: all_reduce,
all_gather_into_tensor and reduce_scatter_tensor inside ``dist._coalescing_manager``, one Work
for the lot), broadcast, all_to_all_single (with and without split sizes), all_to_all, gather,
scatter, reduce (any root; the ops of all_reduce), barrier, send/recv and isend/irecv (with an
explicit source), batch_isend_irecv, new_group, abort and shutdown (destroy_process_group),
sequence numbers (``_get_sequence_number_for_group``: the calls made on the group, as Gloo
counts them); DistributedDataParallel on torch 2.x. AVG and PREMUL_SUM
(``dist._make_nccl_premul_sum(factor)``, a float or a one-element tensor: each rank's input
times the factor, in its own type, then summed; the caller's input is left as NCCL leaves it)
take floating-point tensors, float16 and bfloat16 included; PRODUCT and the bitwise ops gather
every rank's tensor and combine them in rank order (see ``_LOCAL_OPS``).
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
import threading
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

import boltccl

__all__ = ["ProcessGroupBoltccl", "BACKEND"]

BACKEND = "boltccl"
#: Collectives up to this many bytes run inside the call (a latency-bound call has nothing to
#: overlap, and the hand-off to the progress thread would cost more than the call); larger
#: ones, and every send/recv, run on boltccl's progress thread while torch goes on.
INLINE_MAX_BYTES = 65536
_KEY = "boltccl/rendezvous"
_DTYPES = {
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES.add(getattr(torch, _name))


#: boltccl's element type names, for allreduce's by-address path.
_DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in _DTYPES}
_SUM, _MAX, _MIN = dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN


def _reduce_op(op: Any, dtype: torch.dtype) -> tuple:
    """(boltccl op name, divide by the size afterwards, PREMUL_SUM's factor or None)."""
    if op == dist.ReduceOp.SUM:
        return "sum", False, None
    if op == dist.ReduceOp.MAX:
        return "max", False, None
    if op == dist.ReduceOp.MIN:
        return "min", False, None
    if op == dist.ReduceOp.AVG:
        if not (dtype.is_floating_point):
            raise ValueError(f"ReduceOp.AVG needs a floating-point tensor, got {dtype}: use SUM and divide")
        return "sum", True, None
    if op == dist.ReduceOp.PREMUL_SUM:
        return "sum", False, _premul_factor(op, dtype)
    raise ValueError(
        f"the boltccl backend reduces with SUM, AVG, PREMUL_SUM, MAX and MIN here, not {getattr(op, 'op', op)} "
        "(all_reduce and reduce also take PRODUCT, BAND, BOR and BXOR)"
    )


#: Reductions boltccl has no kernel for, which all_reduce and reduce run by gathering every
#: rank's tensor and reducing them here in rank order (the size times a native call's memory
#: and traffic; the same bits on every rank).
_LOCAL_OPS = {
    dist.ReduceOp.PRODUCT: torch.Tensor.mul_,
    dist.ReduceOp.BAND: torch.Tensor.bitwise_and_,
    dist.ReduceOp.BOR: torch.Tensor.bitwise_or_,
    dist.ReduceOp.BXOR: torch.Tensor.bitwise_xor_,
}


def _local_op(op: Any, dtype: Optional[torch.dtype] = None) -> Optional[Callable]:
    """The in-place function that combines two ranks' tensors for a reduction in _LOCAL_OPS,
    else None."""
    fn = _LOCAL_OPS.get(getattr(op, "op", op))
    if fn is not None and fn is not torch.Tensor.mul_ and dtype is not None and dtype.is_floating_point:
        raise TypeError(f"{getattr(op, 'op', op)} needs an integer tensor, got {dtype}")
    return fn


def _premul_factor(op: Any, dtype: torch.dtype) -> torch.Tensor:
    """PREMUL_SUM's factor (a float or a one-element tensor, read from the ReduceOp that
    ``torch.distributed._make_nccl_premul_sum(factor)`` made) as a scalar tensor of `dtype`:
    as NCCL does, each rank's input is multiplied by the factor in the input's own type."""
    if not dtype.is_floating_point:
        raise TypeError(f"ReduceOp.PREMUL_SUM needs a floating-point tensor (as NCCL's does), got {dtype}")
    try:
        factor = op.factor
    except (AttributeError, RuntimeError):
        raise ValueError(
            "ReduceOp.PREMUL_SUM needs its factor: make the op with "
            "torch.distributed._make_nccl_premul_sum(factor), not ReduceOp.PREMUL_SUM itself"
        ) from None
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise ValueError(f"PREMUL_SUM's factor must be a number or a one-element tensor, got shape {tuple(factor.shape)}")
        return factor.detach().to(device="cpu", dtype=dtype).reshape(())
    return torch.tensor(float(factor), dtype=dtype)


def _check(t: torch.Tensor, what: str) -> None:
    if not t.is_cpu:
        raise ValueError(f"{what} is on {t.device}: the boltccl backend works on CPU tensors (move it with .cpu())")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{what} has dtype {t.dtype}: boltccl reduces float16/32/64, bfloat16 and integers")
    if t.layout != torch.strided:
        raise ValueError(f"{what} is not a strided (dense) tensor")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous, autograd-free view of t's memory, or a contiguous copy."""
    if t.requires_grad:
        t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


def _apart(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`src`, or a copy of it where it shares memory with `out`: an in-place all_gather or
    reduce_scatter (FSDP2's input is a slice of its output) hands boltccl disjoint buffers."""
    a0, b0 = src.data_ptr(), out.data_ptr()
    a1, b1 = a0 + src.numel() * src.element_size(), b0 + out.numel() * out.element_size()
    return src.clone() if a0 < b1 and b0 < a1 else src


def _adjacent(ts: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """A flat tensor over the memory of `ts` where they are contiguous pieces, one after the
    other, of one storage (``t.chunk(n)``, ``t.split(...)``), else None."""
    if not ts or any(not t.is_contiguous() or t.requires_grad for t in ts):
        return None
    first, size = ts[0], ts[0].element_size()
    at = first.data_ptr()
    for t in ts:
        if t.dtype != first.dtype or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or t.data_ptr() != at:
            return None
        at += t.numel() * size
    flat = torch.empty(0, dtype=first.dtype)
    flat.set_(first.untyped_storage(), first.storage_offset(), (sum(t.numel() for t in ts),))
    return flat


def _scatter_back(outs: Sequence[torch.Tensor], flat: torch.Tensor) -> Callable[[], None]:
    """Copy consecutive pieces of `flat` into `outs` (each its own size)."""

    def finish() -> None:
        at = 0
        with torch.no_grad():
            for o in outs:
                o.copy_(flat[at : at + o.numel()].view(o.shape))
                at += o.numel()

    return finish


class _ShutDown:
    """What a process group holds after ``shutdown()``: every call is a clear error."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"this boltccl process group was shut down (destroy_process_group): {name}() cannot run on it")

    def abort(self) -> None:
        pass


def _arr(f: torch.Tensor) -> tuple:
    """(array sharing f's memory, element type for boltccl): numpy's view where torch has one
    (the cheapest way in, about 1 us), else the tensor itself (DLPack)."""
    try:
        if f.dtype is torch.bfloat16:
            return f.view(torch.int16).numpy(), "bfloat16"
        return f.numpy(), None
    except (TypeError, RuntimeError):
        return f, None


#: torch 1.x waits on a Work from C++ too (DistributedDataParallel's set-up), where the wait()
#: of a Work written in Python is never reached and the wait never ends. There every Work is
#: handed over as one torch builds on a future, and as torch 1.x's wait() on such a Work does
#: not raise the future's error, every call completes before it returns and raises boltccl's
#: error at the call: no overlap on torch 1.x, and never a failure that wait() hides.
_WORK_FROM_FUTURE = int(torch.__version__.split(".")[0]) < 2


def _handed(work: "_Work") -> dist.Work:
    """What a call returns to torch: `work` itself, or on torch 1.x (see `_WORK_FROM_FUTURE`)
    a Work built on its future once it has completed (its error raised here, at the call)."""
    if _WORK_FROM_FUTURE:
        work.wait()
        return torch._C._distributed_c10d._create_work_from_future(work.get_future())
    return work


class _Work(dist.Work):
    """Calls in flight; ``finish`` runs once after all of them (copy-backs, AVG's division)."""

    # A Work for calls that completed at the call (the common small call) sets only its result
    # and error: each attribute set costs a Python call's budget here.
    _works: Sequence[Any] = ()
    _finish: Optional[Callable[[], None]] = None
    _future: Optional[torch.futures.Future] = None
    _future_owed = False  # a future was handed out and not yet settled
    _done = True

    def __init__(
        self,
        works: Sequence[Any],
        result: List[torch.Tensor],
        finish: Optional[Callable[[], None]] = None,
        error: Optional[BaseException] = None,
    ):
        super().__init__()
        self._result = result
        self._error: Optional[BaseException] = error
        if works:
            self._works, self._finish, self._done = works, finish, False
            # The progress thread's completion function and wait() may both finish the Work.
            self._lock = threading.Lock()
            # The last call finishes after the others (calls complete in the order started).
            works[-1].add_done_callback(self._complete)
        elif finish is not None:
            self._finish = finish
            self._run_finish()

    def _complete(self) -> None:
        # Runs on boltccl's progress thread (with the GIL), or from wait(); once.
        with self._lock:
            if not self._done:
                self._run_finish()
            fut, self._future_owed = (self._future, False) if self._future_owed else (None, False)
        if fut is not None:
            self._settle(fut)

    def _run_finish(self) -> None:
        for w in self._works:
            try:
                w.test()
            except BaseException as e:  # noqa: BLE001 - handed to wait() and the future
                self._error = e
                break
        if self._error is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as e:  # noqa: BLE001
                self._error = e
        self._done = True

    def _settle(self, fut: torch.futures.Future) -> None:
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._result)

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        t = None if timeout is None or timeout == datetime.timedelta(0) else timeout.total_seconds()
        for w in self._works:
            try:
                w.wait(t)
            except BaseException as e:
                self._error = self._error or e
                break
        if not self._done:
            self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> Any:
        return self._error

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            fut = torch.futures.Future()
            if self._works:
                with self._lock:
                    self._future = fut
                    done = self._done
                    self._future_owed = not done
            else:
                self._future, done = fut, True
            if done:
                self._settle(fut)
        return self._future

    def synchronize(self) -> None:
        self.wait()


class _Done(dist.Work):
    """A call that succeeded before it returned: the small all_reduce's Work. It has no
    ``__init__`` of its own, as a Python one costs the call a third of a microsecond."""

    _result: List[torch.Tensor] = []

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def result(self) -> List[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def synchronize(self) -> None:
        pass


class _Later(dist.Work):
    """A send or recv kept for the end of a coalescing window: its Work once started."""

    def __init__(self, result: List[torch.Tensor]):
        super().__init__()
        self._result = result
        self._work: Optional[dist.Work] = None

    def _started(self) -> dist.Work:
        if self._work is None:
            raise RuntimeError("this send/recv starts when its coalescing window ends (batch_isend_irecv): wait on the Work that returns")
        return self._work

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        return self._started().wait() if timeout is None else self._started().wait(timeout)

    def is_completed(self) -> bool:
        return self._work is not None and self._work.is_completed()

    def is_success(self) -> bool:
        return self._work is not None and self._work.is_success()

    def exception(self) -> Any:
        return None if self._work is None else self._work.exception()

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        return self._started().get_future()

    def synchronize(self) -> None:
        self.wait()


class _All(dist.Work):
    """Several Works as one (what a coalescing window's end returns)."""

    def __init__(self, works: List[dist.Work]):
        super().__init__()
        self._works = works

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        for w in self._works:
            w.wait() if timeout is None else w.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def exception(self) -> Any:
        return next((e for e in (w.exception() for w in self._works) if e is not None), None)

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return [t for w in self._works for t in w.result()]

    def get_future(self) -> torch.futures.Future:
        futs = [w.get_future() for w in self._works]
        return torch.futures.collect_all(futs).then(lambda f: [t for x in f.value() for t in x.value()])

    def synchronize(self) -> None:
        self.wait()


def _done(result: List[torch.Tensor]) -> dist.Work:
    w = _Done()
    w._result = result
    return _handed(w) if _WORK_FROM_FUTURE else w


def _local_ip(store: Any) -> str:
    """An address of this host that the other ranks can reach: the one that reaches torch's
    store (MASTER_ADDR), else the host name's, else loopback."""
    host = os.environ.get("MASTER_ADDR")
    inner = store
    for _ in range(8):
        if isinstance(inner, dist.TCPStore):
            host = inner.host
            break
        nxt = getattr(inner, "underlying_store", None)
        if nxt is None:
            break
        inner = nxt
    if not host:
        return "127.0.0.1"
    try:
        target = socket.getaddrinfo(host, 1, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
        if target.startswith("127."):
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 1))  # no packet is sent: this picks the route's source address
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class ProcessGroupBoltccl(dist.ProcessGroup):
    """A torch.distributed process group over a boltccl group (see the module docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._seq = 0  # collectives called on this group (_get_sequence_number_for_group)
        seconds = max(1.0, timeout.total_seconds())
        if rank == 0:
            ip = _local_ip(store)
            rendezvous = f"{ip}:{boltccl._native.free_coordinator_port(ip)} {secrets.token_hex(16)}"
            store.set(_KEY, rendezvous)
        else:
            rendezvous = store.get(_KEY).decode()
        coordinator, key = rendezvous.split(" ", 1)
        kw = {}
        if not os.environ.get("BOLTCCL_TIMEOUT_MS"):
            # torch's default (30 min) is a completion limit; boltccl's is since the last
            # progress, so a stall is reported sooner.
            kw["timeout"] = min(seconds, 30.0)
        self._g = boltccl.init(
            rank=rank, world_size=size, coordinator=coordinator, job_key=key, init_timeout=seconds, **kw
        )

    def _start(self, calls: List[Callable[[bool], Any]], nbytes: int, result: List[torch.Tensor], finish=None, inline=None) -> dist.Work:
        """Run `calls` (each `call(async_op)`): inline when small, else started. A boltccl error
        of an inline call is kept for wait(), as a started call's would be."""
        if inline is None:
            inline = nbytes <= INLINE_MAX_BYTES
        if not inline:
            work = _handed(_Work([c(True) for c in calls], result, finish))
        else:
            work = None
            for c in calls:
                try:
                    c(False)
                except boltccl.Error as e:
                    work = _handed(_Work([], result, None, error=e))
                    break
            if work is None:
                work = _handed(_Work([], result, finish))
        if self._batch is not None:  # inside a coalescing window: the window's Work waits for it
            self._batch_works.append(work)
        return work

    # -- what torch asks of a process group -------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # torch keeps a group's name and description in the C++ backends a ProcessGroup registers;
    # a group written in Python registers none, so torch's own accessors fail ("ProcessGroup
    # name not set") and DeviceMesh (FSDP2, DTensor) cannot start. The group keeps them here.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_group_desc", "")

    # torch.distributed asks a group for its C++ backend of a device (batch_isend_irecv, and
    # new_group whether it can split the default group); one written in Python registers
    # none, so the call failed ("No backend type associated with device type cpu"). The group
    # is its own backend for every device, one that neither coalesces nor splits.
    supports_coalescing = True  # batch_isend_irecv: see _start_coalescing
    supports_splitting = False  # new_group forms a fresh boltccl group

    def _get_backend(self, device: Any = None) -> "ProcessGroupBoltccl":
        return self

    def size(self) -> int:
        return self._size

    # Sequence numbers, as Gloo's: every rank counts the calls it makes on the group from 0 (a
    # collective on every rank, a send or recv on the two ranks it joins), so the ranks agree
    # between collectives.
    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    def _set_sequence_number_for_group(self) -> None:
        """Nothing to do: as Gloo's since torch 2.15, the numbers start at 0 on every rank."""

    def rank(self) -> int:
        return self._rank

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        # The common small call (one dense, contiguous CPU tensor; SUM, MAX or MIN) runs by
        # address: under torch.distributed a 4-byte all_reduce has a few microseconds of Python
        # to spend, and the general path's array view and closures take about ten.
        self._seq += 1
        t = tensors[0] if len(tensors) == 1 else None
        if t is not None and t.is_cpu and t.layout is torch.strided and t.is_contiguous():
            n = t.numel()
            name = _DTYPE_NAMES.get(t.dtype) if n * t.element_size() <= INLINE_MAX_BYTES else None
            r = _SUM if opts is None else opts.reduceOp
            op = "sum" if r == _SUM else "max" if r == _MAX else "min" if r == _MIN else None
            if name is not None and op is not None:
                try:
                    self._g._all_reduce_at(t.data_ptr(), n, name, op)
                except boltccl.Error as e:
                    return _handed(_Work((), tensors, None, error=e))
                return _done(tensors)
        opts = opts if opts is not None else dist.AllreduceOptions()
        if _local_op(opts.reduceOp) is not None:
            return self._reduce_gathered(tensors, opts.reduceOp, None)
        calls, copies, divide, nbytes = [], [], False, 0
        for i, t in enumerate(tensors):
            _check(t, f"tensors[{i}]")
            name, divide, factor = _reduce_op(opts.reduceOp, t.dtype)
            f = _flat(t)
            if factor is not None:
                f.mul_(factor)  # the tensor is the output too (NCCL's in-place all_reduce)
            copies.append((t, f))
            nbytes += f.numel() * f.element_size()
            arr, dt = _arr(f)
            calls.append(lambda a, arr=arr, dt=dt, fn=getattr(self._g, f"all_{name}"): fn(arr, dtype=dt, async_op=a))
        return self._start(calls, nbytes, list(tensors), self._finisher(copies, divide))

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
        return self.allreduce(tensors, o)  # one collective: allreduce counts it

    def _finisher(self, copies: list, divide: bool) -> Optional[Callable[[], None]]:
        back = [(t, f) for t, f in copies if f is not t and (f.data_ptr() != t.data_ptr() or f.stride() != t.stride())]
        if not back and not divide:
            return None

        def finish() -> None:
            for t, f in copies:
                if divide:
                    f.div_(self._size)
            with torch.no_grad():
                for t, f in back:
                    t.copy_(f)

        return finish

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        self._seq += 1
        root = opts.rootRank if opts is not None else 0
        calls, copies, nbytes = [], [], 0
        for i, t in enumerate(tensors):
            _check(t, f"tensors[{i}]")
            f = _flat(t)
            copies.append((t, f))
            nbytes += f.numel() * f.element_size()
            arr, dt = _arr(f)
            calls.append(lambda a, arr=arr, dt=dt: self._g.broadcast(arr, root=root, dtype=dt, async_op=a))
        return self._start(calls, nbytes, list(tensors), self._finisher(copies, False))

    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> dist.Work:
        self._seq += 1
        calls, finishers, nbytes = [], [], 0
        for outs, t in zip(output_lists, inputs):
            _check(t, "input")
            if len(outs) != self._size:
                raise ValueError(f"all_gather needs {self._size} output tensors, got {len(outs)}")
            flat = torch.empty((self._size * t.numel(),), dtype=t.dtype)
            src = _flat(t).reshape(-1)
            nbytes += flat.numel() * flat.element_size()
            calls.append(lambda a, src=src, flat=flat: self._g.all_gather(src, out=flat, async_op=a))
            finishers.append((outs, flat, t.numel()))

        def finish() -> None:
            with torch.no_grad():
                for outs, flat, n in finishers:
                    for r, o in enumerate(outs):
                        o.copy_(flat[r * n : (r + 1) * n].view(o.shape))

        return self._start(calls, nbytes, [o for outs in output_lists for o in outs], finish)

    def _pairs(self, what: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> List[tuple]:
        """(output, input) pairs of a coalesced call, whose lists must have one length."""
        if len(outputs) != len(inputs):
            raise ValueError(f"{what}: {len(inputs)} input tensors and {len(outputs)} output tensors: pass one output for each input")
        return list(zip(outputs, inputs))

    def _start_parts(self, parts: List[tuple], outputs: List[torch.Tensor]) -> dist.Work:
        """Start the calls of a (coalesced) all_gather_into_tensor or reduce_scatter_tensor:
        `parts` as `_gather_into` and `_scatter_from` make them, one per (output, input) pair."""
        copies, divide = [p[2] for p in parts], any(p[3] for p in parts)
        return self._start([p[0] for p in parts], sum(p[1] for p in parts), list(outputs), self._finisher(copies, divide))

    def _gather_into(self, output: torch.Tensor, input: torch.Tensor, what: str) -> tuple:  # noqa: A002
        """all_gather_into_tensor of one pair: (call, bytes, (output, its flat buffer), divide:
        never)."""
        _check(input, f"{what} input")
        _check(output, f"{what} output")
        if output.dtype != input.dtype or output.numel() != self._size * input.numel():
            raise ValueError(
                f"{what}: the output ({output.dtype} x {output.numel()}) must have the input's dtype and "
                f"{self._size} (the ranks) times its elements ({input.dtype} x {input.numel()})"
            )
        out = _flat(output)
        src = _apart(_flat(input).reshape(-1), out)
        call = lambda a: self._g.all_gather(src, out=out.reshape(-1), async_op=a)  # noqa: E731
        return call, out.numel() * out.element_size(), (output, out), False

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        self._seq += 1
        return self._start_parts([self._gather_into(output, input, "all_gather_into_tensor")], [output])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        return self._allgather_base(output, input, opts)

    def allgather_into_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """all_gather_into_tensor of each (output, input) pair, as one call (one Work, one
        collective in the sequence numbers): what all_gather_into_tensor inside
        ``dist._coalescing_manager`` and FSDP2 issue."""
        parts = [self._gather_into(o, i, f"all_gather_into_tensor[{k}]") for k, (o, i) in enumerate(self._pairs("allgather_into_tensor_coalesced", outputs, inputs))]
        self._seq += 1
        return self._start_parts(parts, outputs)

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> dist.Work:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """all_gather_coalesced: output_lists[r][i] gets rank r's inputs[i]."""
        if len(output_lists) != self._size or any(len(outs) != len(inputs) for outs in output_lists):
            raise ValueError(f"all_gather_coalesced needs {self._size} (the ranks) output lists of {len(inputs)} tensors (one per input)")
        return self.allgather([[outs[i] for outs in output_lists] for i in range(len(inputs))], inputs, opts)

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None) -> dist.Work:
        self._seq += 1
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        calls, copies, divide, nbytes = [], [], False, 0
        for out, ins in zip(outputs, input_lists):
            _check(out, "output")
            if len(ins) != self._size:
                raise ValueError(f"reduce_scatter needs {self._size} input tensors, got {len(ins)}")
            name, divide, factor = _reduce_op(reduce_op, out.dtype)
            flat_in = torch.cat([i.detach().reshape(-1) for i in ins])
            if factor is not None:
                flat_in.mul_(factor)  # a copy: the inputs are left as they were
            f = _flat(out)
            copies.append((out, f))
            nbytes += flat_in.numel() * flat_in.element_size()
            calls.append(lambda a, i=flat_in, f=f, name=name: self._g.reduce_scatter(i, out=f.reshape(-1), op=name, async_op=a))
        return self._start(calls, nbytes, list(outputs), self._finisher(copies, divide))

    def _scatter_from(self, output: torch.Tensor, input: torch.Tensor, reduce_op: Any, what: str) -> tuple:  # noqa: A002
        """reduce_scatter_tensor of one pair: (call, bytes, (output, its flat buffer), divide)."""
        _check(input, f"{what} input")
        _check(output, f"{what} output")
        if output.dtype != input.dtype or input.numel() != self._size * output.numel():
            raise ValueError(
                f"{what}: the input ({input.dtype} x {input.numel()}) must have the output's dtype and "
                f"{self._size} (the ranks) times its elements ({output.dtype} x {output.numel()})"
            )
        name, divide, factor = _reduce_op(reduce_op, output.dtype)
        f = _flat(output)
        src = _flat(input).reshape(-1)
        # PREMUL_SUM scales a copy (the caller's input is left as it was), else the input
        # itself, apart from the output.
        src = src * factor if factor is not None else _apart(src, f)
        call = lambda a: self._g.reduce_scatter(src, out=f.reshape(-1), op=name, async_op=a)  # noqa: E731
        return call, src.numel() * src.element_size(), (output, f), divide

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        self._seq += 1
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._start_parts([self._scatter_from(output, input, reduce_op, "reduce_scatter_tensor")], [output])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """reduce_scatter_tensor of each (output, input) pair with one op, as one call (one
        Work, one collective in the sequence numbers)."""
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        pairs = self._pairs("reduce_scatter_tensor_coalesced", outputs, inputs)
        parts = [self._scatter_from(o, i, reduce_op, f"reduce_scatter_tensor[{k}]") for k, (o, i) in enumerate(pairs)]
        self._seq += 1
        return self._start_parts(parts, outputs)

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> dist.Work:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    # -- all-to-all, gather, scatter, reduce ---------------------------------------------------

    def _counts(self, t: torch.Tensor, splits: Sequence[int], what: str) -> Optional[List[int]]:
        """Element counts per rank of `t` split along dim 0 by `splits` (torch's split sizes,
        in rows); None where `splits` is empty (equal parts)."""
        if not splits:
            return None
        if len(splits) != self._size:
            raise ValueError(f"all_to_all_single: {what} has {len(splits)} entries, the group has {self._size} ranks")
        rows = t.shape[0] if t.dim() > 0 else 1
        if sum(splits) != rows or any(s < 0 for s in splits):
            raise ValueError(f"all_to_all_single: {what} {list(splits)} must be >= 0 and sum to {what.split('_')[0]}.size(0) = {rows}")
        row = t.numel() // rows if rows else 0
        return [int(s) * row for s in splits]

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> dist.Work:
        """all_to_all_single: input's part q (equal parts, or `input_split_sizes` rows) to rank
        q; output gets rank q's part for this rank in rank order, zero-copy on contiguous
        tensors."""
        self._seq += 1
        _check(input, "input")
        _check(output, "output")
        if input.dtype != output.dtype:
            raise TypeError(f"all_to_all_single: input is {input.dtype} and output {output.dtype}: they must match")
        send = self._counts(input, input_split_sizes, "input_split_sizes")
        recv = self._counts(output, output_split_sizes, "output_split_sizes")
        out = _flat(output)
        src = _apart(_flat(input).reshape(-1), out)
        arr, dt = _arr(src)
        oarr, _ = _arr(out.reshape(-1))
        if send is None and recv is None:
            if src.numel() % self._size or out.numel() != src.numel():
                raise ValueError(
                    f"all_to_all_single without split sizes needs input and output of the same size, a multiple of "
                    f"{self._size} (the ranks), got {src.numel()} and {out.numel()} elements: pass split sizes"
                )
            call = lambda a: self._g.all_to_all(arr, out=oarr, dtype=dt, async_op=a)  # noqa: E731
        else:
            for name, t, c in (("input", src, send), ("output", out, recv)):
                if c is None and t.numel() % self._size:
                    raise ValueError(f"all_to_all_single: {name} ({t.numel()} elements) does not split into {self._size} equal parts: pass {name}_split_sizes")
            send = send if send is not None else [src.numel() // self._size] * self._size
            recv = recv if recv is not None else [out.numel() // self._size] * self._size
            call = lambda a: self._g.all_to_all_v(arr, send, oarr, recv, dtype=dt, async_op=a)  # noqa: E731
        nbytes = (src.numel() + out.numel()) * out.element_size() // 2
        return self._start([call], nbytes, [output], self._finisher([(output, out)], False))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """all_to_all: input_tensors[q] to rank q, output_tensors[q] from rank q (sizes may differ
        per rank). Zero-copy where each list is adjacent pieces of one tensor (``t.chunk(n)``),
        else through one staging buffer each way."""
        self._seq += 1
        n = self._size
        for what, ts in (("input_tensors", input_tensors), ("output_tensors", output_tensors)):
            if len(ts) != n:
                raise ValueError(f"all_to_all: {what} has {len(ts)} tensors, the group has {n} ranks")
            for i, t in enumerate(ts):
                _check(t, f"{what}[{i}]")
        dtypes = {t.dtype for t in (*input_tensors, *output_tensors)}
        if len(dtypes) != 1:
            raise TypeError(f"all_to_all: every tensor must have one dtype, got {sorted(map(str, dtypes))}")
        send = [t.numel() for t in input_tensors]
        recv = [t.numel() for t in output_tensors]
        src = _adjacent(input_tensors)
        if src is None:
            src = torch.cat([t.detach().reshape(-1) for t in input_tensors]) if sum(send) else torch.empty(0, dtype=input_tensors[0].dtype)
        out = _adjacent(output_tensors)
        copy_out = out is None
        if copy_out:
            out = torch.empty(sum(recv), dtype=output_tensors[0].dtype)
        src = _apart(src, out)
        arr, dt = _arr(src)
        oarr, _ = _arr(out)
        if len(set(send)) == 1 and send == recv:
            call = lambda a: self._g.all_to_all(arr, out=oarr, dtype=dt, async_op=a)  # noqa: E731
        else:
            call = lambda a: self._g.all_to_all_v(arr, send, oarr, recv, dtype=dt, async_op=a)  # noqa: E731
        return self._start([call], out.numel() * out.element_size(), list(output_tensors), _scatter_back(output_tensors, out) if copy_out else None)

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """gather: the root's list gets every rank's tensor (zero-copy where the list is adjacent
        pieces of one tensor)."""
        self._seq += 1
        root = opts.rootRank if opts is not None else 0
        if len(input_tensors) != 1:
            raise ValueError(f"gather takes one input tensor, got {len(input_tensors)}")
        t = input_tensors[0]
        _check(t, "input")
        src = _flat(t).reshape(-1)
        if self._rank != root:
            arr, dt = _arr(src)
            call = lambda a: self._g.gather(arr, root, dtype=dt, async_op=a)  # noqa: E731
            return self._start([call], src.numel() * src.element_size(), [])
        outs = output_tensors[0] if output_tensors else []
        if len(outs) != self._size:
            raise ValueError(f"gather needs {self._size} output tensors on the root, got {len(outs)}")
        for i, o in enumerate(outs):
            _check(o, f"gather_list[{i}]")
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError(f"gather_list[{i}] is {o.dtype} x {o.numel()}, the input {t.dtype} x {t.numel()}: they must match")
        out = _adjacent(outs)
        copy_out = out is None
        if copy_out:
            out = torch.empty(self._size * t.numel(), dtype=t.dtype)
        src = _apart(src, out)
        arr, dt = _arr(src)
        oarr, _ = _arr(out)
        call = lambda a: self._g.gather(arr, root, out=oarr, dtype=dt, async_op=a)  # noqa: E731
        return self._start([call], out.numel() * out.element_size(), list(outs), _scatter_back(outs, out) if copy_out else None)

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None) -> dist.Work:
        """scatter: rank q's tensor gets the root's list[q] (zero-copy where the list is adjacent
        pieces of one tensor)."""
        self._seq += 1
        root = opts.rootRank if opts is not None else 0
        if len(output_tensors) != 1:
            raise ValueError(f"scatter takes one output tensor, got {len(output_tensors)}")
        t = output_tensors[0]
        _check(t, "output")
        f = _flat(t)
        oarr, dt = _arr(f.reshape(-1))
        finish = self._finisher([(t, f)], False)
        if self._rank != root:
            call = lambda a: self._g.scatter(oarr, None, root, dtype=dt, async_op=a)  # noqa: E731
            return self._start([call], f.numel() * f.element_size(), [t], finish)
        ins = input_tensors[0] if input_tensors else []
        if len(ins) != self._size:
            raise ValueError(f"scatter needs {self._size} input tensors on the root, got {len(ins)}")
        for i, x in enumerate(ins):
            _check(x, f"scatter_list[{i}]")
            if x.numel() != t.numel() or x.dtype != t.dtype:
                raise ValueError(f"scatter_list[{i}] is {x.dtype} x {x.numel()}, the output {t.dtype} x {t.numel()}: they must match")
        src = _adjacent(ins)
        if src is None:
            src = torch.cat([x.detach().reshape(-1) for x in ins])
        src = _apart(src, f)
        arr, _ = _arr(src)
        call = lambda a: self._g.scatter(oarr, arr, root, dtype=dt, async_op=a)  # noqa: E731
        return self._start([call], src.numel() * src.element_size(), [t], finish)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """reduce: the root's tensor gets every rank's reduced with SUM, AVG or PREMUL_SUM
        (floating point), MAX or MIN, the bits all_reduce gives; the other ranks' tensors are
        left as they were."""
        self._seq += 1
        root = opts.rootRank if opts is not None else 0
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if len(tensors) != 1:
            raise ValueError(f"reduce takes one tensor, got {len(tensors)}")
        if _local_op(reduce_op) is not None:
            return self._reduce_gathered(tensors, reduce_op, root)
        t = tensors[0]
        _check(t, "tensor")
        name, divide, factor = _reduce_op(reduce_op, t.dtype)
        f = _flat(t)
        if factor is not None:
            # The root's tensor is the output; another rank's is left as it was (NCCL's reduce).
            f = f.mul_(factor) if self._rank == root else f * factor
        arr, dt = _arr(f)
        call = lambda a: self._g.reduce(arr, root, dtype=dt, op=name, async_op=a)  # noqa: E731
        finish = self._finisher([(t, f)], divide) if self._rank == root else None
        return self._start([call], f.numel() * f.element_size(), [t], finish)

    def _reduce_gathered(self, tensors: List[torch.Tensor], op: Any, root: Optional[int]) -> dist.Work:
        """all_reduce (root None) or reduce with a reduction in _LOCAL_OPS: every rank's tensor
        gathered, then combined here in rank order (on the root only, for reduce)."""
        calls, outs, nbytes = [], [], 0
        for i, t in enumerate(tensors):
            _check(t, f"tensors[{i}]")
            fn = _local_op(op, t.dtype)
            src = _flat(t).reshape(-1)
            g = torch.empty((self._size, src.numel()), dtype=t.dtype)
            nbytes += g.numel() * g.element_size()
            calls.append(lambda a, src=src, g=g: self._g.all_gather(src, out=g.reshape(-1), async_op=a))
            outs.append((t, g, fn))

        def finish() -> None:
            if root is not None and root != self._rank:
                return
            with torch.no_grad():
                for t, g, fn in outs:
                    acc = g[0].clone()
                    for r in range(1, self._size):
                        fn(acc, g[r])
                    t.copy_(acc.view(t.shape))

        return self._start(calls, nbytes, list(tensors), finish)

    # -- failure handling -----------------------------------------------------------------------

    def abort(self) -> None:
        """Abort the boltccl group (``torch.distributed``'s abort path): a call blocked on any
        thread raises ``boltccl.PeerLostError`` (kind "aborted") at once, and every other rank
        learns within moments. Never blocks."""
        g = getattr(self, "_g", None)
        if g is not None:
            g.abort()

    def shutdown(self) -> None:
        """Release the boltccl group (``destroy_process_group``): calls started before finish
        first; a later call on this group is a RuntimeError."""
        self._g = _ShutDown()

    def barrier(self, opts: Any = None) -> dist.Work:
        self._seq += 1
        return self._start([lambda a: self._g.barrier(async_op=a)], 0, [])

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        self._seq += 1
        if self._batch is not None:
            return self._defer("send", tensors, dst)
        return self._send(tensors, dst)

    def _send(self, tensors: List[torch.Tensor], dst: int) -> dist.Work:
        works = []
        for t in tensors:
            _check(t, "tensor")
            works.append(self._g.send(_flat(t), dst, async_op=True))
        return _handed(_Work(works, list(tensors)))

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        self._seq += 1
        if self._batch is not None:
            return self._defer("recv", tensors, src)
        return self._recv(tensors, src)

    def _recv(self, tensors: List[torch.Tensor], src: int) -> dist.Work:
        works, copies = [], []
        for t in tensors:
            _check(t, "tensor")
            f = _flat(t)
            copies.append((t, f))
            works.append(self._g.recv(f, src, async_op=True))
        return _handed(_Work(works, list(tensors), self._finisher(copies, False)))

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> dist.Work:
        raise ValueError("the boltccl backend receives from a named rank only: pass src= to recv/irecv")

    # -- batch_isend_irecv -------------------------------------------------------------------------
    # The calls on a boltccl group run one after another in the order started, so the usual
    # batch (each rank posts its irecv, then its isend) would wait forever on every rank. Inside
    # torch's coalescing window (batch_isend_irecv) the sends and recvs are kept, and started at
    # its end in an order that cannot wait forever: by rank pair (lowest first, the same order on
    # both ranks of a pair), the lower rank of a pair sending first and the higher receiving
    # first, each peer's sends and recvs in the order given.

    _batch: Optional[list] = None

    def _start_coalescing(self, device: Any = None) -> None:
        self._batch, self._batch_works = [], []

    def _defer(self, kind: str, tensors: List[torch.Tensor], peer: int) -> dist.Work:
        for t in tensors:
            _check(t, "tensor")
        later = _Later(list(tensors))
        self._batch.append((kind, list(tensors), peer, later))
        return later

    def _end_coalescing(self, device: Any = None) -> dist.Work:
        batch, self._batch = self._batch or [], None
        me = self._rank

        def order(op: tuple) -> tuple:
            kind, _, peer, _ = op
            return (min(me, peer), max(me, peer), 0 if (kind == "send") == (me < peer) else 1)

        # The window's Work also waits for the collectives started in it (calls complete in
        # the order started: they come first).
        works, self._batch_works = getattr(self, "_batch_works", []), []
        for kind, tensors, peer, later in sorted(batch, key=order):
            later._work = self._send(tensors, peer) if kind == "send" else self._recv(tensors, peer)
            works.append(later._work)
        return _All(works)


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupBoltccl:
    return ProcessGroupBoltccl(store, rank, size, timeout)


def _env_from_boltccl_launch() -> None:
    """Under `boltccl launch` (which sets BOLTCCL_* but not torch's variables), give
    ``init_process_group``'s default ``env://`` what it reads: RANK, WORLD_SIZE, and torch's
    store on rank 0's host at a port derived from the job key (never the coordinator's)."""
    env = os.environ
    if env.get("MASTER_ADDR") or not all(env.get(k) for k in ("BOLTCCL_RANK", "BOLTCCL_WORLD_SIZE", "BOLTCCL_COORDINATOR")):
        return
    host, _, port = env["BOLTCCL_COORDINATOR"].rpartition(":")
    # The library's own derivation (in its port range, never the coordinator's port).
    avoid = [int(port)] if port.isdigit() else []
    store_port = boltccl._native.derived_port("torch-store:" + env.get("BOLTCCL_JOB_KEY", ""), avoid)
    env.setdefault("RANK", env["BOLTCCL_RANK"])
    env.setdefault("WORLD_SIZE", env["BOLTCCL_WORLD_SIZE"])
    env["MASTER_ADDR"] = host.strip("[]")
    env.setdefault("MASTER_PORT", str(store_port))


_env_from_boltccl_launch()


if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    try:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    except TypeError:  # torch 1.x: no device list (every backend may take CPU tensors)
        dist.Backend.register_backend(BACKEND, _create)
