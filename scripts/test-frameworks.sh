#!/usr/bin/env bash
# The framework suite (python/tests_frameworks): boltccl under the real launchers (mlx.launch,
# torchrun, mpirun, srun), the torch.distributed backend, torch/MLX/JAX arrays, non-blocking
# calls from Python. Run by scripts/test.sh; on its own:
#   bash scripts/test-frameworks.sh [pytest args]
#
# 1. Debian packages, if missing: Open MPI (mpirun), Slurm and munge (srun), Debian's torch 1.13
#    (python3-torch, for the torch 1.x tests).
# 2. target/frameworks-venv with python/requirements-test.txt and -frameworks.txt (torch is
#    PyPI's ~5 GB CUDA wheel: installed once; a changed requirements file installs on top).
# 3. The wheel (maturin, release) installed into it.
# 4. A one-node Slurm cluster (scripts/slurm/start.sh), stopped at exit.
# 5. pytest. Nothing is skipped: a missing framework or launcher fails its test.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
python="${PYTHON:-python3}"
venv="$root/target/frameworks-venv"
wheels="$root/target/frameworks-wheels"
step() { printf '\n== test-frameworks: %s\n' "$*"; }

step "system packages"
bash scripts/deps.sh openmpi-bin slurmd slurmctld slurm-client munge python3-torch

stamp="$venv/.requirements.sha256"
want="$(cat python/requirements-test.txt python/requirements-frameworks.txt | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # A changed requirements file installs into the existing venv (pip adds what is new and
    # moves pinned versions), so adding one package does not download torch again.
    step "virtual environment with torch, mlx[cpu], jax (once; about 5 GB)"
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    timeout 1800 "$venv/bin/pip" install -q --disable-pip-version-check \
        -r python/requirements-test.txt -r python/requirements-frameworks.txt
    echo "$want" > "$stamp"
else
    step "virtual environment: cached ($(du -sh "$venv" | cut -f1))"
fi
"$venv/bin/python" -c 'import torch, mlx.core, jax; print("torch", torch.__version__, "| mlx", mlx.core.__version__, "| jax", jax.__version__)'

step "wheel (maturin, release)"
rm -rf "$wheels"
bash scripts/build-wheel.sh "$venv/bin/python" "$wheels"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheels"/boltccl-*.whl

step "torch 1.x: a venv over the system Python and Debian's torch, with the same wheel"
torch1="$root/target/torch1-venv"
[ -x "$torch1/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$torch1"
"$torch1/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheels"/boltccl-*.whl
export BOLTCCL_TEST_TORCH1_PY="$torch1/bin/python"

step "one-node Slurm cluster"
slurm_dir="$root/target/slurm"
cleanup() { bash "$root/scripts/slurm/stop.sh" "$slurm_dir"; }
trap cleanup EXIT
bash scripts/slurm/start.sh "$slurm_dir"
export SLURM_CONF="$slurm_dir/slurm.conf"

step "pytest"
# From target/, so that python/boltccl (without the compiled module) is not imported.
(cd "$root/target" && timeout 1800 "$venv/bin/python" -m pytest "$root/python/tests_frameworks" -q \
    -p no:cacheprovider -r s --durations=15 "$@")
step "all passed"
