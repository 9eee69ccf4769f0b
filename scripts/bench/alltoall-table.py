"""Tables of float32 all_to_all from `scripts/bench.sh alltoall`'s JSON lines: boltccl's
columns and the peers', latency (µs) / bus bandwidth (GB/s, nccl-tests: algbw × (n-1)/n, with
algbw = the bytes of one rank's whole input / time), then the ratios.

  python3 scripts/bench/alltoall-table.py RESULTS.jsonl

Ratios: boltccl against Open MPI's shared memory, boltccl-tcp against Open MPI over TCP and
the best TCP peer (Open MPI TCP, Gloo), and boltccl through torch (torch-boltccl, shared memory)
against Gloo through torch; a latency ratio below 1 and a busbw ratio above 1 mean boltccl is
ahead. "pairwise / at once": the time of BOLTCCL_ALGO=ring (pairwise rounds) over
that of auto (every peer at once), over shared memory and TCP: above 1, the rounds are slower.
With several rounds in the file, each cell is the median over them, and "shm: rounds ahead"
pairs boltccl with Open MPI's shared memory round by round (the bench runs the two one after
the other): in how many rounds boltccl took less time, and the median of the rounds' latency
ratios, which a slow state of the machine falling on one column of a round moves less than
it moves the ratio of the medians; "tcp: rounds ahead" pairs boltccl-tcp with Open MPI over
TCP the same way. A boltccl-baseline column
(an older build, BOLTCCL_BASELINE) adds "vs baseline": boltccl's latency over its.
"""
import json
import statistics
import sys
from collections import defaultdict

COLS = ["boltccl", "boltccl-baseline", "boltccl-pairwise", "mpi-shm", "boltccl-tcp", "boltccl-tcp-pairwise", "mpi-tcp", "gloo", "torch-boltccl"]


def human(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f and b % f == 0:
            return f"{b // f} {unit}"
    return f"{b} B"


def main(path):
    figs = defaultdict(list)
    for line in open(path):
        r = json.loads(line) if line.strip() else {}
        if r.get("op") == "all_to_all" and "peer" in r:
            figs[(r["peer"], r["n"], r["bytes"])].append(r["median_us"])
            if r.get("correct") is False:
                print(f"WRONG RESULT: {r['peer']} n={r['n']} {human(r['bytes'])}")
    for n in sorted({k[1] for k in figs}):
        cols = [c for c in COLS if any(k[0] == c and k[1] == n for k in figs)]
        base = any(k[0] == "boltccl-baseline" and k[1] == n for k in figs)
        extra = (["vs baseline"] if base else []) + ["latency vs mpi-shm", "busbw vs mpi-shm", "shm: rounds ahead, median ratio", "tcp: latency vs mpi-tcp", "tcp: busbw vs best TCP peer", "tcp: rounds ahead, median ratio", "torch: latency vs gloo", "torch: busbw vs gloo", "pairwise / at once (shm)", "pairwise / at once (tcp)"]
        print(f"\n### float32 all_to_all, {n} ranks (latency µs / busbw GB/s)\n")
        print("| size | " + " | ".join(cols + extra) + " |")
        print("|" + "---|" * (1 + len(cols) + len(extra)))
        for b in sorted({k[2] for k in figs if k[1] == n}):
            lat = {c: statistics.median(figs[(c, n, b)]) for c in cols if figs.get((c, n, b))}
            bus = {c: b / (t * 1e-6) / 1e9 * (n - 1) / n for c, t in lat.items()}
            # Two decimals under 10 µs: the small cells differ by tenths.
            cells = [f"{lat[c]:,.{2 if lat[c] < 10 else 1}f} / {bus[c]:.3f}" if c in lat else "—" for c in cols]

            def r(a, d, fmt, m=lat):
                return fmt.format(m[a] / m[d]) if a in m and d in m and m[d] else "—"

            def paired(a, d):
                xs, ys = figs.get((a, n, b), []), figs.get((d, n, b), [])
                if len(xs) < 2 or len(xs) != len(ys):
                    return "—"
                ratios = [x / y for x, y in zip(xs, ys)]
                return f"{sum(q < 1 for q in ratios)}/{len(ratios)}, {statistics.median(ratios):.2f}"

            best_tcp = max((p for p in ("mpi-tcp", "gloo") if p in bus), key=lambda p: bus[p], default=None)
            cells += [r("boltccl", "boltccl-baseline", "{:.2f}")] if base else []
            cells += [
                r("boltccl", "mpi-shm", "{:.2f}"),
                r("boltccl", "mpi-shm", "{:.2f}×", bus),
                paired("boltccl", "mpi-shm"),
                r("boltccl-tcp", "mpi-tcp", "{:.2f}"),
                r("boltccl-tcp", best_tcp, "{:.2f}×", bus) if best_tcp else "—",
                paired("boltccl-tcp", "mpi-tcp"),
                r("torch-boltccl", "gloo", "{:.2f}"),
                r("torch-boltccl", "gloo", "{:.2f}×", bus),
                r("boltccl-pairwise", "boltccl", "{:.2f}"),
                r("boltccl-tcp-pairwise", "boltccl-tcp", "{:.2f}"),
            ]
            print(f"| {human(b)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
