"""GIL release and overlapping calls from two threads."""

from conftest import results, run_ranks


def test_gil_released_and_overlap_is_busy():
    r0, r1 = results(run_ranks(2, "threads.py", timeout=60))
    assert r0["ticks_during_call"] > 50, r0  # ~1 s blocked: the other thread kept running
    assert r0["overlap"] == "busy", r0
    assert r0["result"] == r1["result"] == [2.0] * 4
