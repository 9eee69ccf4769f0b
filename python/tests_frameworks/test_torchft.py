"""torchft over boltccl (boltccl.torchft.ProcessGroupBoltccl): torchft's lighthouse and two
replica groups (one process each) train a small model with torchft's Manager and
DistributedDataParallel. One replica is SIGKILLed mid-training; the survivor reconfigures to
a group of one and keeps committing steps; a replacement with the same replica id starts,
rejoins, recovers the weights from the survivor (torchft's HTTP checkpoint transport), and both
train on together. The final parameters of both are bit-identical. Also the process group by
itself (workers/torchft_pg.py): errors reported by errored(), never raised, and a
reconfigure that recovers. Fails (never skips) without torchft."""

import json
import os
import signal
import subprocess
import threading
import time
from typing import List, Optional

import pytest

from conftest import PY, WORKERS, clean_env, results, run

WORKER = str(WORKERS / "torchft_train.py")
DEADLINE_S = 150  # the whole test; 25-30 s on two cores shared with other jobs
STEPS = 20  # steps each replica commits (with both replicas in the last) before it stops


class Replica:
    """One replica-group process, its output read as it comes (STEP records parsed)."""

    def __init__(self, rid: int, lighthouse: str, *extra: str, dies: bool = False):
        self.rid = rid
        self.killed = dies  # a replica told to die is expected to end by SIGKILL
        self.died_at: Optional[float] = None
        self.lines: List[str] = []
        self.steps: List[dict] = []
        self.proc = subprocess.Popen(
            [PY, WORKER, "--replica-id", str(rid), "--lighthouse", lighthouse, "--steps", str(STEPS), *extra],
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("STEP "):
                self.steps.append(json.loads(line[5:]))
            elif line.startswith("DYING "):
                self.died_at = json.loads(line[6:])["t"]

    def committed(self, since: float = 0.0, participants: Optional[int] = None) -> List[dict]:
        return [
            s
            for s in list(self.steps)
            if s["committed"] and s["t"] >= since and (participants is None or s["participants"] == participants)
        ]

    def kill(self) -> None:
        self.killed = True
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)

    def output(self) -> str:
        return "".join(self.lines[-60:])


@pytest.mark.parametrize("kill", ["between_steps", "in_all_reduce"])
def test_a_killed_replica_is_replaced_and_recovers_the_survivors_weights(kill, tmp_path):
    """`between_steps`: the test SIGKILLs the replica at whatever point it is (mostly between
    collectives: the survivor's next quorum drops it once its heartbeats stop). `in_all_reduce`:
    the replica SIGKILLs itself inside a step, after the quorum, so that the survivor's
    all_reduce over boltccl loses its peer: boltccl.PeerLostError, the step is not committed,
    and the next quorum reconfigures."""
    try:
        from torchft._torchft import LighthouseServer
    except ImportError as e:
        pytest.fail(f"torchft is not installed ({e}): pip install torchft==0.2.0 (python/requirements-frameworks.txt)")

    start = time.time()
    deadline = start + DEADLINE_S
    replicas: List[Replica] = []

    def wait_for(what: str, cond) -> None:
        while not cond():
            for r in replicas:
                if not r.killed and r.proc.poll() not in (None, 0):
                    pytest.fail(f"replica {r.rid} exited {r.proc.returncode} while waiting for {what}:\n{r.output()}")
            if time.time() > deadline:
                logs = "\n".join(f"--- replica {r.rid}:\n{r.output()}" for r in replicas)
                pytest.fail(f"no {what} within {DEADLINE_S} s:\n{logs}")
            time.sleep(0.05)

    # A dead replica leaves the quorum once its heartbeats are 1 s old (the default is 5 s).
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=2000, heartbeat_timeout_ms=1000)
    try:
        die = ["--die-after-steps-together", "3"] if kill == "in_all_reduce" else []
        a, b = Replica(0, lighthouse.address()), Replica(1, lighthouse.address(), *die, dies=bool(die))
        # The replacement (the same replica id) starts now and waits, imported, for its cue.
        cue = tmp_path / "start-replacement"
        c = Replica(1, lighthouse.address(), "--start-when", str(cue))
        replicas += [a, b, c]
        if die:
            wait_for("the replica's death", lambda: b.proc.poll() is not None)
            assert b.proc.returncode == -signal.SIGKILL and b.died_at is not None, b.output()
            killed_at = b.died_at
        else:
            wait_for("steps with both replicas", lambda: len(b.committed(participants=2)) >= 3)
            killed_at = time.time()
            b.kill()
        step_at_kill = max(s["step"] for s in a.committed() if s["t"] <= killed_at)
        wait_for("steps of the survivor alone", lambda: len(a.committed(since=killed_at, participants=1)) >= 3)
        alone = a.committed(since=killed_at, participants=1)
        first_alone = alone[0]
        assert alone[-1]["step"] > step_at_kill, (step_at_kill, alone)
        failed = [s for s in a.steps if s["t"] >= killed_at and not s["committed"]]
        if die:  # the survivor's all_reduce saw the peer go, and that step was not committed;
            # the step's later buckets ran on the broken group and did not stop training
            assert failed and "PeerLostError" in (failed[0]["error"] or ""), (failed, a.output())
            assert failed[0]["all_reduces"] >= 2, failed

        wait_for("the replacement to be ready", lambda: any(line.startswith("READY") for line in c.lines))
        replaced_at = time.time()
        step_at_replace = max(s["step"] for s in a.committed())
        cue.touch()
        wait_for("the end of training", lambda: a.proc.poll() == 0 and c.proc.poll() == 0)
        for r in (a, c):
            r._reader.join(timeout=10)

        # The survivor's step count only rose, through the kill and the replacement.
        a_steps = [s["step"] for s in a.committed()]
        assert a_steps == sorted(a_steps) and len(set(a_steps)) == len(a_steps), a_steps
        # The replacement did not start over: its first committed step is past the survivor's
        # step when it started (it got the step and the weights from the survivor).
        c_first = c.committed()[0]
        assert c_first["step"] > step_at_replace, (c_first, step_at_replace)
        res = results("".join(a.lines) + "".join(c.lines))
        assert len(res) == 2, res
        assert res[0]["step"] == res[1]["step"] >= STEPS, res
        assert res[0]["digest"] == res[1]["digest"], (res, a.output(), c.output())

        rejoined = [s for s in a.committed(since=replaced_at) if s["participants"] == 2]
        alone = [s for s in a.committed(since=killed_at, participants=1) if s["t"] < rejoined[0]["t"]]
        print(
            f"\ntorchft over boltccl ({kill}): kill -> survivor's next committed step "
            f"{first_alone['t'] - killed_at:.2f} s (reconfigure to one replica {first_alone['configure_s']:.3f} s; "
            f"the step it lost: {[f['error'] for f in failed[:1]]}); replacement started -> first step together "
            f"{rejoined[0]['t'] - replaced_at:.2f} s (reconfigure to two {rejoined[0]['configure_s']:.3f} s); "
            f"{len(alone)} steps alone; final step {res[0]['step']}; {time.time() - start:.1f} s in all"
        )
    finally:
        for r in replicas:
            r.kill()
        lighthouse.shutdown()


def test_the_process_group_reports_errors_and_recovers_on_configure():
    res = results(run([PY, str(WORKERS / "torchft_pg.py")], timeout=120))
    assert len(res) == 1 and "pip install torchft" in res[0]["missing"], res
    assert res[0]["not_formed_s"] < 10, res  # the configure timeout (2 s), not a hang
    print(f"\nboltccl.torchft: one-rank configure {res[0]['configure_s'] * 1e3:.1f} ms")
