"""engine/process/pids.py: a pid that runs is alive; one that exited is dead, reaped or not (a zombie)."""

from __future__ import annotations

import os
import subprocess
import sys

from engine.process.pids import alive


def test_a_running_process_is_alive():
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert alive(child.pid)
    finally:
        child.kill()
        child.wait()


def test_an_exited_child_is_dead_before_and_after_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # Not reaped yet: a zombie. Wait for the exit without reaping (waitid WNOWAIT leaves it a zombie).
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert not alive(child.pid)
    child.wait()
    assert not alive(child.pid)
