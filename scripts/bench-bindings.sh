#!/usr/bin/env bash
# Python vs Rust all_sum, 2 ranks on loopback: 4-byte latency and 64 MiB float32 bus
# bandwidth. Needs the wheel installed in target/bindings-venv (scripts/test-bindings.sh).
# Runs Rust and Python alternately ROUNDS times (default 3) and compares the best of each.
#   scripts/bench-bindings.sh            BENCH_RANKS=4 ROUNDS=5 scripts/bench-bindings.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="${PYTHON:-$root/target/bindings-venv/bin/python}"
n="${BENCH_RANKS:-2}"
rounds="${ROUNDS:-3}"
"$py" -c "import boltccl" 2>/dev/null || { echo "install the wheel first: scripts/test-bindings.sh" >&2; exit 1; }
cargo build -q --release -p boltccl --example allsum_bench -j"${CARGO_BUILD_JOBS:-1}"
rust="${CARGO_TARGET_DIR:-$root/target}/release/examples/allsum_bench"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for _ in $(seq "$rounds"); do
    timeout 300 "$py" -m boltccl.launch -n "$n" --timeout 280 -- "$rust" | grep -o 'BENCH .*' >>"$out"
    timeout 300 "$py" -m boltccl.launch -n "$n" --timeout 280 -- "$py" scripts/bench_allsum.py | grep -o 'BENCH .*' >>"$out"
done
"$py" - "$out" <<'PY'
import json, sys
rows = [json.loads(l[6:]) for l in open(sys.argv[1])]
for r in rows:
    print(f"  {r['api']:6} {r['ranks']} ranks: 4 B all_sum {r['lat_us']:8.2f} us (call alone {r['call_us']:.3f} us)"
          f"   64 MiB busbw {r['busbw_gbs']:7.3f} GB/s")
best = {api: {"lat": min(r["lat_us"] for r in rows if r["api"] == api),
              "call": min(r["call_us"] for r in rows if r["api"] == api),
              "bw": max(r["busbw_gbs"] for r in rows if r["api"] == api)} for api in ("rust", "python")}
extra = best["python"]["lat"] - best["rust"]["lat"]
call = best["python"]["call"] - best["rust"]["call"]
ratio = best["python"]["bw"] / best["rust"]["bw"]
print(f"best: rust {best['rust']['lat']:.2f} us / {best['rust']['bw']:.3f} GB/s; "
      f"python {best['python']['lat']:.2f} us / {best['python']['bw']:.3f} GB/s")
print(f"python - rust 4 B all_sum, 2 ranks (best median of each; noisy on a loaded machine): {extra:+.2f} us")
print(f"python - rust 4 B all_sum call cost (one-rank group, no network): {call:+.3f} us "
      f"(target <= 3 us): {'PASS' if call <= 3 else 'FAIL'}")
print(f"python / rust bus bandwidth: {ratio:.1%} (target >= 95%): {'PASS' if ratio >= 0.95 else 'FAIL'}")
PY
