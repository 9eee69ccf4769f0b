"""python -m boltccl.launch: runs N ranks, propagates failures, enforces a timeout."""

import subprocess
import sys
import textwrap


def launch(tmp_path, body, *extra, n=2, timeout=60):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-m", "boltccl.launch", "-n", str(n), *extra, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_runs_python_ranks(tmp_path):
    r = launch(
        tmp_path,
        """
        import numpy as np, boltccl
        g = boltccl.init()
        x = np.array([g.rank + 1.0])
        g.all_sum(x)
        print(f"rank {g.rank} of {g.size}: {x[0]}")
        """,
        n=3,
    )
    assert r.returncode == 0, r.stderr
    for rank in range(3):
        assert f"rank {rank} of 3: 6.0" in r.stdout


def test_failing_rank_fails_the_job(tmp_path):
    r = launch(
        tmp_path,
        """
        import os, sys, time
        if os.environ["BOLTCCL_RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
        """,
    )
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "a rank failed" in r.stderr


def test_timeout_kills_the_job(tmp_path):
    r = launch(tmp_path, "import time; time.sleep(60)\n", "--timeout", "2")
    assert r.returncode == 124 and "timed out" in r.stderr
