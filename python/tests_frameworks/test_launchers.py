"""Each launcher boltccl starts under without configuration, run for real (2 and 4 ranks):
mlx.launch (ring and jaccl), torchrun, mpirun (Open MPI) and srun (a one-node Slurm cluster
that scripts/test-frameworks.sh starts). No BOLTCCL_* variable is set; each rank checks an
all_sum and an all_gather."""

import json
import os
import shutil

import pytest

from conftest import PY, WORKERS, clean_env, results, run

MLX_LAUNCH = str(os.path.join(os.path.dirname(PY), "mlx.launch"))  # the console script mlx installs

WORKER = str(WORKERS / "launched.py")


def check(out: str, n: int):
    res = results(out)
    assert len(res) == n, out
    for r, res_r in enumerate(res):
        assert res_r["ok"], (res_r, out)
        assert (res_r["rank"], res_r["size"]) == (r, n), res_r
        # boltccl's rank is the launcher's rank.
        assert res_r["launcher_rank"] == r, res_r


@pytest.mark.parametrize("n", [2, 4])
def test_mlx_launch_ring(n):
    # The bug this fixes: rank 0 failed with "cannot listen ... 127.0.0.1:32323: Address already
    # in use". Here MLX's own ring backend also runs in every process, on those very ports.
    out = run([MLX_LAUNCH, "-n", str(n), "--python", PY, WORKER, "--with-mlx-ring"])
    check(out, n)


@pytest.mark.parametrize("n", [2, 4])
def test_mlx_launch_jaccl(n, tmp_path):
    # jaccl's variables: MLX_JACCL_COORDINATOR and the RDMA device matrix (no RDMA here: boltccl's
    # `auto` backend falls back to TCP and says why).
    hosts = [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": [None if i == j else f"rdma_en{j}" for j in range(n)]}
        for i in range(n)
    ]
    hf = tmp_path / "hosts.json"
    hf.write_text(json.dumps(hosts))
    out = run([MLX_LAUNCH, "--backend", "jaccl", "--hostfile", str(hf), "--python", PY, WORKER])
    check(out, n)


@pytest.mark.parametrize("n", [2, 4])
def test_torchrun(n):
    out = run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), WORKER])
    check(out, n)
    assert all(r["local_world_size"] == n for r in results(out))


def test_torchrun_with_a_stray_rank_in_the_shell():
    # A RANK left in someone's shell is not torchrun's: without torchrun's markers boltccl is a
    # single rank, not rank 3 of an absent job.
    out = run([PY, WORKER], env=clean_env({"RANK": "3", "WORLD_SIZE": "8"}))
    res = results(out)
    assert (res[0]["rank"], res[0]["size"], res[0]["ok"]) == (0, 1, True), res


@pytest.mark.parametrize("n", [2, 4])
def test_mpirun(n):
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is missing: install Debian's openmpi-bin (scripts/deps.sh does)"
    out = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n), PY, WORKER])
    check(out, n)


@pytest.mark.parametrize("n", [2, 4])
def test_srun(n):
    assert os.environ.get("SLURM_CONF"), "no Slurm cluster: run through scripts/test-frameworks.sh, which starts one"
    srun = shutil.which("srun")
    assert srun, "srun is missing: install Debian's slurm-client"
    env = clean_env({"SLURM_CONF": os.environ["SLURM_CONF"]})
    out = run([srun, "-n", str(n), "--time=2", PY, WORKER], env=env)
    check(out, n)
