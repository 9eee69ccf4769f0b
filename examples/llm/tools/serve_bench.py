#!/usr/bin/env python3
"""First-token latency and decode rate through `boltccl-llm serve` (streamed chat, measured by
the client) against the CLI on the same prompt, alternating runs; prints each run and the
medians. Standard library only.

    target/release/boltccl launch -n 2 -- target/release/boltccl-llm serve --model $M --port 8000 &
    python3 examples/llm/tools/serve_bench.py --runs 7 --max-tokens 128 \\
        --cli "target/release/boltccl launch -n 2 -- target/release/boltccl-llm --model $M"

API: first token = from sending the request to the first text chunk (HTTP, tokenising,
queueing, the command broadcast and the prefill); rate = the chunks after the first over the
time from the first to the last (one token a chunk unless a token ends inside a UTF-8
character). CLI: its own `prefill:` time (the first token) and `decode:` rate, which count the
same steps."""

import argparse
import http.client
import json
import re
import statistics
import subprocess
import time
from urllib.parse import urlparse


def api_run(base, model, prompt, max_tokens):
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                       "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first = last = None
    chunks = 0
    usage = None
    text = []
    buf = b""
    while True:
        line = resp.readline()
        if not line:
            break
        buf = line.strip()
        if not buf.startswith(b"data: "):
            continue
        data = buf[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for c in ev.get("choices", []):
            piece = c["delta"].get("content")
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
                text.append(piece)
    conn.close()
    rate = (chunks - 1) / (last - first) if chunks > 1 else float("nan")
    return first - t0, rate, usage["completion_tokens"], "".join(text)


def cli_run(cmd, prompt, max_tokens):
    out = subprocess.run(cmd.split() + ["--prompt", prompt, "--max-tokens", str(max_tokens)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    prefill = float(re.search(r"prefill: \d+ tokens in ([\d.]+)s", out.stderr).group(1))
    m = re.search(r"decode:\s+(\d+) tokens in [\d.]+s = ([\d.]+) tok/s", out.stderr)
    text = re.sub(r"^\[0\] ", "", out.stdout, flags=re.M)
    return prefill, float(m.group(2)), int(m.group(1)) + 1, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct.Q4_1")
    ap.add_argument("--prompt", default="Write a long story about a robot who learns to paint.")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cli", required=True, help="the CLI command line, without --prompt/--max-tokens")
    a = ap.parse_args()
    api_run(a.base, a.model, a.prompt, 8)  # warm-up
    api, cli = [], []
    for i in range(a.runs):
        c = cli_run(a.cli, a.prompt, a.max_tokens)
        r = api_run(a.base, a.model, a.prompt, a.max_tokens)
        cli.append(c)
        api.append(r)
        print(f"run {i + 1}: CLI first token {c[0] * 1e3:.1f} ms, {c[1]:.1f} tok/s ({c[2]} tokens) | "
              f"API first token {r[0] * 1e3:.1f} ms, {r[1]:.1f} tok/s ({r[2]} tokens)", flush=True)
    same = all(r[2] == c[2] for r, c in zip(api, cli))
    mc = (statistics.median(c[0] for c in cli), statistics.median(c[1] for c in cli))
    ma = (statistics.median(r[0] for r in api), statistics.median(r[1] for r in api))
    print(f"median CLI: first token {mc[0] * 1e3:.1f} ms, {mc[1]:.1f} tok/s")
    print(f"median API: first token {ma[0] * 1e3:.1f} ms, {ma[1]:.1f} tok/s")
    print(f"API vs CLI: first token {100 * (ma[0] / mc[0] - 1):+.1f}%, rate {100 * (ma[1] / mc[1] - 1):+.1f}%; "
          f"same token counts: {same}")


if __name__ == "__main__":
    main()
