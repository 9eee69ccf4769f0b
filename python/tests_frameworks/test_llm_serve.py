"""`boltccl-llm serve` under `python -m boltccl.launch -n 2`, driven by the real `openai` client:
chat and completions, streamed and not (the same text either way), usage counts, and the
client's own exceptions for bad requests. Then ctrl-c (SIGINT to the whole job, as a terminal
sends it) stops every rank."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest

from conftest import PY, clean_env

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "target" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
QUESTION = "What is the capital of France? Answer in one sentence."


def server_binary() -> Path:
    """The example's binary (a no-op build when `cargo test` has built it)."""
    subprocess.run(
        ["cargo", "build", "-p", "boltccl-llm", "--bin", "boltccl-llm"], cwd=ROOT, check=True, timeout=1800
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "boltccl-llm"


class Job:
    """The launcher and its ranks, in a process group of their own; every output line kept."""

    def __init__(self, cmd):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            cmd,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        until = time.time() + timeout
        while time.time() < until:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None:
                pytest.fail(f"the job exited ({self.proc.returncode}) before {pattern!r}:\n{self.output()}")
            time.sleep(0.1)
        pytest.fail(f"no {pattern!r} within {timeout} s:\n{self.output()}")

    def group_alive(self) -> bool:
        self.proc.poll()  # a launcher that exited is reaped, not counted
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def kill(self):
        if self.group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def job():
    if not GGUF.exists():
        subprocess.run(["bash", str(ROOT / "examples" / "llm" / "fetch-model.sh")], check=True, timeout=600)
    binary = server_binary()
    j = Job([PY, "-m", "boltccl.launch", "-n", "2", "--", str(binary), "serve", "--model", str(GGUF), "--port", "0"])
    try:
        j.base = "http://" + j.wait_for(r"listening on http://(\S+)", 300).group(1) + "/v1"
        yield j
    finally:
        j.kill()


@pytest.fixture(scope="module")
def client(job):
    return openai.OpenAI(base_url=job.base, api_key="unused", timeout=300, max_retries=0)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == [MODEL_ID]


def test_chat_streamed_and_not_gives_the_same_answer(client):
    whole = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=24
    )
    text = whole.choices[0].message.content
    assert "Paris" in text, text
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_streamed_and_not_give_the_same_text(client):
    args = dict(model=MODEL_ID, prompt="The capital of France is", temperature=0, max_tokens=10)
    whole = client.completions.create(**args)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 10
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **args))
    assert streamed == whole.choices[0].text
    assert "Paris" in streamed, streamed


def test_bad_requests_raise_the_clients_own_errors(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], n=2)
    assert e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_ID, prompt="hello " * 9000, max_tokens=4)
    assert e.value.code == "context_length_exceeded"
    # ...and the server goes on.
    ok = client.completions.create(model=MODEL_ID, prompt="The capital of France is", temperature=0, max_tokens=4)
    assert ok.choices[0].text


def test_ctrl_c_stops_every_rank(job, client):
    # Last in this module: SIGINT to the whole job, as a terminal's ctrl-c; rank 0 tells rank 1
    # to stop, and every process of the job is gone within the deadline.
    os.killpg(job.proc.pid, signal.SIGINT)
    until = time.time() + 120
    while job.group_alive() and time.time() < until:
        time.sleep(0.2)
    assert not job.group_alive(), f"ranks still running 120 s after ctrl-c:\n{job.output()}"
