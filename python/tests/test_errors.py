"""Error mapping across real ranks: timeout, lost peer, mismatched calls, poisoned group."""

from conftest import results, run_ranks


def test_timeout_is_boltccl_and_builtin_timeout_error():
    res = results(run_ranks(2, "errors.py", "timeout", timeout=60)[:1])[0]
    first = res["first"]
    assert first["type"] == "TimeoutError" and first["module"] == "boltccl.errors", first
    assert first["builtin_timeout"] and first["boltccl_error"], first
    assert first["kind"] == "timeout" and first["rank"] == 1, first
    assert "raise BOLTCCL_TIMEOUT_MS" in first["msg"], first
    # The group is unusable afterwards: later calls report the original cause.
    second = res["second"]
    assert second["boltccl_error"] and second["kind"] == "timeout", second
    assert "unusable" in second["msg"], second


def test_lost_peer_is_peer_lost_error():
    res = results(run_ranks(2, "errors.py", "peer_lost", timeout=60)[:1])[0]
    first = res["first"]
    assert first["type"] == "PeerLostError", first
    assert first["kind"] == "peer_lost" and first["rank"] == 1, first
    assert "restart the job" in first["msg"] and "shrink()" in first["msg"], first
    assert res["second"]["kind"] == "peer_lost", res["second"]


def test_mismatched_calls_raise_error_with_kind():
    firsts = [r["first"] for r in results(run_ranks(2, "errors.py", "mismatch", timeout=60))]
    # The rank that notices reports the mismatch; the other may instead hear that it aborted.
    kinds = sorted(f["kind"] for f in firsts)
    assert kinds in (["mismatch", "mismatch"], ["aborted", "mismatch"]), firsts
    for f in firsts:
        assert f["boltccl_error"], f
        if f["kind"] == "mismatch":
            assert f["type"] == "Error", f
        else:
            assert f["type"] == "PeerLostError" and "aborted" in f["msg"], f


def test_survivors_shrink_after_a_rank_vanishes_and_grow_with_a_newcomer():
    outs = run_ranks(3, "errors.py", "shrink", timeout=60)
    res = results([outs[0], outs[2]])
    for old_rank, r in zip((0, 2), res):
        assert r["first"]["type"] == "PeerLostError" and r["first"]["rank"] == 1, r
        # Ranks renumbered in order; 1 + 2 summed over the kept links.
        assert r["new"] == [0 if old_rank == 0 else 1, 2, 3.0, True], r
        assert r["old"]["boltccl_error"], r
        # A replacement joined as rank 2 (grow): 1 + 2 + 3 on every rank, the newcomer's too.
        assert r["grown"] == [0 if old_rank == 0 else 1, 3, 6.0, True], r
    assert res[0]["newcomer"]["grown"] == [2, 3, 6.0, True], res[0]


def test_abort_from_a_thread_stops_the_call_and_reaches_every_rank():
    res = results(run_ranks(3, "errors.py", "abort", timeout=60))
    for r in res:
        assert r["first"]["type"] == "PeerLostError" and r["first"]["kind"] == "aborted", r
        assert r["first"]["rank"] == 0 and "abort()" in r["first"]["msg"], r
        assert r["new"][1:] == [3, 6.0, True], r
    assert res[0]["aborted_after"] < 2.0, res[0]
