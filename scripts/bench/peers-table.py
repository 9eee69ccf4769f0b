"""One side-by-side table of float32 all_sum from a JSON-lines file that holds the peers'
records (shared/bench/peers) and boltccl's (`boltccl bench --json`).

  python3 scripts/bench/peers-table.py RESULTS.jsonl

Latency: median over rounds of each round's figure (the slowest rank's median). Columns:
"boltccl" is the default (shared memory between ranks of one host), "boltccl-tcp" the same
build with BOLTCCL_BACKEND=tcp, "boltccl-baseline" an older build measured in the same run.
Ratios compare like with like: boltccl against Open MPI's shared memory (vader) and
boltccl-tcp against Open MPI over TCP and the best TCP peer (MLX ring, Gloo, Open MPI).
A latency ratio below 1 and a busbw ratio above 1 mean boltccl is ahead. Below the tables: the
machine's memcpy and add bandwidth (limits.py) beside boltccl's best busbw at each rank count.
"""
import json
import statistics
import sys
from collections import defaultdict

PEERS = ["boltccl", "boltccl-tcp", "boltccl-baseline", "mpi-shm", "mpi-tcp", "gloo", "mlx-ring"]
TCP_PEERS = ["mpi-tcp", "gloo", "mlx-ring"]


def human(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f and b % f == 0:
            return f"{b // f} {unit}"
    return f"{b} B"


def load(path):
    figs, limits = defaultdict(list), defaultdict(list)
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        if "limit" in r and "GBps" in r:
            limits[r["limit"]].append(r["GBps"])
        if "peer" not in r or r.get("op", "all_sum") != "all_sum":
            continue
        figs[(r["peer"], r["n"], r["bytes"])].append(r["median_us"])
    return figs, limits


def ratio(num, den, fmt):
    return fmt.format(num / den) if num is not None and den else "—"


def table(figs, n):
    """Prints one rank count's table; returns boltccl's best busbw (GB/s) in it."""
    sizes = sorted({k[2] for k in figs if k[1] == n})
    present = [p for p in PEERS if any(k[0] == p and k[1] == n for k in figs)]
    print(f"\n### float32 all_sum, {n} ranks on this machine (latency µs / busbw GB/s)\n")
    extra = [
        "latency vs mpi-shm",
        "busbw vs mpi-shm",
        "tcp: latency vs mpi-tcp",
        "tcp: busbw vs best TCP peer",
    ]
    if "boltccl-baseline" in present:
        extra.append("busbw vs baseline")
    print("| size | " + " | ".join(present + extra) + " |")
    print("|" + "---|" * (1 + len(present) + len(extra)))
    best = 0.0
    for b in sizes:
        cells, lat, bus = [], {}, {}
        for p in present:
            v = figs.get((p, n, b))
            if not v:
                cells.append("—")
                continue
            lat[p] = statistics.median(v)
            bus[p] = b / (lat[p] * 1e-6) / 1e9 * 2 * (n - 1) / n
            cells.append(f"{lat[p]:,.1f} / {bus[p]:.3f}")
        best = max(best, bus.get("boltccl", 0.0))
        tcp_best = max((bus[p] for p in TCP_PEERS if p in bus), default=None)
        cells += [
            ratio(lat.get("boltccl"), lat.get("mpi-shm"), "{:.2f}"),
            ratio(bus.get("boltccl"), bus.get("mpi-shm"), "{:.2f}×"),
            ratio(lat.get("boltccl-tcp"), lat.get("mpi-tcp"), "{:.2f}"),
            ratio(bus.get("boltccl-tcp"), tcp_best, "{:.2f}×"),
        ]
        if "boltccl-baseline" in present:
            cells.append(ratio(bus.get("boltccl"), bus.get("boltccl-baseline"), "{:.2f}×"))
        print(f"| {human(b)} | " + " | ".join(cells) + " |")
    return best


def main():
    figs, limits = load(sys.argv[1])
    best = {n: table(figs, n) for n in sorted({k[1] for k in figs})}
    memcpy = statistics.median(limits["memcpy"]) if limits.get("memcpy") else None
    add = statistics.median(limits["sum_in_place"]) if limits.get("sum_in_place") else None
    if memcpy:
        print("\n### Single-host limits (one core, 64 MiB buffers)\n")
        print(f"memcpy {memcpy:.2f} GB/s" + (f", in-place add {add:.2f} GB/s" if add else ""))
        for n, b in best.items():
            print(f"- {n} ranks: boltccl's best all_sum busbw {b:.2f} GB/s = {b / memcpy:.2f}× memcpy")


if __name__ == "__main__":
    main()
