"""The torch.distributed backend "boltccl" with torch 2.x, under torchrun and boltccl launch:
every collective, errors at wait(), a data-parallel training loop whose parameters are
bit-identical on every rank and across runs, the same losses as Gloo, and DDP."""

import pytest
import torch

from conftest import PY, WORKERS, clean_env, results, run

TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone"]


def torchrun(n, worker, *args, timeout=240):
    return results(run([*TORCHRUN, "--nproc-per-node", str(n), str(WORKERS / worker), *args], timeout=timeout))


def test_torch_is_2x():
    assert int(torch.__version__.split(".")[0]) >= 2, torch.__version__


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_under_torchrun(n):
    res = torchrun(n, "torch_collectives.py")
    assert [r["rank"] for r in res] == list(range(n))
    assert all(r["checks"] > 25 for r in res), res  # every check asserts on its rank


def test_every_collective_under_boltccl_launch():
    out = run([PY, "-m", "boltccl.launch", "-n", "3", "--timeout", "200", str(WORKERS / "torch_collectives.py")])
    res = results(out)
    assert [r["rank"] for r in res] == [0, 1, 2], out


@pytest.mark.parametrize("elements", [1, 1 << 16], ids=["inline", "started"])
def test_an_error_surfaces_at_wait_as_boltcccl_raises_it(elements):
    out = run(
        [*TORCHRUN, "--nproc-per-node", "2", str(WORKERS / "torch_errors.py"), str(elements)],
        env=clean_env({"BOLTCCL_TIMEOUT_MS": "5000"}),
    )
    res = [r for r in results(out) if r["rank"] == 0]
    assert res and res[0]["error"] in ("PeerLostError:peer_lost", "PeerLostError:aborted", "TimeoutError:timeout"), out
    assert res[0]["at"] == "wait", res
    assert res[0]["seconds"] < 10, res


def train(backend, *extra, n=2):
    res = torchrun(n, "train.py", "--backend", backend, *extra)
    assert len(res) == n
    return res


def test_training_is_bit_identical_across_ranks_and_runs_and_matches_gloo():
    first, second = train("boltccl"), train("boltccl")
    digests = {r["params"] for r in first + second}
    assert len(digests) == 1, "parameters differ between ranks or runs"
    assert first[0]["losses"] == second[0]["losses"]
    gloo = train("gloo")
    assert all(r["params"] == gloo[0]["params"] for r in gloo)
    for a, b in zip(first[0]["losses"], gloo[0]["losses"]):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (a, b)
    assert first[0]["losses"][-1] < first[0]["losses"][0] / 2, "it learns"


def test_distributed_data_parallel():
    ddp = train("boltccl", "--ddp")
    assert len({r["params"] for r in ddp}) == 1, "DDP left the ranks with different parameters"
    manual = train("boltccl")
    for a, b in zip(ddp[0]["losses"], manual[0]["losses"]):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (a, b)
