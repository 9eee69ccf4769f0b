"""An unchanged mx.distributed program, run over boltccl through MLX's own mpi backend
(MLX_MPI_LIBNAME = libboltccl_mpi). Modes:

  conformance [any]  all_sum / all_max / all_min / all_gather for every MLX dtype, empty and odd
                     sizes, split sub-groups and send/recv_like, checked against numpy
                     references and for identical bits on every rank; `any` forms the group
                     with MLX's default backend choice instead of backend="mpi".
  die | stop         all_sum in a loop; the last rank kills (SIGKILL) or stops (SIGSTOP) itself
                     at step 20. The others must end within the deadline (the test checks).

Prints one `RESULT {...}` line per rank.
"""

import hashlib
import json
import os
import signal
import sys

import ml_dtypes
import mlx.core as mx
import numpy as np

mode = sys.argv[1]
world = mx.distributed.init() if sys.argv[2:] == ["any"] else mx.distributed.init(backend="mpi", strict=True)
rank, n = world.rank(), world.size()
failures = []
checks = 0

if mode in ("die", "stop"):
    for step in range(1_000_000):
        if step == 20 and rank == n - 1:
            os.kill(os.getpid(), signal.SIGKILL if mode == "die" else signal.SIGSTOP)
        y = mx.distributed.all_sum(mx.ones(16), group=world)
        mx.eval(y)
        assert float(y[0]) == n
    sys.exit(0)

# MLX dtype -> the numpy dtype its bits read as.
DTYPES = {
    "bool": (mx.bool_, np.bool_),
    "int8": (mx.int8, np.int8),
    "uint8": (mx.uint8, np.uint8),
    "int16": (mx.int16, np.int16),
    "uint16": (mx.uint16, np.uint16),
    "int32": (mx.int32, np.int32),
    "uint32": (mx.uint32, np.uint32),
    "int64": (mx.int64, np.int64),
    "uint64": (mx.uint64, np.uint64),
    "float16": (mx.float16, np.float16),
    "bfloat16": (mx.bfloat16, ml_dtypes.bfloat16),
    "float32": (mx.float32, np.float32),
    "float64": (mx.float64, np.float64),
    "complex64": (mx.complex64, np.complex64),
}
SIZES = [0, 1, 7, 1000, 4099]


def data(name, size, r):
    """Rank r's input: small integers (or quarters) so that every sum is exact in every type,
    except for wrapping integer sums, which numpy wraps alike."""
    rng = np.random.default_rng([r, size, sum(map(ord, name))])
    _, npt = DTYPES[name]
    if name == "bool":
        return rng.integers(0, 2, size).astype(np.bool_)
    if name == "complex64":
        return (rng.integers(-8, 8, size) + 1j * rng.integers(-8, 8, size)).astype(np.complex64)
    if name.startswith(("float", "bfloat")):
        return (rng.integers(-64, 64, size) / 4).astype(npt)
    info = np.iinfo(npt)
    return rng.integers(info.min, int(info.max) + 1, size, dtype=np.int64 if info.min < 0 else np.uint64).astype(npt)


def to_mx(a, name):
    mxt, _ = DTYPES[name]
    if name == "bfloat16":
        return mx.array(a.astype(np.float32)).astype(mx.bfloat16)
    return mx.array(a, dtype=mxt)


def to_np(x, name):
    mx.eval(x)
    if name == "bfloat16":
        return np.array(x.view(mx.uint16)).view(ml_dtypes.bfloat16)
    return np.array(x)


def reference(op, name, arrays):
    s = np.stack(arrays)
    if name == "bool":
        return {"sum": s.any(0), "max": s.any(0), "min": s.all(0)}[op]
    if op == "sum":
        if name == "bfloat16":  # exact: small quarters
            return s.astype(np.float32).sum(0).astype(ml_dtypes.bfloat16)
        return np.add.reduce(s, axis=0, dtype=s.dtype)
    return {"max": s.max(0), "min": s.min(0)}[op]


def same_bits_everywhere(a, what):
    """Every rank holds these bytes (checked through MLX's own all_gather)."""
    global checks
    digest = np.frombuffer(hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest()[:8], dtype=np.uint8)
    got = np.array(mx.distributed.all_gather(mx.array(digest), group=world)).reshape(n, 8)
    checks += 1
    if not (got == got[0]).all():
        failures.append(f"{what}: ranks hold different bits")


def check(what, got, want):
    global checks
    checks += 1
    if got.shape != want.shape or got.dtype != want.dtype or got.tobytes() != want.tobytes():
        failures.append(f"{what}: got {got[:6]!r} ({got.dtype}, {got.shape}) want {want[:6]!r} ({want.dtype}, {want.shape})")


ops = {"sum": mx.distributed.all_sum, "max": mx.distributed.all_max, "min": mx.distributed.all_min}
for name in DTYPES:
    for size in SIZES:
        inputs = [data(name, size, r) for r in range(n)]
        mine = to_mx(inputs[rank], name)
        for op, f in ops.items():
            got = to_np(f(mine, group=world), name)
            if name == "complex64" and op != "sum":
                # MLX orders complex numbers with its own function; the library folds it in rank
                # order, so the bits agree everywhere whatever that order is.
                same_bits_everywhere(got, f"all_{op} {name}[{size}]")
                continue
            check(f"all_{op} {name}[{size}]", got, reference(op, name, inputs))
        got = to_np(mx.distributed.all_gather(mine, group=world), name)
        check(f"all_gather {name}[{size}]", got, np.concatenate(inputs))

# Sums of arbitrary floats: not exact, but the same bits on every rank and every run.
for name in ("float16", "bfloat16", "float32"):
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(5000).astype(np.float32)
    got = to_np(mx.distributed.all_sum(mx.array(x).astype(DTYPES[name][0]), group=world), name)
    same_bits_everywhere(got, f"all_sum of random {name}")

# Split sub-groups: odd and even ranks, the order reversed by key.
sub = world.split(rank % 2, n - rank)
members = [r for r in range(n) if r % 2 == rank % 2]
want_rank = sorted(members, key=lambda r: n - r).index(rank)
checks += 1
if (sub.rank(), sub.size()) != (want_rank, len(members)):
    failures.append(f"split: rank {sub.rank()} of {sub.size()}, want {want_rank} of {len(members)}")
got = np.array(mx.distributed.all_sum(mx.array([rank], dtype=mx.int32), group=sub))
check("all_sum over the split group", got, np.array([sum(members)], dtype=np.int32))
got = to_np(mx.distributed.all_gather(mx.array([rank] * 3, dtype=mx.int16), group=sub), "int16")
order = sorted(members, key=lambda r: n - r)
check("all_gather over the split group", got, np.repeat(np.array(order, dtype=np.int16), 3))

# send / recv_like around the ring (even ranks send first), small and 1 MiB.
to, frm = (rank + 1) % n, (rank - 1) % n
for size in (3, 1 << 18):
    x = mx.full((size,), rank, dtype=mx.float32)
    if rank % 2 == 0:
        mx.eval(mx.distributed.send(x, to, group=world))
        got = mx.distributed.recv_like(x, frm, group=world)
    else:
        got = mx.distributed.recv_like(x, frm, group=world)
        mx.eval(got)
        mx.eval(mx.distributed.send(x, to, group=world))
    check(f"recv_like[{size}] from {frm}", to_np(got, "float32"), np.full(size, frm, dtype=np.float32))

print("RESULT " + json.dumps({"rank": rank, "size": n, "checks": checks, "failures": failures[:10]}), flush=True)
