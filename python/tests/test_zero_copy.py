"""Zero copy: the caller's own array changes and no temporary of its size is allocated."""

import sys

from conftest import results, run_ranks


def test_all_sum_is_zero_copy():
    for res in results(run_ranks(2, "zero_copy.py", timeout=120)):
        assert res["same_object"] and res["same_address"], res
        assert res["changed"] and res["out_ok"], res
        # Python-side allocations during the two calls: a few small objects at most.
        assert res["traced_peak"] < 64 * 1024, res
        # Whole-process peak memory during the calls (the peak reset after the warm-up): no
        # copy of the 32 MiB array anywhere, native included. Linux only (macOS cannot reset it).
        if sys.platform.startswith("linux"):
            assert res["rss_growth"] is not None and res["rss_growth"] < res["nbytes"] // 4, res
