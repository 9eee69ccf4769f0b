#!/usr/bin/env bash
# Python vs Rust all_sum on loopback: 4-byte latency, the cost of the call itself (a one-rank
# group, no network: what a binding adds to), and 64 MiB float32 bus bandwidth. Rust is
# `boltccl bench`; Python is scripts/bench/bindings-allsum.py, the same measurement through the
# wheel installed in target/bindings-venv (scripts/test-bindings.sh). Runs them alternately
# ROUNDS times (default 3) and compares the best of each.
#   scripts/bench.sh bindings            BENCH_RANKS=4 ROUNDS=5 scripts/bench.sh bindings
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
py="${PYTHON:-$root/target/bindings-venv/bin/python}"
n="${BENCH_RANKS:-2}"
rounds="${ROUNDS:-3}"
"$py" -c "import boltccl" 2>/dev/null || { echo "install the wheel first: scripts/test-bindings.sh" >&2; exit 1; }
cargo build -q --release -p boltccl-cli -j"${CARGO_BUILD_JOBS:-1}"
bin="${CARGO_TARGET_DIR:-$root/target}/release/boltccl"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for round in $(seq "$rounds"); do
    common=(--ops all-sum --json "$out" --round "$round" --label rust)
    timeout 300 "$bin" bench -n "$n" --sizes 4,64M "${common[@]}" >/dev/null
    timeout 300 "$bin" bench -n 1 --sizes 4 "${common[@]}" >/dev/null
    timeout 300 "$py" -m boltccl.launch -n "$n" --timeout 280 -- "$py" scripts/bench/bindings-allsum.py "$out" "$round" >/dev/null
    timeout 300 "$py" scripts/bench/bindings-allsum.py "$out" "$round" >/dev/null
done
"$py" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def best(api, n, size, key, pick):
    return pick(r[key] for r in rows if r["peer"] == api and r["n"] == n and r["bytes"] == size)
ranks = max(r["n"] for r in rows)
fig = {api: {"lat": best(api, ranks, 4, "median_us", min), "call": best(api, 1, 4, "median_us", min),
             "bw": best(api, ranks, 64 << 20, "busbw_gbps", max)} for api in ("rust", "python")}
for api, f in fig.items():
    print(f"  {api:6} {ranks} ranks: 4 B all_sum {f['lat']:8.2f} us (call alone {f['call']:.3f} us)"
          f"   64 MiB busbw {f['bw']:7.3f} GB/s")
extra = fig["python"]["lat"] - fig["rust"]["lat"]
call = fig["python"]["call"] - fig["rust"]["call"]
ratio = fig["python"]["bw"] / fig["rust"]["bw"]
print(f"python - rust 4 B all_sum, {ranks} ranks (best median of each; noisy on a loaded machine): {extra:+.2f} us")
print(f"python - rust 4 B all_sum call cost (one-rank group, no network): {call:+.3f} us "
      f"(target <= 3 us): {'PASS' if call <= 3 else 'FAIL'}")
print(f"python / rust bus bandwidth: {ratio:.1%} (target >= 95%): {'PASS' if ratio >= 0.95 else 'FAIL'}")
PY
