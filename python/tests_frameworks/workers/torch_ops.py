"""all_to_all_single (equal parts and split sizes), all_to_all, gather, scatter and reduce
through the boltccl torch.distributed backend, each compared element by element with an
exact reference computed here and, where Gloo has the operation, with Gloo's result from the
same call on a Gloo group of the same ranks. Small calls (run inline) and large ones (started
on the progress thread, async Works and futures), every root, non-contiguous tensors, and the
errors for what the backend does not do. Prints one RESULT line."""

import torch
import torch.distributed as dist
from torch_checks import Checks, same, val

import boltccl.torch  # noqa: F401  registers "boltccl"

dist.init_process_group("boltccl")
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
check = Checks(rank, n)


DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.int8)
# Sizes per rank-part: small (inline, <= 64 KiB in all) and large (started: async Work).
for m in (3, 40000):
    for dt in DTYPES if m == 3 else (torch.float32, torch.bfloat16):
        tag = f"{dt} x{m}"
        # all_to_all_single, equal parts: part q of rank r is val(r)[q*m:(q+1)*m].
        x = val(rank, (n * m,), dt)
        out = torch.full((n * m,), -1).to(dt)
        dist.all_to_all_single(out, x)
        ref = torch.cat([val(q, (n * m,), dt)[rank * m : (rank + 1) * m] for q in range(n)])
        check(f"all_to_all_single {tag}", same(out, ref))
        if dt is not torch.int8:  # Gloo has no int8 all-to-all here
            g = torch.full((n * m,), -1).to(dt)
            dist.all_to_all_single(g, x, group=gloo)
            check(f"all_to_all_single {tag} = gloo", same(out, g))
        # Split sizes along dim 0 (rows of 2 elements): rank r sends q + r + 1 rows to rank q
        # (m - 1 more for the large case), so every pair's count differs.
        def rows(src, dst):
            return dst + src + 1 + (m - 3)

        send = [rows(rank, q) for q in range(n)]
        recv = [rows(q, rank) for q in range(n)]
        x = val(rank, (sum(send), 2), dt, salt=5)
        out = torch.full((sum(recv), 2), -1).to(dt)
        w = dist.all_to_all_single(out, x, recv, send, async_op=True)
        w.wait()
        ref = torch.cat(
            [val(q, (sum(rows(q, p) for p in range(n)), 2), dt, salt=5)[sum(rows(q, p) for p in range(rank)) :][: rows(q, rank)] for q in range(n)]
        )
        check(f"all_to_all_single splits {tag}", same(out, ref))
        if dt is not torch.int8:
            g = torch.full((sum(recv), 2), -1).to(dt)
            dist.all_to_all_single(g, x, recv, send, group=gloo)
            check(f"all_to_all_single splits {tag} = gloo", same(out, g))
        # all_to_all, list form: separate tensors (staged), and chunks of one tensor (zero-copy),
        # with a different size to each rank.
        ins = [val(rank, (q + 1 + m,), dt, salt=q) for q in range(n)]
        outs = [torch.full((rank + 1 + m,), -1).to(dt) for _ in range(n)]
        dist.all_to_all(outs, ins)
        ref = [val(q, (rank + 1 + m,), dt, salt=rank) for q in range(n)]
        check(f"all_to_all {tag}", all(same(o, r) for o, r in zip(outs, ref)))
        big_in, big_out = torch.cat(ins), torch.full((n * (rank + 1 + m),), -1).to(dt)
        outs = list(big_out.split(rank + 1 + m))
        w = dist.all_to_all(outs, list(big_in.split([q + 1 + m for q in range(n)])), async_op=True)
        check(f"all_to_all chunks {tag}", all(same(o, r) for o, r in zip(w.get_future().wait(), ref)) and w.is_completed())
        check(f"all_to_all chunks in place {tag}", same(big_out, torch.cat(ref)))
        # gather, scatter, reduce: every rank as the root.
        for root in range(n):
            x = val(rank, (m, 2), dt, salt=root)
            gl = [torch.full((m, 2), -1).to(dt) for _ in range(n)] if rank == root else None
            dist.gather(x, gl, dst=root)
            if rank == root:
                check(f"gather root {root} {tag}", all(same(o, val(q, (m, 2), dt, salt=root)) for q, o in enumerate(gl)))
                whole = torch.full((n, m, 2), -1).to(dt)
                w = dist.gather(x, list(whole.unbind(0)), dst=root, async_op=True)
                w.wait()
                check(f"gather into one tensor root {root} {tag}", same(whole, torch.stack([val(q, (m, 2), dt, salt=root) for q in range(n)])))
                if dt not in (torch.int8, torch.bfloat16):
                    gg = [torch.full((m, 2), -1).to(dt) for _ in range(n)]
                    dist.gather(x, gg, dst=root, group=gloo)
                    check(f"gather root {root} {tag} = gloo", all(same(a, b) for a, b in zip(gl, gg)))
            else:
                dist.gather(x, dst=root)  # the root's second gather
                if dt not in (torch.int8, torch.bfloat16):
                    dist.gather(x, dst=root, group=gloo)
            sl = [val(q, (m,), dt, salt=root + 9) for q in range(n)] if rank == root else None
            out = torch.full((m,), -1).to(dt)
            w = dist.scatter(out, sl, src=root, async_op=True)
            w.wait()
            check(f"scatter root {root} {tag}", same(out, val(rank, (m,), dt, salt=root + 9)))
            if dt not in (torch.int8, torch.bfloat16):
                g = torch.full((m,), -1).to(dt)
                dist.scatter(g, sl, src=root, group=gloo)
                check(f"scatter root {root} {tag} = gloo", same(out, g))
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
                t = val(rank, (m,), dt, salt=root)
                dist.reduce(t, dst=root, op=op)
                parts = torch.stack([val(q, (m,), dt, salt=root) for q in range(n)]).to(torch.float64)
                exact = {dist.ReduceOp.SUM: parts.sum(0), dist.ReduceOp.MAX: parts.max(0).values, dist.ReduceOp.MIN: parts.min(0).values}[op]
                ref = exact.to(dt) if rank == root else val(rank, (m,), dt, salt=root)
                check(f"reduce {op} root {root} {tag}", same(t, ref))
                if dt not in (torch.int8, torch.bfloat16) and rank == root:
                    g = val(rank, (m,), dt, salt=root)
                    dist.reduce(g, dst=root, op=op, group=gloo)
                    check(f"reduce {op} root {root} {tag} = gloo", same(t, g))
                elif dt not in (torch.int8, torch.bfloat16):
                    dist.reduce(val(rank, (m,), dt, salt=root), dst=root, op=op, group=gloo)
            if dt.is_floating_point:
                t = val(rank, (m,), dt, salt=root)
                w = dist.reduce(t, dst=root, op=dist.ReduceOp.AVG, async_op=True)
                w.wait()
                exact = torch.stack([val(q, (m,), dt, salt=root) for q in range(n)]).to(torch.float64).sum(0).to(dt)
                ref = exact.div_(n) if rank == root else val(rank, (m,), dt, salt=root)
                check(f"reduce AVG root {root} {tag}", same(t, ref))

# A non-contiguous tensor to reduce and scatter into (a column): copied back on the root only.
mat = torch.zeros(5, 3)
mat[:, 1] = torch.arange(5.0) + rank
col = mat[:, 1]
dist.reduce(col, dst=n - 1)
want = torch.arange(5.0) * n + n * (n - 1) / 2 if rank == n - 1 else torch.arange(5.0) + rank
check("reduce non-contiguous", bool((mat[:, 1] == want).all()) and bool((mat[:, [0, 2]] == 0).all()))
dist.scatter(col, [torch.full((5,), 10.0 + q) for q in range(n)] if rank == 0 else None, src=0)
check("scatter non-contiguous", bool((mat[:, 1] == 10.0 + rank).all()) and bool((mat[:, [0, 2]] == 0).all()))
# In place: all_to_all_single with the same tensor as input and output.
t = val(rank, (n * 4,), torch.float32)
dist.all_to_all_single(t, t)
check("all_to_all_single in place", same(t, torch.cat([val(q, (n * 4,), torch.float32)[rank * 4 : (rank + 1) * 4] for q in range(n)])))


check.refused(
    "reduce_scatter PRODUCT refused",
    lambda: dist.reduce_scatter_tensor(torch.ones(2), torch.ones(2 * n), op=dist.ReduceOp.PRODUCT),
    ValueError,
    "SUM, AVG, PREMUL_SUM, MAX and MIN",
)
check.refused("reduce AVG of ints refused", lambda: dist.reduce(torch.ones(2, dtype=torch.int32), dst=0, op=dist.ReduceOp.AVG), ValueError, "floating-point")
check.refused(
    "bad split sizes refused",
    lambda: dist.all_to_all_single(torch.empty(4 * n), torch.empty(4 * n), [1] * n, [5] * n),
    ValueError,
    "sum to input.size(0)",
)
check.refused("unequal parts refused", lambda: dist.all_to_all_single(torch.empty(n + 1), torch.empty(n + 1)), ValueError, "split sizes")
t = torch.ones(2)
dist.all_reduce(t)
check("still usable", t.tolist() == [n, n])
dist.destroy_process_group()
check.result()
