"""PyTorch's own distributed test suite (distributed_test.py, shipped in the torch wheel) on the
boltccl backend at world size 2, through scripts/torch-suite.py: the tests pinned in
torch_suite_pass.txt must all pass, and so must those of torch_suite_pass_as_gloo.txt, which the
suite runs only for named backends, with the suite taking boltccl for Gloo. A failure, a skip
(something the test needs went missing) or a test the installed torch no longer has fails."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import PY, clean_env

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "scripts" / "torch-suite.py"
HERE = Path(__file__).parent


@pytest.mark.parametrize("pinned,extra", [("torch_suite_pass.txt", []), ("torch_suite_pass_as_gloo.txt", ["--as-backend", "gloo"])])
def test_pytorch_distributed_suite_passes_on_boltccl(tmp_path, pinned, extra):
    pinned_file = HERE / pinned
    report = tmp_path / "suite.json"
    cmd = [PY, str(DRIVER), "--backend", "boltccl", *extra, "--tests", str(pinned_file), "--timeout", "60", "-q", "--json", str(report)]
    try:
        p = subprocess.run(cmd, env=clean_env({"TEMP_DIR": str(tmp_path)}), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the suite did not finish within 300 s:\n{e.stdout}")
    if not report.exists():  # it did not start: torch, expecttest or boltccl missing
        pytest.fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    res = json.loads(report.read_text())
    # A failure, with the test's own error; a skip means something it needs went missing.
    not_passed = {r["test"]: f"{r['status']} {r['why']}\n{r['detail'][-3000:]}" for r in res["tests"] if r["status"] != "PASS"}
    assert not not_passed, "\n\n".join(f"{k}: {v}" for k, v in not_passed.items())
    names = [ln.split("#")[0].strip() for ln in pinned_file.read_text().splitlines() if ln.split("#")[0].strip()]
    assert sorted(r["test"] for r in res["tests"]) == sorted(names)
    assert p.returncode == 0, p.stdout[-3000:]
