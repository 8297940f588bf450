"""A worker SIGKILLed mid-hook takes its running hook subprocesses with it (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import time

from tests.plugin_factory import make_plugin, write_config


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(cond, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_it_kills_running_hooks_when_the_worker_is_sigkilled(live, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    src = f"""
    import json, os, sys, time
    sys.stdin.read()
    marks = {str(marks)!r}
    n = len(os.listdir(marks))
    open(os.path.join(marks, f"run{{n}}-{{os.getpid()}}"), "w").close()
    if n == 0:
        time.sleep(300)  # the first run hangs until its worker dies
    print(json.dumps({{"type": "ok"}}))
    """
    make_plugin(live.home / "plugins", "hangs-once", {"after_turn": src}, toml_extra="hook_timeout_secs = 600")
    write_config(live.home, plugin="hangs-once")
    status, _ = live.hook("after_turn", {"agent_id": "crash", "messages": [{"role": "user", "content": "x"}]})
    assert status == 202
    assert wait_until(lambda: len(os.listdir(marks)) >= 1, 60)
    first_pid = int(sorted(os.listdir(marks))[0].split("-")[1])
    assert alive(first_pid)
    live.kill_worker()
    try:
        assert wait_until(lambda: not alive(first_pid), 15), "the hook outlived its SIGKILLed worker"
    finally:
        live.start_worker()
        live.wait_healthy(1, timeout=60)
    # (the unacknowledged job is reclaimed later by the new worker and then finishes at once; the walking-skeleton
    # e2e test covers re-delivery)
