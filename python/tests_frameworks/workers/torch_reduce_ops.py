"""ReduceOp.PREMUL_SUM and AVG (every floating-point dtype), PRODUCT, BAND, BOR and BXOR, the
coalesced all_gather_into_tensor and reduce_scatter_tensor (direct, and through
dist._coalescing_manager), batch_isend_irecv, and sequence numbers, through the boltccl
torch.distributed backend.
Every result is compared bit for bit with an exact reference computed here (and with Gloo's
where Gloo has the call); inputs the call must not change are checked unchanged; the sequence
numbers are compared with Gloo's for the same calls. Prints one RESULT line."""

import functools

import torch
import torch.distributed as dist
import torch_checks
from torch_checks import Checks, same

import boltccl.torch  # noqa: F401  registers "boltccl"

dist.init_process_group("boltccl")
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
pg = dist.group.WORLD
check = Checks(rank, n)
# Its own seed: the products checked below were chosen exact with these values.
val = functools.partial(torch_checks.val, seed=11)


def exact(parts, dt):
    """The sum of `parts` (computed exactly in float64) in dtype dt."""
    return torch.stack([p.to(torch.float64) for p in parts]).sum(0).to(dt)


FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Factors as torch takes them: Python floats and one-element tensors (0-d and 1-d).
FACTORS = (0.5, 3.0, torch.tensor([2.0]), torch.tensor(0.25, dtype=torch.float64))

# -- PREMUL_SUM: each rank's input times the factor, then summed -------------------------------
for m in (5, 40000):  # inline, and started on the progress thread (async Work)
    for dt in FLOATS if m == 5 else (torch.float32, torch.bfloat16):
        for fi, factor in enumerate(FACTORS):
            tag = f"{dt} x{m} factor {fi}"
            fval = float(factor)
            op = dist._make_nccl_premul_sum(factor)
            # all_reduce (in place: the tensor is the output).
            t = val(rank, (m,), dt, salt=fi)
            w = dist.all_reduce(t, op=op, async_op=True)
            w.wait()
            ref = exact([val(q, (m,), dt, salt=fi) * fval for q in range(n)], dt)
            check(f"all_reduce PREMUL_SUM {tag}", same(t, ref))
            # reduce_scatter_tensor: the input is left as it was.
            x = val(rank, (n * m,), dt, salt=fi + 20)
            keep = x.clone()
            out = torch.full((m,), -1.0).to(dt)
            dist.reduce_scatter_tensor(out, x, op=op)
            ref = exact([val(q, (n * m,), dt, salt=fi + 20)[rank * m : (rank + 1) * m] * fval for q in range(n)], dt)
            check(f"reduce_scatter_tensor PREMUL_SUM {tag}", same(out, ref) and same(x, keep))
            # reduce_scatter (a list per rank): the inputs are left as they were.
            ins = [val(rank, (m,), dt, salt=fi + 40 + q) for q in range(n)]
            keep = [i.clone() for i in ins]
            out = torch.full((m,), -1.0).to(dt)
            dist.reduce_scatter(out, ins, op=op)
            ref = exact([val(q, (m,), dt, salt=fi + 40 + rank) * fval for q in range(n)], dt)
            check(f"reduce_scatter PREMUL_SUM {tag}", same(out, ref) and all(same(a, b) for a, b in zip(ins, keep)))
            # reduce, every root: the other ranks' tensors are left as they were.
            for root in range(n):
                t = val(rank, (m,), dt, salt=fi + 60 + root)
                dist.reduce(t, dst=root, op=op)
                ref = exact([val(q, (m,), dt, salt=fi + 60 + root) * fval for q in range(n)], dt) if rank == root else val(rank, (m,), dt, salt=fi + 60 + root)
                check(f"reduce PREMUL_SUM root {root} {tag}", same(t, ref))

# A factor that rounds in the dtype: the input times the factor in the input's own type, as NCCL.
for dt in FLOATS:
    t = val(rank, (7,), dt, salt=90)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.1))
    f = torch.tensor(0.1, dtype=dt)
    ref = exact([val(q, (7,), dt, salt=90) * f for q in range(n)], torch.float64)
    check(f"all_reduce PREMUL_SUM 0.1 {dt}", bool(torch.allclose(t.to(torch.float64), ref, rtol=1e-2, atol=1e-2)))
# A non-contiguous tensor (a column) and several tensors coalesced.
mat = torch.zeros(6, 3)
mat[:, 1] = torch.arange(6.0) + rank
dist.all_reduce(mat[:, 1], op=dist._make_nccl_premul_sum(2.0))
check("all_reduce PREMUL_SUM non-contiguous", same(mat[:, 1].contiguous(), (torch.arange(6.0) * n + n * (n - 1) / 2) * 2) and bool((mat[:, [0, 2]] == 0).all()))
ts = [val(rank, (3,), torch.float32, salt=k) for k in range(3)]
with dist._coalescing_manager():
    for t in ts:
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
check("coalesced all_reduce PREMUL_SUM", all(same(t, exact([val(q, (3,), torch.float32, salt=k) * 0.5 for q in range(n)], torch.float32)) for k, t in enumerate(ts)))

# -- AVG: every floating-point dtype -------------------------------------------------------------
for m in (5, 40000):
    for dt in FLOATS:
        tag = f"{dt} x{m}"
        t = val(rank, (m,), dt, salt=100)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        check(f"all_reduce AVG {tag}", same(t, exact([val(q, (m,), dt, salt=100) for q in range(n)], dt).div_(n)))
        x = val(rank, (n * m,), dt, salt=101)
        out = torch.full((m,), -1.0).to(dt)
        dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG)
        ref = exact([val(q, (n * m,), dt, salt=101)[rank * m : (rank + 1) * m] for q in range(n)], dt).div_(n)
        check(f"reduce_scatter_tensor AVG {tag}", same(out, ref))
        t = val(rank, (m,), dt, salt=102)
        dist.reduce(t, dst=n - 1, op=dist.ReduceOp.AVG)
        ref = exact([val(q, (m,), dt, salt=102) for q in range(n)], dt).div_(n) if rank == n - 1 else val(rank, (m,), dt, salt=102)
        check(f"reduce AVG {tag}", same(t, ref))

# -- PRODUCT, BAND, BOR, BXOR (all_reduce and reduce, gathered): exact, and as Gloo's ----------
LOCAL = (
    ("PRODUCT", dist.ReduceOp.PRODUCT, (torch.float32, torch.bfloat16, torch.int64), lambda a, b: a * b),
    ("BAND", dist.ReduceOp.BAND, (torch.int32, torch.uint8), lambda a, b: a & b),
    ("BOR", dist.ReduceOp.BOR, (torch.int32, torch.int8), lambda a, b: a | b),
    ("BXOR", dist.ReduceOp.BXOR, (torch.int64,), lambda a, b: a ^ b),
)


def small(r, shape, dt, salt):
    """Values whose product over a few ranks is exact in every dtype here."""
    gen = torch.Generator().manual_seed(1000 * r + salt)
    return torch.randint(-3 if dt.is_signed else 0, 4, shape, generator=gen).to(dt)


for name, op, dts, f in LOCAL:
    for m in (5, 40000):
        for dt in dts:
            tag = f"{name} {dt} x{m}"
            ref = small(0, (m,), dt, 400)
            for q in range(1, n):
                ref = f(ref, small(q, (m,), dt, 400))
            t = small(rank, (m,), dt, 400)
            w = dist.all_reduce(t, op=op, async_op=True)
            w.wait()
            check(f"all_reduce {tag}", same(t, ref))
            if dt is not torch.bfloat16 and dt is not torch.int8:
                g = small(rank, (m,), dt, 400)
                dist.all_reduce(g, op=op, group=gloo)
                check(f"all_reduce {tag} = gloo", same(t, g))
            for root in range(n):
                t = small(rank, (m,), dt, 400)
                dist.reduce(t, dst=root, op=op)
                check(f"reduce {tag} root {root}", same(t, ref if rank == root else small(rank, (m,), dt, 400)))
mat = torch.ones(4, 3, dtype=torch.int64)
mat[:, 1] = torch.arange(4) + rank + 1
dist.all_reduce(mat[:, 1], op=dist.ReduceOp.PRODUCT)
want = torch.ones(4, dtype=torch.int64)
for q in range(n):
    want = want * (torch.arange(4) + q + 1)
check("all_reduce PRODUCT non-contiguous", same(mat[:, 1].contiguous(), want) and bool((mat[:, [0, 2]] == 1).all()))
check.refused("BAND of floats refused", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), TypeError, "integer tensor")

# -- coalesced all_gather_into_tensor and reduce_scatter_tensor -----------------------------------
# Sizes and dtypes differ between the pairs; the last is large (started: async Work).
SHAPES = ((3, torch.float32), (8, torch.bfloat16), (1, torch.int64), (30000, torch.float32))
ins = [val(rank, (k,), dt, salt=200 + i) for i, (k, dt) in enumerate(SHAPES)]
gathered = [torch.cat([val(q, (k,), dt, salt=200 + i) for q in range(n)]) for i, (k, dt) in enumerate(SHAPES)]
for async_ops in (False, True):
    outs = [torch.full((n * k,), -1).to(dt) for k, dt in SHAPES]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    if async_ops:
        cm.wait()
    check(f"coalescing manager all_gather_into_tensor async {async_ops}", all(same(o, g) for o, g in zip(outs, gathered)))
# Stacked outputs ([n, k]) straight to the process group: one Work for all, its result every output.
outs = [torch.full((n, k), -1).to(dt) for k, dt in SHAPES]
before = pg._get_sequence_number_for_group()
w = pg.allgather_into_tensor_coalesced(outs, ins)
check("allgather_into_tensor_coalesced is one collective", pg._get_sequence_number_for_group() == before + 1)
res = w.get_future().wait()
check("allgather_into_tensor_coalesced", w.wait() and all(same(o.reshape(-1), g) for o, g in zip(outs, gathered)) and len(res) == len(outs))

rs_ins = [val(rank, (n * k,), dt, salt=300 + i) for i, (k, dt) in enumerate(SHAPES)]
rs_keep = [x.clone() for x in rs_ins]


def rs_ref(i, factor=1.0):
    k, dt = SHAPES[i]
    return exact([val(q, (n * k,), dt, salt=300 + i)[rank * k : (rank + 1) * k] * factor for q in range(n)], dt)


for async_ops in (False, True):
    outs = [torch.full((k,), -1).to(dt) for k, dt in SHAPES]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for o, i in zip(outs, rs_ins):
            dist.reduce_scatter_tensor(o, i)
    if async_ops:
        cm.wait()
    check(f"coalescing manager reduce_scatter_tensor async {async_ops}", all(same(o, rs_ref(i)) for i, o in enumerate(outs)))
floats = [i for i, (k, dt) in enumerate(SHAPES) if dt.is_floating_point]
for name, op, factor in (("MAX", dist.ReduceOp.MAX, None), ("PREMUL_SUM", dist._make_nccl_premul_sum(4.0), 4.0)):
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = op
    idx = floats if factor else range(len(SHAPES))
    outs = [torch.full((SHAPES[i][0],), -1).to(SHAPES[i][1]) for i in idx]
    before = pg._get_sequence_number_for_group()
    w = pg.reduce_scatter_tensor_coalesced(outs, [rs_ins[i] for i in idx], opts)
    w.wait()
    check(f"reduce_scatter_tensor_coalesced {name} is one collective", pg._get_sequence_number_for_group() == before + 1)
    if factor:
        ok = all(same(o, rs_ref(i, factor)) for i, o in zip(idx, outs))
    else:
        ok = all(
            same(o, torch.stack([val(q, (n * SHAPES[i][0],), SHAPES[i][1], salt=300 + i)[rank * SHAPES[i][0] : (rank + 1) * SHAPES[i][0]] for q in range(n)]).max(0).values)
            for i, o in zip(idx, outs)
        )
    check(f"reduce_scatter_tensor_coalesced {name}", ok)
check("reduce_scatter_tensor_coalesced leaves the inputs", all(same(a, b) for a, b in zip(rs_ins, rs_keep)))

# -- batch_isend_irecv: every rank posts its irecvs first (one after another on a boltccl group,
# these would wait forever without the backend's reordering); a ring both ways, and to every peer.
for m in (3, 50000):
    for dt in (torch.float32, torch.int64):
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        got_prv, got_nxt = torch.full((m,), -1).to(dt), torch.full((m,), -1).to(dt)
        ops = [
            dist.P2POp(dist.irecv, got_prv, prv),
            dist.P2POp(dist.irecv, got_nxt, nxt) if n > 2 else None,
            dist.P2POp(dist.isend, val(rank, (m,), dt, salt=500 + nxt), nxt),
            dist.P2POp(dist.isend, val(rank, (m,), dt, salt=500 + prv), prv) if n > 2 else None,
        ]
        for w in dist.batch_isend_irecv([o for o in ops if o is not None]):
            w.wait()
        ok = same(got_prv, val(prv, (m,), dt, salt=500 + rank)) and (n == 2 or same(got_nxt, val(nxt, (m,), dt, salt=500 + rank)))
        check(f"batch_isend_irecv ring {dt} x{m}", ok)
        # Two tensors to and from every peer, recvs first, in the order given.
        outs = {(q, k): torch.full((m,), -1).to(dt) for q in range(n) if q != rank for k in range(2)}
        ops = [dist.P2POp(dist.irecv, outs[q, k], q) for q, k in outs]
        ops += [dist.P2POp(dist.isend, val(rank, (m,), dt, salt=600 + 10 * q + k), q) for q, k in outs]
        works = dist.batch_isend_irecv(ops)
        works[-1].get_future().wait()
        check(f"batch_isend_irecv to every peer {dt} x{m}", all(same(o, val(q, (m,), dt, salt=600 + 10 * rank + k)) for (q, k), o in outs.items()))

# A coalescing window on a device (as batch_isend_irecv opens): its one Work covers the
# collectives in it, large (started) ones included.
big = [val(rank, (40000,), torch.float32, salt=700 + k) for k in range(2)]
bc = val(rank, (40000,), torch.float32, salt=710)
with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
    for t in big:
        dist.all_reduce(t)
    dist.broadcast(bc, src=n - 1)
cm.wait()
ok = all(same(t, exact([val(q, (40000,), torch.float32, salt=700 + k) for q in range(n)], torch.float32)) for k, t in enumerate(big))
check("coalescing window on a device", ok and same(bc, val(n - 1, (40000,), torch.float32, salt=710)))

# -- sequence numbers: as Gloo counts the same calls -------------------------------------------------


def calls(group):
    """Collectives of every kind and a send/recv pair (counted on the two ranks, as Gloo does)."""
    t = torch.ones(4)
    dist.all_reduce(t, group=group)
    dist.broadcast(t, src=0, group=group)
    dist.all_gather([torch.empty(4) for _ in range(n)], t, group=group)
    dist.all_gather_into_tensor(torch.empty(4 * n), t, group=group)
    dist.reduce(t, dst=0, group=group)
    dist.gather(t, [torch.empty(4) for _ in range(n)] if rank == 0 else None, dst=0, group=group)
    dist.scatter(t, [torch.ones(4)] * n if rank == 0 else None, src=0, group=group)
    dist.all_to_all_single(torch.empty(n), torch.ones(n), group=group)
    dist.barrier(group=group)
    if rank < 2:
        (dist.send if rank == 0 else dist.recv)(t, 1 - rank, group=group)
        (dist.isend if rank == 0 else dist.irecv)(t, 1 - rank, group=group).wait()
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n), group=group)
    dist.all_to_all([torch.empty(1) for _ in range(n)], [torch.ones(1) for _ in range(n)], group=group)
    dist.all_reduce(torch.ones(100000), group=group)  # a large one


sub = dist.new_group(backend="boltccl")
check("a new group counts from 0", sub._get_sequence_number_for_group() == 0)
counts = {}
for name, group in (("boltccl", sub), ("gloo", gloo)):
    s0 = group._get_sequence_number_for_group()
    calls(group)
    counts[name] = group._get_sequence_number_for_group() - s0
check(f"sequence numbers as Gloo's {counts}", counts["boltccl"] == counts["gloo"] > 0)
sub._set_sequence_number_for_group()  # Gloo's is a no-op now: the numbers start at 0 everywhere
seqs = [None] * n
mine = sub._get_sequence_number_for_group()
dist.all_gather_object(seqs, mine)
# Every rank's count is the same but for the two send/recv pairs, counted on ranks 0 and 1 only.
check(f"sequence numbers agree on every rank {seqs}", seqs[rank] == mine and seqs == [seqs[0]] * 2 + [seqs[0] - 2] * (n - 2))

# -- errors ------------------------------------------------------------------------------------------
check.refused("PREMUL_SUM of ints refused", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)), TypeError, "floating-point")
check.refused(
    "coalesced lists of two lengths refused",
    lambda: pg.allgather_into_tensor_coalesced([torch.empty(n)], [torch.ones(1), torch.ones(1)]),
    ValueError,
    "one output for each input",
)
check.refused(
    "coalesced reduce_scatter lists of two lengths refused",
    lambda: pg.reduce_scatter_tensor_coalesced([torch.empty(1), torch.empty(1)], [torch.ones(n)], dist.ReduceScatterOptions()),
    ValueError,
    "one output for each input",
)
check.refused("coalesced output of the wrong size refused", lambda: pg.allgather_into_tensor_coalesced([torch.empty(n + 1)], [torch.ones(1)]), ValueError, "times its elements")
check.refused(
    "coalesced input of the wrong size refused",
    lambda: pg.reduce_scatter_tensor_coalesced([torch.empty(2)], [torch.ones(2 * n + 1)], dist.ReduceScatterOptions()),
    ValueError,
    "times its elements",
)
t = torch.ones(2)
dist.all_reduce(t)
check("still usable", t.tolist() == [n, n])
dist.destroy_process_group()
check.result()
