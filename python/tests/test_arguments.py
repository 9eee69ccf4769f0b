"""Single-rank tests: buffer handling and argument errors (ValueError / TypeError)."""

import array

import numpy as np
import pytest

import boltccl


@pytest.fixture(scope="module")
def g():
    return boltccl.init(rank=0, world_size=1)


def test_rank_size_repr(g):
    assert (g.rank, g.size) == (0, 1)
    assert repr(g) == "<boltccl.Group rank 0 of 1>"
    g.barrier()


def test_in_place_returns_the_same_object(g):
    x = np.arange(5, dtype=np.float32)
    assert g.all_sum(x) is x
    out = np.zeros(5, dtype=np.float32)
    assert g.all_min(x, out=out) is out
    assert (out == x).all()
    assert g.all_max(x, out=x) is x


@pytest.mark.parametrize(
    "buf",
    [
        array.array("d", [1.0, 2.0]),
        memoryview(bytearray(8)).cast("i"),
        np.zeros((2, 3), dtype=np.uint8),
        np.zeros(3, dtype=np.float16),
    ],
)
def test_buffer_kinds(g, buf):
    assert g.all_sum(buf) is buf


def test_bfloat16(g):
    import ml_dtypes  # in requirements-test.txt: missing is a failure, not a skip
    x = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    assert g.all_sum(x) is x
    bits = x.view(np.uint16)
    assert g.all_sum(bits, dtype="bfloat16") is bits
    assert g.all_sum(bits, dtype=ml_dtypes.bfloat16) is bits


def test_dtype_argument_forms(g):
    x = np.zeros(2, dtype=np.float32)
    for dt in ("float32", "f32", np.float32, np.dtype("float32")):
        g.all_sum(x, dtype=dt)
    with pytest.raises(TypeError, match="unknown dtype"):
        g.all_sum(x, dtype="float128")
    with pytest.raises(TypeError, match="dtype=int64 has 8-byte elements but x has 4-byte items"):
        g.all_sum(x, dtype="int64")


def test_read_only(g):
    x = np.zeros(4, dtype=np.float32)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="read-only.*writable"):
        g.all_sum(x)
    with pytest.raises(ValueError, match="read-only"):
        g.all_sum(bytes(8), dtype="float32")
    # Read-only input is fine when the result goes elsewhere, and for send-like use.
    out = np.empty(4, dtype=np.float32)
    g.all_sum(x, out=out)


def test_non_contiguous(g):
    with pytest.raises(ValueError, match="not C-contiguous.*ascontiguousarray"):
        g.all_sum(np.zeros(8, dtype=np.float32)[::2])
    with pytest.raises(ValueError, match="not C-contiguous"):
        g.all_sum(np.zeros((4, 4), dtype=np.float32).T)


def test_not_a_buffer(g):
    with pytest.raises(TypeError, match="buffer protocol"):
        g.all_sum([1.0, 2.0])
    with pytest.raises(TypeError, match="unsupported element type"):
        g.all_sum(np.zeros(2, dtype=bool))
    with pytest.raises(TypeError, match="unsupported"):
        g.all_sum(np.zeros(2, dtype=np.complex64))
    with pytest.raises(TypeError, match="big-endian"):
        g.all_sum(np.zeros(2, dtype=">f4"))


def test_mismatched_types_and_lengths(g):
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(TypeError, match="out has element type float64 but x has float32"):
        g.all_sum(x, out=np.zeros(4))
    with pytest.raises(ValueError, match="same length"):
        g.all_sum(x, out=np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="overlap"):
        buf = np.zeros(8, dtype=np.float32)
        g.all_sum(buf[:4], out=buf[2:6])
    with pytest.raises(ValueError, match="all_gather output"):
        g.all_gather(x, out=np.zeros(3, dtype=np.float32))


def test_rank_out_of_range(g):
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="root 3 is out of range"):
        g.broadcast(x, 3)
    with pytest.raises(ValueError, match="peer must be a rank >= 0"):
        g.send(x, -1)
    with pytest.raises(ValueError, match="cannot send to or receive from itself"):
        g.recv(x, 0)
    with pytest.raises(ValueError, match="color must be None or between"):
        g.split(-3)
    # Argument errors leave the group usable.
    g.all_sum(x)


def test_init_argument_errors():
    with pytest.raises(ValueError, match="rank must be >= 0"):
        boltccl.init(rank=-1, world_size=1)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        boltccl.init(world_size=1, timeout=0)
    with pytest.raises(boltccl.ConfigError, match="out of range") as e:
        boltccl.init(rank=2, world_size=2, coordinator="127.0.0.1:1")
    assert isinstance(e.value, boltccl.Error) and e.value.kind == "config"


def test_all_gather_allocates_like_the_input(g):
    assert isinstance(g.all_gather(array.array("h", [1, 2])), array.array)
    y = g.all_gather(np.ones((2, 2), dtype=np.int8))
    assert isinstance(y, np.ndarray) and y.shape == (2, 2) and y.dtype == np.int8
    m = g.all_gather(memoryview(bytearray(8)).cast("f"))
    assert isinstance(m, memoryview) and m.format == "f" and len(m) == 2


def test_error_hierarchy():
    assert issubclass(boltccl.TimeoutError, boltccl.Error)
    assert issubclass(boltccl.TimeoutError, TimeoutError)
    assert issubclass(boltccl.PeerLostError, boltccl.Error)
    assert issubclass(boltccl.PeerLostError, ConnectionError)
