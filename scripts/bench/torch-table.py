"""The table of scripts/bench/torch.sh: medians over rounds of each backend's slowest-rank
median; latency in us / busbw in GB/s."""

import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1])]
cell = defaultdict(list)
for r in rows:
    bw = r.get("busbw_gbps", r.get("busbw_GBps"))
    cell[(r["peer"], r["n"], r["bytes"])].append((r["median_us"], bw))


def med(peer, n, size):
    v = cell.get((peer, n, size))
    if not v:
        return None
    return statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)


def human(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else (f"{b >> 10} KiB" if b >= 1024 else f"{b} B")


torch_version = next((r["torch"] for r in rows if "torch" in r), "?")
rounds = max(r.get("round", 1) for r in rows)
for n in sorted({r["n"] for r in rows}):
    print(f"\n#### float32 all_reduce, {n} ranks, torch {torch_version} (latency us / busbw GB/s; medians of {rounds} rounds)\n")
    print("| size | torch + boltccl | torch + gloo | busbw boltccl / gloo | latency boltccl / gloo | boltccl bench |")
    print("|---|---|---|---|---|---|")
    for size in sorted({r["bytes"] for r in rows if r["peer"] == "torch+boltccl" and r["n"] == n}):
        b, g, raw = med("torch+boltccl", n, size), med("torch+gloo", n, size), med("boltccl-bench", n, size)
        fmt = lambda c: f"{c[0]:,.1f} / {c[1]:.3f}" if c else "—"  # noqa: E731
        ratio_bw = f"{b[1] / g[1]:.2f}×" if b and g and g[1] > 0 and size >= 1024 else "—"
        ratio_lat = f"{b[0] / g[0]:.2f}" if b and g else "—"
        print(f"| {human(size)} | {fmt(b)} | {fmt(g)} | {ratio_bw} | {ratio_lat} | {fmt(raw)} |")
    b4, r4 = med("torch+boltccl", n, 4), med("boltccl-bench", n, 4)
    b64, r64 = med("torch+boltccl", n, 64 << 20), med("boltccl-bench", n, 64 << 20)
    if b4 and r4:
        print(f"\ntorch layer at 4 B: {b4[0] - r4[0]:+.1f} us over `boltccl bench` ({r4[0]:.1f} us)")
    if b64 and r64:
        print(f"torch layer at 64 MiB: busbw {b64[1] / r64[1] * 100:.0f}% of `boltccl bench` ({r64[1]:.3f} GB/s)")
