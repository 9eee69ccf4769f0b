"""Type stubs for the compiled module ``boltccl._native`` (re-exported by ``boltccl``)."""

from typing import Any, List, Optional, Sequence, Tuple, TypeVar, Union

__version__: str
DTYPES: List[str]

# Any writable C-contiguous buffer-protocol object: numpy.ndarray, memoryview, array.array,
# bytearray, ...
Buffer = Any
B = TypeVar("B")
DTypeLike = Union[str, Any, None]

class Work:
    """A call started with ``async_op=True``. It keeps the call's arrays alive until the call
    completes (dropping the Work early is safe); calls on one group complete in the order
    they were started."""

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait (GIL released) and return the call's result buffer; raises the call's error
        (``boltccl.TimeoutError``, ``boltccl.PeerLostError``, ...). ``timeout`` bounds this
        wait only (``boltccl.TimeoutError``; the call goes on)."""
    def is_completed(self) -> bool:
        """Whether the call has finished. Never blocks."""
    def test(self) -> bool:
        """Like ``is_completed()``, raising the call's error if it failed."""
    def add_done_callback(self, f: Any) -> None:
        """Call ``f()`` once the call completes (at once if it has, else on the group's
        progress thread). It must not make a blocking call on the same group."""

class Group:
    """A set of ranks that run collectives together.

    Every call blocks until this rank's part is done (the GIL is released meanwhile) and
    fails instead of hanging; with ``async_op=True`` it returns a :class:`Work` at once.
    Calls on one group must not overlap; ``split()`` for more.
    Arrays: numpy, torch CPU tensors, mlx.core arrays, JAX arrays (read-only: out of place
    only), memoryview, array.array, bytearray.
    """

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def barrier(self, *, async_op: bool = False) -> Any: ...
    def all_sum(self, x: B, out: Optional[B] = None, *, dtype: DTypeLike = None, async_op: bool = False) -> B:
        """Elementwise sum across ranks, in place in ``x`` or into ``out``; returns it."""
    def all_max(self, x: B, out: Optional[B] = None, *, dtype: DTypeLike = None, async_op: bool = False) -> B: ...
    def all_min(self, x: B, out: Optional[B] = None, *, dtype: DTypeLike = None, async_op: bool = False) -> B: ...
    def all_gather(
        self, x: Buffer, out: Optional[Buffer] = None, *, dtype: DTypeLike = None, async_op: bool = False
    ) -> Buffer:
        """Every rank's ``x`` in rank order: a new array of ``size * len(x)`` (or ``out``)."""
    def reduce_scatter(
        self,
        x: Buffer,
        out: Optional[Buffer] = None,
        *,
        dtype: DTypeLike = None,
        op: str = "sum",
        async_op: bool = False,
    ) -> Buffer:
        """``x`` (``size`` blocks) reduced with ``op`` ("sum", "max", "min") across ranks;
        this rank's block (new, or ``out``)."""
    def broadcast(self, x: B, root: int = 0, *, dtype: DTypeLike = None, async_op: bool = False) -> B: ...
    def send(self, x: Buffer, peer: int, *, dtype: DTypeLike = None, async_op: bool = False) -> Any: ...
    def recv(self, x: B, peer: int, *, dtype: DTypeLike = None, async_op: bool = False) -> B: ...
    def all_to_all(
        self, x: Buffer, out: Optional[Buffer] = None, *, dtype: DTypeLike = None, async_op: bool = False
    ) -> Buffer:
        """``x`` holds ``size`` equal parts, part q for rank q; returns part ``rank`` of every rank's ``x``."""
    def all_to_all_v(
        self,
        x: Buffer,
        send_counts: Sequence[int],
        out: B,
        recv_counts: Sequence[int],
        *,
        dtype: DTypeLike = None,
        async_op: bool = False,
    ) -> B:
        """``send_counts[q]`` elements of ``x`` to each rank q in turn; ``out`` gets ``recv_counts[q]`` from each."""
    def gather(
        self,
        x: Buffer,
        root: int = 0,
        out: Optional[Buffer] = None,
        *,
        dtype: DTypeLike = None,
        async_op: bool = False,
    ) -> Any:
        """On ``root``, every rank's ``x`` in rank order; None elsewhere."""
    def scatter(
        self, out: B, x: Optional[Buffer] = None, root: int = 0, *, dtype: DTypeLike = None, async_op: bool = False
    ) -> B:
        """``out`` gets block ``rank`` of ``root``'s ``x``."""
    def reduce(
        self,
        x: B,
        root: int = 0,
        out: Optional[B] = None,
        *,
        dtype: DTypeLike = None,
        op: str = "sum",
        async_op: bool = False,
    ) -> B:
        """``root``'s ``x`` (or ``out``) gets every rank's ``x`` reduced with ``op``."""
    def split(self, color: Optional[int], key: int = 0) -> Optional["Group"]: ...
    def abort(self) -> None: ...
    def shrink(self, exclude: Optional[Sequence[int]] = None) -> "Group": ...
    def grow(self, size: int, coordinator: str, key: str) -> "Group": ...

def init(
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    coordinator: Optional[str] = None,
    job_key: Optional[str] = None,
    timeout: Optional[float] = None,
    init_timeout: Optional[float] = None,
) -> Group:
    """Form a group from the environment, overridden by the keyword arguments."""
def free_coordinator_port(ip: str) -> int:
    """A TCP port on `ip` that is free now, for a coordinator that rank 0 binds in a moment:
    below the kernel's ephemeral range, so that no connection made meanwhile is given it."""
def derived_port(seed: str, avoid: List[int]) -> int:
    """A port derived from `seed` as boltccl derives coordinator ports (20000-32767), never
    one of `avoid`: every rank computes the same, with no exchange."""
def launch(
    command: List[str],
    *,
    n: Optional[int] = None,
    hostfile: Optional[str] = None,
    port: Optional[int] = None,
    env: List[Tuple[str, str]] = ...,
    pin: bool = True,
    timeout: Optional[float] = None,
    capture: bool = False,
    mpi_library: Optional[str] = None,
    keep_going: bool = False,
) -> Tuple[int, List[str]]:
    """Run a job with the launcher of `boltccl launch` (see `boltccl.launch`): `n` local ranks,
    or one per hostfile entry over ssh. Returns the exit status and, with `capture`, each
    rank's output."""
