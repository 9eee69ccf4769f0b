"""One side-by-side table of float32 all_sum from a JSON-lines file that holds the peers'
records (shared/bench/peers) and boltccl's (`boltccl bench --json`).

  python3 scripts/bench/peers-table.py RESULTS.jsonl

Latency: median over rounds of each round's figure (the slowest rank's median). Ratios:
boltccl's busbw over the best TCP peer's (MLX ring, Gloo, Open MPI over TCP), and boltccl's
latency over Open MPI's over TCP (below 1 is better); with a "boltccl-baseline" column (an older
build measured in the same run), boltccl's busbw over the baseline's.
"""
import json
import statistics
import sys
from collections import defaultdict

PEERS = ["boltccl", "boltccl-baseline", "mpi-tcp", "gloo", "mlx-ring", "mpi-shm"]
TCP_PEERS = ["mpi-tcp", "gloo", "mlx-ring"]


def human(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f and b % f == 0:
            return f"{b // f} {unit}"
    return f"{b} B"


def main():
    figs = defaultdict(list)
    for line in open(sys.argv[1]):
        if not line.strip():
            continue
        r = json.loads(line)
        if "peer" not in r or r.get("op", "all_sum") != "all_sum":
            continue
        figs[(r["peer"], r["n"], r["bytes"])].append(r["median_us"])
    ns = sorted({k[1] for k in figs})
    for n in ns:
        sizes = sorted({k[2] for k in figs if k[1] == n})
        present = [p for p in PEERS if any(k[0] == p and k[1] == n for k in figs)]
        print(f"\n### float32 all_sum, {n} ranks on this machine (latency us / busbw GB/s)\n")
        baseline = "boltccl-baseline" in present
        head = "| size | " + " | ".join(present) + " | busbw vs best TCP peer | latency vs mpi-tcp |"
        head += " busbw vs baseline |" if baseline else ""
        print(head)
        print("|" + "---|" * (len(present) + 3 + baseline))
        for b in sizes:
            cells, bus = [], {}
            for p in present:
                v = figs.get((p, n, b))
                if not v:
                    cells.append("—")
                    continue
                lat = statistics.median(v)
                bus[p] = b / (lat * 1e-6) / 1e9 * 2 * (n - 1) / n
                cells.append(f"{lat:,.1f} / {bus[p]:.3f}")
            best = max((bus[p] for p in TCP_PEERS if p in bus), default=None)
            ratio = f"{bus['boltccl'] / best:.2f}×" if best and "boltccl" in bus else "—"
            lat_ratio = "—"
            if "boltccl" in bus and "mpi-tcp" in bus:
                lat_ratio = f"{bus['mpi-tcp'] / bus['boltccl']:.2f}"
            row = f"| {human(b)} | " + " | ".join(cells) + f" | {ratio} | {lat_ratio} |"
            if baseline:
                both = "boltccl" in bus and "boltccl-baseline" in bus
                row += f" {bus['boltccl'] / bus['boltccl-baseline']:.2f}× |" if both else " — |"
            print(row)


if __name__ == "__main__":
    main()
