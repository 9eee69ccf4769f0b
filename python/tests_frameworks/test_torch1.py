"""The backend on torch 1.x (Debian's python3-torch 1.13 in a venv over the system Python,
with the same wheel), under boltccl launch: every collective, DistributedDataParallel with
bit-identical parameters on every rank, and errors raised as boltccl's own exceptions. On
torch 1.x every call completes before it returns, so errors come at the call, not at wait()
(see ``_WORK_FROM_FUTURE`` in boltccl/torch.py)."""

import os
import subprocess

import pytest

from conftest import WORKERS, clean_env, results, run


@pytest.fixture(scope="module")
def py1():
    py = os.environ.get("BOLTCCL_TEST_TORCH1_PY")
    if not py:
        pytest.fail("BOLTCCL_TEST_TORCH1_PY is not set: run scripts/test-frameworks.sh, which builds that venv")
    version = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("1."), version.stdout + version.stderr
    return py


def launch(py, n, worker, *args, env=None):
    return run([py, "-m", "boltccl.launch", "-n", str(n), "--timeout", "200", str(WORKERS / worker), *args], env=env)


def test_every_collective_on_torch_1(py1):
    res = results(launch(py1, 2, "torch_collectives.py"))
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["checks"] > 25 for r in res), res


def test_ddp_on_torch_1_gives_the_same_parameters_everywhere(py1):
    res = results(launch(py1, 2, "train.py", "--backend", "boltccl", "--ddp", "--steps", "10"))
    assert len(res) == 2 and res[0]["params"] == res[1]["params"], res
    assert res[0]["losses"][-1] < res[0]["losses"][0], "it learns"


def test_an_error_on_torch_1_is_raised_at_the_call(py1):
    out = launch(py1, 2, "torch_errors.py", env=clean_env({"BOLTCCL_TIMEOUT_MS": "5000"}))
    res = [r for r in results(out) if r["rank"] == 0]
    assert res and res[0]["error"] in ("PeerLostError:peer_lost", "PeerLostError:aborted", "TimeoutError:timeout"), out
    assert res[0]["at"] == "call" and res[0]["seconds"] < 10, res
