"""Type stubs for the compiled module ``boltccl._native`` (re-exported by ``boltccl``)."""

from typing import Any, List, Optional, Tuple, TypeVar, Union

__version__: str
DTYPES: List[str]

# Any writable C-contiguous buffer-protocol object: numpy.ndarray, memoryview, array.array,
# bytearray, ...
Buffer = Any
B = TypeVar("B")
DTypeLike = Union[str, Any, None]

class Group:
    """A set of ranks that run collectives together.

    Every call blocks until this rank's part is done (the GIL is released meanwhile) and
    fails instead of hanging. Calls on one group must not overlap; ``split()`` for more.
    """

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def barrier(self) -> None: ...
    def all_sum(self, x: B, out: Optional[B] = None, *, dtype: DTypeLike = None) -> B:
        """Elementwise sum across ranks, in place in ``x`` or into ``out``; returns it."""
    def all_max(self, x: B, out: Optional[B] = None, *, dtype: DTypeLike = None) -> B: ...
    def all_min(self, x: B, out: Optional[B] = None, *, dtype: DTypeLike = None) -> B: ...
    def all_gather(self, x: Buffer, out: Optional[Buffer] = None, *, dtype: DTypeLike = None) -> Buffer:
        """Every rank's ``x`` in rank order: a new array of ``size * len(x)`` (or ``out``)."""
    def reduce_scatter(self, x: Buffer, out: Optional[Buffer] = None, *, dtype: DTypeLike = None) -> Buffer:
        """Sum of ``x`` (``size`` blocks) across ranks; this rank's block (new, or ``out``)."""
    def broadcast(self, x: B, root: int = 0, *, dtype: DTypeLike = None) -> B: ...
    def send(self, x: Buffer, peer: int, *, dtype: DTypeLike = None) -> None: ...
    def recv(self, x: B, peer: int, *, dtype: DTypeLike = None) -> B: ...
    def split(self, color: Optional[int], key: int = 0) -> Optional["Group"]: ...

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
) -> Tuple[int, List[str]]:
    """Run a job with the launcher of `boltccl launch` (see `boltccl.launch`): `n` local ranks,
    or one per hostfile entry over ssh. Returns the exit status and, with `capture`, each
    rank's output."""
