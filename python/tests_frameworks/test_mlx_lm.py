"""mlx-lm and mlx.nn, unchanged, over boltccl (MLX's mpi backend loading libboltccl_mpi, which
boltccl's launcher names in MLX_MPI_LIBNAME): tensor-parallel greedy generation gives TP=1's
text, and data-parallel training with nn.average_gradients keeps every rank's parameters
identical."""

import subprocess
from pathlib import Path

import pytest

from conftest import PY, WORKERS, results, run

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "target" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MLX_MODEL = ROOT / "target" / "models" / "SmolLM2-135M-Instruct-mlx"
EXAMPLE = str(ROOT / "examples" / "python" / "mlx_lm_generate.py")


@pytest.fixture(scope="module")
def mlx_model() -> str:
    """SmolLM2-135M-Instruct in MLX format, made offline from the example's GGUF (cached)."""
    if not GGUF.exists():
        subprocess.run(["bash", str(ROOT / "examples" / "llm" / "fetch-model.sh")], check=True)
    run([PY, str(ROOT / "scripts" / "mlx-model.py"), str(GGUF), str(MLX_MODEL)], timeout=900)
    return str(MLX_MODEL)


def test_mlx_lm_tensor_parallel_generation_over_boltccl_gives_tp1_text(mlx_model):
    # TP=3: SmolLM2's 9 query and 3 KV heads do not divide by 2 (mlx-lm's shard fails there).
    gen = [EXAMPLE, mlx_model, "--max-tokens", "12", "--json"]
    one = results(run([PY, *gen], timeout=600))
    three = results(run([PY, "-m", "boltccl.launch", "-n", "3", *gen], timeout=600))
    assert [r["size"] for r in three] == [3, 3, 3], three
    assert "Paris" in one[0]["text"], one
    for r in three:
        assert r["text"] == one[0]["text"], (r, one)


def test_mlx_average_gradients_keeps_every_rank_identical_and_matches_one_process():
    worker = str(WORKERS / "mlx_train.py")
    res = results(run([PY, "-m", "boltccl.launch", "-n", "2", worker]))
    assert [r["size"] for r in res] == [2, 2], res
    assert res[0]["digest"] == res[1]["digest"], res
    # One process on both ranks' batches: the same training up to float rounding.
    ref = results(run([PY, worker, "--emulate", "2"]))[0]
    worst = max(abs(a - b) for a, b in zip(res[0]["params"], ref["params"]))
    assert worst < 1e-4, (worst, res[0]["params"][:4], ref["params"][:4])
