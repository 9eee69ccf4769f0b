"""Every collective x every element type, checked against numpy on every rank.

Prints ``RESULT {check: "ok" | error}``; exits 0 even when checks fail (the test reads them).
"""

import array
import json
import sys
import traceback

import numpy as np

import boltccl

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - the test environment installs ml_dtypes
    BF16 = None

g = boltccl.init()
R, N = g.rank, g.size
results = {}


def dtypes():
    for name in boltccl.DTYPES:
        if name == "bfloat16":
            if BF16 is not None:
                yield name, BF16
        else:
            yield name, np.dtype(name)


def inputs(dt, rank, n):
    """Small integers, so float sums are exact and integer sums wrap like numpy's."""
    rs = np.random.RandomState(1000 * rank + n)
    lo = 0 if dt.kind == "u" else -60
    vals = rs.randint(lo, 60, size=n)
    if dt == BF16:
        return vals.astype(np.float32).astype(BF16)
    return vals.astype(dt)


def expect(dt, op, n):
    stack = np.stack([inputs(dt, r, n) for r in range(N)])
    if dt == BF16:
        red = getattr(np, op)(stack.astype(np.float32), axis=0)
        return red.astype(BF16)
    if op == "sum":
        return np.sum(stack, axis=0, dtype=dt)
    return getattr(np, op)(stack, axis=0)


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def check(name, fn):
    try:
        fn()
        results[name] = "ok"
    except Exception:
        results[name] = traceback.format_exc(limit=3)


for n in (1000, 70001):
    for name, dt in dtypes():

        def reductions(dt=dt, n=n):
            for op, call in (("sum", g.all_sum), ("max", g.all_max), ("min", g.all_min)):
                x = inputs(dt, R, n)
                assert call(x) is x
                assert same(x, expect(dt, op, n)), f"{op} in place"
                x = inputs(dt, R, n)
                keep = x.copy()
                out = np.empty_like(x)
                assert call(x, out=out) is out
                assert same(out, expect(dt, op, n)), f"{op} out="
                assert same(x, keep), f"{op} out= changed the input"

        def all_gather(dt=dt, n=n):
            x = inputs(dt, R, n)
            y = g.all_gather(x)
            want = np.concatenate([inputs(dt, r, n) for r in range(N)])
            assert same(y, want), "all_gather new array"
            out = np.empty(N * n, dtype=dt)
            assert g.all_gather(x, out=out) is out and same(out, want), "all_gather out="

        def reduce_scatter(dt=dt, n=n):
            m = n - n % N
            x = inputs(dt, R, n)[:m].copy()
            full = expect(dt, "sum", n)[:m] if dt != BF16 else None
            if dt == BF16:
                stack = np.stack([inputs(dt, r, n)[:m] for r in range(N)]).astype(np.float32)
                full = stack.sum(axis=0).astype(BF16)
            blk = m // N
            want = full[R * blk : (R + 1) * blk]
            assert same(g.reduce_scatter(x), want), "reduce_scatter new array"
            out = np.empty(blk, dtype=dt)
            assert g.reduce_scatter(x, out=out) is out and same(out, want), "reduce_scatter out="

        def broadcast(dt=dt, n=n):
            root = N - 1
            x = inputs(dt, R, n)
            assert g.broadcast(x, root) is x
            assert same(x, inputs(dt, root, n))

        def send_recv(dt=dt, n=n):
            right, left = (R + 1) % N, (R - 1) % N
            x = inputs(dt, R, n)
            y = np.empty_like(x)
            if R % 2 == 0:
                g.send(x, right)
                g.recv(y, left)
            else:
                g.recv(y, left)
                g.send(x, right)
            assert same(y, inputs(dt, left, n))

        def all_to_all(dt=dt, n=n):
            m = n - n % N
            x = inputs(dt, R, n)[:m].copy()
            blk = m // N
            want = np.concatenate([inputs(dt, r, n)[R * blk : (R + 1) * blk] for r in range(N)])
            assert same(g.all_to_all(x), want), "all_to_all new array"
            out = np.empty(m, dtype=dt)
            assert g.all_to_all(x, out=out) is out and same(out, want), "all_to_all out="
            # Per-peer counts, some zero: rank q sends (q + p) % 3 * 7 elements to rank p.
            count = lambda q, p: (q + p) % 3 * 7
            send = [count(R, p) for p in range(N)]
            recv = [count(q, R) for q in range(N)]
            x = inputs(dt, R, sum(send))
            out = np.empty(sum(recv), dtype=dt)
            assert g.all_to_all_v(x, send, out, recv) is out
            parts = [inputs(dt, q, sum(count(q, p) for p in range(N))) for q in range(N)]
            want = [parts[q][sum(count(q, p) for p in range(R)) :][: recv[q]] for q in range(N)]
            assert same(out, np.concatenate(want)), "all_to_all_v"

        def rooted(dt=dt, n=n):
            root = N - 1
            x = inputs(dt, R, n)
            got = g.gather(x, root)
            if R == root:
                assert same(got, np.concatenate([inputs(dt, r, n) for r in range(N)])), "gather"
            else:
                assert got is None, "gather returns None off the root"
            full = np.concatenate([inputs(dt, root, n) for _ in range(N)])
            out = np.empty(n, dtype=dt)
            assert g.scatter(out, full if R == root else None, root) is out
            assert same(out, full[R * n : (R + 1) * n]), "scatter"
            for op in ("sum", "max", "min"):
                x = inputs(dt, R, n)
                keep = x.copy()
                assert g.reduce(x, root, op=op) is x
                assert same(x, expect(dt, op, n) if R == root else keep), f"reduce {op}"
            x = inputs(dt, R, n).astype(np.float32) / 7 if dt.kind == "f" else None
            if x is not None:
                y = x.copy()
                g.reduce(x, 0)
                g.all_sum(y)
                if R == 0:
                    assert x.tobytes() == y.tobytes(), "reduce gave other bits than all_sum"

        for coll, fn in (
            ("all_to_all", all_to_all),
            ("gather/scatter/reduce", rooted),
            ("all_sum/max/min", reductions),
            ("all_gather", all_gather),
            ("reduce_scatter", reduce_scatter),
            ("broadcast", broadcast),
            ("send/recv", send_recv),
        ):
            check(f"{coll} {name} {n}", fn)


def other_buffers():
    # memoryview, array.array, bytearray with an explicit dtype, 2-D arrays.
    a = array.array("i", [R + 1] * 10)
    g.all_sum(a)
    assert list(a) == [N * (N + 1) // 2] * 10, a
    m = memoryview(bytearray(np.full(8, R, dtype=np.float64).tobytes())).cast("d")
    g.all_max(m)
    assert list(m) == [N - 1.0] * 8, list(m)
    b = bytearray(np.full(4, 1.5, dtype=np.float32).tobytes())
    g.all_sum(b, dtype="float32")
    assert np.frombuffer(bytes(b), dtype=np.float32).tolist() == [1.5 * N] * 4
    x2 = np.full((3, 5), R, dtype=np.int32)
    assert g.all_sum(x2).shape == (3, 5) and (x2 == N * (N - 1) // 2).all()
    gathered = g.all_gather(np.full((2, 3), R, dtype=np.int16))
    assert gathered.shape == (2 * N, 3) and (gathered[2 * R : 2 * R + 2] == R).all()
    bits = np.full(4, 0x3F80, dtype=np.uint16)  # bfloat16 1.0 as raw bits
    g.all_sum(bits, dtype="bfloat16")
    assert (bits.view(np.uint16) == np.array([1.0 * N], dtype=np.float32).view(np.uint32)[0] >> 16).all(), bits


def split():
    sub = g.split(R % 2, key=-R)
    assert sub is not None
    members = [r for r in range(N) if r % 2 == R % 2]
    assert sub.size == len(members), (sub.size, members)
    assert sub.rank == sorted(members, reverse=True).index(R)
    x = np.array([R], dtype=np.int64)
    sub.all_sum(x)
    assert x[0] == sum(members)
    none = g.split(None if R == 0 else 1)
    assert (none is None) == (R == 0)


check("other buffers", other_buffers)
check("split", split)
g.barrier()
print("RESULT " + json.dumps(results), flush=True)
sys.exit(0)
