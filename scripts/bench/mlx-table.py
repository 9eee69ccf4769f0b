"""Tables for scripts/bench/mlx.sh.

  python mlx-table.py ALLSUM.jsonl     mx.distributed.all_sum through MLX's ring backend, MLX's
                                       mpi backend on Open MPI, on libboltccl_mpi, and `boltccl
                                       bench`: latency (the slowest rank's median, median over
                                       rounds) and busbw, with the ratios the bench is for
  python mlx-table.py --lm LM.txt      mlx-lm generation: seconds and decode tok/s per run
"""

import json
import statistics
import sys
from collections import defaultdict

COLS = ["mlx-ring", "mlx-openmpi", "mlx-boltccl", "boltccl-bench"]


def human(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f and b % f == 0:
            return f"{b // f} {unit}"
    return f"{b} B"


def allsum(path):
    figs = defaultdict(list)
    for line in open(path):
        r = json.loads(line) if line.strip() else {}
        if r.get("peer") in COLS and r.get("op", "all_sum") in ("all_sum", "all-sum"):
            figs[(r["peer"], r["n"], r["bytes"])].append(r["median_us"])
    for n in sorted({k[1] for k in figs}):
        print(f"\n### mx.distributed.all_sum float32, {n} ranks on this machine (latency µs / busbw GB/s)\n")
        extra = ["ring / boltccl latency", "boltccl / openmpi latency", "boltccl / openmpi busbw", "MPI layer over bench"]
        print("| size | " + " | ".join(COLS + extra) + " |")
        print("|" + "---|" * (1 + len(COLS) + len(extra)))
        for b in sorted({k[2] for k in figs if k[1] == n}):
            lat = {p: statistics.median(figs[(p, n, b)]) for p in COLS if figs.get((p, n, b))}
            bus = {p: b / (v * 1e-6) / 1e9 * 2 * (n - 1) / n for p, v in lat.items()}
            cells = [f"{lat[p]:,.1f} / {bus[p]:.3f}" if p in lat else "—" for p in COLS]

            def r(a, c, fmt, d=lat):
                return fmt.format(d[a] / d[c]) if a in d and c in d else "—"

            cells += [
                r("mlx-ring", "mlx-boltccl", "{:.1f}×"),
                r("mlx-boltccl", "mlx-openmpi", "{:.2f}"),
                r("mlx-boltccl", "mlx-openmpi", "{:.2f}×", bus),
                f"{lat['mlx-boltccl'] - lat['boltccl-bench']:+.1f} µs" if "mlx-boltccl" in lat and "boltccl-bench" in lat else "—",
            ]
            print(f"| {human(b)} | " + " | ".join(cells) + " |")


def lm(path):
    print("\n### mlx-lm greedy generation, SmolLM2-135M-Instruct (float32), same run\n")
    print("| run | tokens | seconds (slowest rank) | decode tok/s | prefill tok/s | same text as TP=1 |")
    print("|---|---|---|---|---|---|")
    title, rows, base = None, [], None
    for line in open(path):
        if line.startswith("== "):
            title = line[3:].strip()
        elif "RESULT " in line:
            rows.append((title, json.loads(line.split("RESULT ", 1)[1])))
    by = defaultdict(list)
    for t, r in rows:
        by[t].append(r)
    for t, rs in by.items():
        base = base or rs[0]["text"]
        slow = max(rs, key=lambda r: r["seconds"])
        same = all(r["text"] == base for r in rs)
        print(
            f"| {t} | {slow['tokens']} | {slow['seconds']:.2f} | {min(r['decode_tok_s'] for r in rs):.2f} | "
            f"{min(r['prefill_tok_s'] for r in rs):.2f} | {'yes' if same else 'NO'} |"
        )


if sys.argv[1] == "--lm":
    lm(sys.argv[2])
else:
    allsum(sys.argv[1])
