"""examples/python run as a user would run them."""

import os
import re
from pathlib import Path

from conftest import PY, run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"
MLX_LAUNCH = os.path.join(os.path.dirname(PY), "mlx.launch")


def test_mlx_tensor_parallel_block_is_the_same_at_tp1_and_tp2():
    one = run([PY, str(EXAMPLES / "mlx_tp.py")])
    two = run([MLX_LAUNCH, "-n", "2", "--python", PY, str(EXAMPLES / "mlx_tp.py")])
    d1 = re.search(r"TP=1: .* digest (\w+)", one).group(1)
    d2 = re.search(r"TP=2: .* digest (\w+)", two).group(1)
    assert d1 == d2, (one, two)


def test_torch_ddp_example():
    out = run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLES / "torch_ddp.py")])
    assert "done: 2 ranks, identical parameters" in out, out


def test_jax_example():
    out = run([PY, "-m", "boltccl.launch", "-n", "2", str(EXAMPLES / "jax_allsum.py")])
    assert "2 ranks: all_sum [0.0, 3.0, 6.0" in out, out
