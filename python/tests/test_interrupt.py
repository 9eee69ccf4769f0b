"""Ctrl-C interrupts a long wait with KeyboardInterrupt (the GIL is released meanwhile)."""

import signal
import subprocess
import sys
import time

from conftest import WORKERS, free_port, rank_env


def test_ctrl_c_interrupts_a_blocked_call():
    coord = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKERS / "interrupt.py")],
            env=rank_env(r, 2, coord, "interrupt-test"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "waiting" not in line and time.monotonic() < deadline:
            line = procs[0].stdout.readline()
            assert line or procs[0].poll() is None, "rank 0 exited early"
        time.sleep(0.5)
        t0 = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        out, _ = procs[0].communicate(timeout=20)
        elapsed = time.monotonic() - t0
        assert procs[0].returncode == 0, out
        assert "KeyboardInterrupt after" in out, out
        assert "then: Error kind=interrupted" in out, out
        assert elapsed < 5, f"took {elapsed:.1f} s to react to Ctrl-C"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
