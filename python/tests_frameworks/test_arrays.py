"""torch, MLX and JAX arrays straight into boltccl (zero copy, every dtype, clear errors),
boltccl.mlx, and async_op=True Works from Python."""

from conftest import PY, WORKERS, results, run


def launch(n, worker):
    return results(run([PY, "-m", "boltccl.launch", "-n", str(n), "--timeout", "300", str(WORKERS / worker)], timeout=320))


def test_torch_mlx_and_jax_arrays_zero_copy():
    res = launch(2, "arrays.py")
    assert len(res) == 2
    for r in res:
        assert r["torch"] and r["mlx"] and r["jax"], r
        # 2,000 in-place calls on 8 MiB arrays: memory flat (no per-call copy).
        assert r["growth_inplace_mib"] < 4, r
        # 1,000 boltccl.mlx calls, each returning a fresh 8 MiB array: bounded by MLX's cache.
        assert r["growth_mlx_functional_mib"] < 64, r


def test_async_works_from_python():
    res = launch(2, "work.py")
    r0 = res[0]
    assert r0["pending_while_peer_absent"] is True, r0
    assert r0["error"] in ("peer_lost", "aborted"), r0
    assert r0["error_after_s"] < 5 and r0["poisoned"], r0
