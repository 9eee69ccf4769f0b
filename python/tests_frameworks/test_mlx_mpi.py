"""Unchanged mx.distributed programs over boltccl: MLX's own mpi backend loads libboltccl_mpi
(MLX_MPI_LIBNAME). Under boltccl's launcher (which sets the variable), mpirun (-x) and
mlx.launch --backend mpi (--env); every MLX dtype, sizes, split, send/recv against numpy; a
killed or stopped rank ends every process within the deadline, naming it."""

import os
import shutil
import stat
import subprocess
import time

import pytest

import boltccl
import boltccl.mlx as bmx
from conftest import PY, WORKERS, clean_env, results, run

WORKER = str(WORKERS / "mlx_mpi.py")
LIB = bmx.mpi_library()
MLX_LAUNCH = str(os.path.join(os.path.dirname(PY), "mlx.launch"))


def check(out: str, n: int):
    res = results(out)
    assert len(res) == n, out
    for r, res_r in enumerate(res):
        assert (res_r["rank"], res_r["size"]) == (r, n), res_r
        assert res_r["failures"] == [], res_r
        assert res_r["checks"] >= 280, res_r


def test_the_library_is_in_the_wheel():
    assert os.path.isabs(LIB) and os.path.isfile(LIB), LIB
    assert os.path.dirname(LIB) == os.path.dirname(boltccl.__file__)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_conformance_under_boltccl_launch(n):
    # boltccl's launcher sets MLX_MPI_LIBNAME; at 3 ranks the program asks for no backend
    # (mx.distributed.init(), as mlx-lm does) and MLX still chooses its mpi backend.
    extra = ["any"] if n == 3 else []
    out = run([PY, "-m", "boltccl.launch", "-n", str(n), WORKER, "conformance", *extra], timeout=300)
    check(out, n)


def test_conformance_under_mpirun():
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is missing: install Debian's openmpi-bin (scripts/deps.sh does)"
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", f"MLX_MPI_LIBNAME={LIB}"]
    out = run(cmd + [PY, WORKER, "conformance", "any"], timeout=300)
    check(out, 2)


def test_conformance_under_mlx_launch_backend_mpi(tmp_path):
    # mlx.launch --backend mpi runs `mpirun --output :raw ...` (Open MPI 5's option) and puts its
    # own MLX_MPI_LIBNAME before the user's --env; mpirun's later -x wins. Debian's mpirun is
    # Open MPI 4.1, which lacks `--output`: this stand-in drops that one option and runs the real
    # mpirun with everything else as mlx.launch built it.
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is missing: install Debian's openmpi-bin (scripts/deps.sh does)"
    shim = tmp_path / "mpirun"
    shim.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --output ] && shift 2\n'
        f'exec {mpirun} --allow-run-as-root --oversubscribe "$@"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = clean_env({"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    # mpirun runs the command as given (no --python for this backend).
    cmd = [MLX_LAUNCH, "--backend", "mpi", "-n", "2", "--env", f"MLX_MPI_LIBNAME={LIB}", "--"]
    out = run(cmd + [PY, WORKER, "conformance", "any"], timeout=300, env=env)
    check(out, 2)


def test_boltccl_launch_sets_mlx_mpi_libname_unless_given():
    show = ["-c", "import os; print('LIBNAME', os.environ.get('MLX_MPI_LIBNAME'))"]
    out = run([PY, "-m", "boltccl.launch", "-n", "2", "--", PY, *show])
    assert out.count(f"LIBNAME {LIB}") == 2, out
    out = run([PY, "-m", "boltccl.launch", "-n", "2", "--", PY, *show], env=clean_env({"MLX_MPI_LIBNAME": "/mine.so"}))
    assert out.count("LIBNAME /mine.so") == 2, out
    out = run([PY, "-m", "boltccl.launch", "-n", "2", "--env", "MLX_MPI_LIBNAME=/env.so", "--", PY, *show])
    assert out.count("LIBNAME /env.so") == 2, out


@pytest.mark.parametrize("mode", ["die", "stop"])
def test_a_killed_or_stopped_rank_ends_every_process_naming_it(mode):
    # The ranks are started by hand (a launcher would stop the survivors itself): what they
    # print and how they exit is the library's doing. Rank 2 of 3 is lost at step 20.
    n, deadline_s = 3, 3
    port = boltccl._native.free_coordinator_port("127.0.0.1")
    procs = []
    for r in range(n):
        env = clean_env(
            {
                "BOLTCCL_RANK": str(r),
                "BOLTCCL_WORLD_SIZE": str(n),
                "BOLTCCL_COORDINATOR": f"127.0.0.1:{port}",
                "BOLTCCL_JOB_KEY": "mlx-mpi-test",
                "BOLTCCL_TIMEOUT_MS": str(deadline_s * 1000),
                "MLX_MPI_LIBNAME": LIB,
            }
        )
        procs.append(
            subprocess.Popen([PY, WORKER, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    start = time.monotonic()
    try:
        outs = []
        for p in procs[:2]:
            # The group forms in well under 30 s; the loss is then noticed within the deadline.
            outs.append(p.communicate(timeout=60)[0])
        took = time.monotonic() - start
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for r, (p, out) in enumerate(zip(procs[:2], outs)):
        assert p.returncode == 1, f"rank {r} exited {p.returncode}:\n{out}"
        assert "boltccl MPI: MPI_Allreduce failed" in out and "rank 2" in out, out
        if mode == "stop":
            assert "timed out" in out, out
    assert took < 30, f"the survivors took {took:.1f} s to end"
