"""all_to_all_single, all_to_all, gather, scatter and reduce through the torch.distributed
backend "boltccl", under torchrun and boltccl launch at 2 and 3 ranks, against exact references
and Gloo's results computed in the same run; PREMUL_SUM, AVG, the coalesced calls and sequence
numbers; abort() and shutdown() of the group."""

import pytest

from conftest import PY, WORKERS, clean_env, results, run

TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone"]


@pytest.mark.parametrize("n", [2, 3])
def test_all_to_all_gather_scatter_reduce_under_torchrun(n):
    res = results(run([*TORCHRUN, "--nproc-per-node", str(n), str(WORKERS / "torch_ops.py")], timeout=300))
    assert [r["rank"] for r in res] == list(range(n))
    assert all(r["checks"] > 150 for r in res), res  # every check asserts on its rank


@pytest.mark.parametrize("n", [2, 3])
def test_all_to_all_gather_scatter_reduce_under_boltccl_launch(n):
    out = run([PY, "-m", "boltccl.launch", "-n", str(n), "--timeout", "280", str(WORKERS / "torch_ops.py")], timeout=300)
    res = results(out)
    assert [r["rank"] for r in res] == list(range(n)), out
    assert all(r["checks"] > 150 for r in res), res


@pytest.mark.parametrize("n", [2, 3])
def test_premul_sum_avg_coalesced_and_sequence_numbers(n):
    # PREMUL_SUM (float and tensor factors), AVG in every float dtype, the coalesced
    # all_gather_into_tensor / reduce_scatter_tensor, sequence numbers against Gloo's, and
    # the errors for bad inputs: exact values on every rank.
    out = run([*TORCHRUN, "--nproc-per-node", str(n), str(WORKERS / "torch_reduce_ops.py")], timeout=300)
    res = results(out)
    assert [r["rank"] for r in res] == list(range(n)), out
    assert all(r["checks"] > 160 for r in res), res


def abort_worker(mode):
    # A deadline far above the times checked: a call that fails only at the deadline fails.
    env = clean_env({"BOLTCCL_TIMEOUT_MS": "20000"})
    out = run([*TORCHRUN, "--nproc-per-node", "2", str(WORKERS / "torch_abort.py"), mode], env=env, timeout=120)
    res = results(out)
    assert [r["rank"] for r in res] == [0, 1], out
    return res


def test_abort_stops_blocked_calls_on_every_rank_at_once():
    res = abort_worker("abort")
    for r in res:
        assert r["error"] == "PeerLostError:aborted", res
        assert r["seconds"] < 5, res  # the abort comes after 0.5 s; the deadline is 20 s
    assert res[0]["after"] == "PeerLostError:aborted", res


def test_shutdown_releases_the_group():
    res = abort_worker("shutdown")
    assert res[0]["after"] == "shut down", res
    # Rank 1's call learns that rank 0 released the group, well before the deadline.
    assert res[1]["error"] in ("PeerLostError:peer_lost", "PeerLostError:aborted"), res
    assert res[1]["seconds"] < 5, res
