"""A worker SIGKILLed mid-hook takes its running hook subprocesses with it (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import uuid

from tests.plugin_factory import make_plugin, write_config
from tests.waiting import wait_until


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def pids_named(comm: str) -> list[int]:
    """Host pids of processes whose name (/proc/<pid>/comm) is `comm`: a hook in its own PID namespace sees
    another pid for itself, so it names itself instead."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as fh:
                    if fh.read().strip() == comm:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_it_kills_running_hooks_when_the_worker_is_sigkilled(live):
    name = f"lfhang{uuid.uuid4().hex[:8]}"
    src = f"""
    import ctypes, json, os, sys, time
    sys.stdin.read()
    data = os.environ["LIBREFANG_PLUGIN_DATA_DIR"]
    n = len([f for f in os.listdir(data) if f.startswith("run")])
    open(os.path.join(data, f"run{{n}}"), "w").close()
    if n == 0:  # the first run names itself and hangs until its worker dies
        ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)  # PR_SET_NAME
        time.sleep(300)
    print(json.dumps({{"type": "ok"}}))
    """
    make_plugin(live.home / "plugins", "hangs-once", {"after_turn": src}, toml_extra="hook_timeout_secs = 600")
    write_config(live.home, plugin="hangs-once")
    status, _ = live.hook("after_turn", {"agent_id": "crash", "messages": [{"role": "user", "content": "x"}]})
    assert status == 202
    wait_until(lambda: pids_named(name), 60, f"the hook {name} started", until=lambda pids: len(pids) == 1)
    (first_pid,) = pids_named(name)
    assert alive(first_pid)
    live.kill_worker()
    try:
        wait_until(lambda: alive(first_pid), 15, f"the hook (pid {first_pid}) gone with its SIGKILLed worker",
                   until=lambda running: not running)
    finally:
        live.start_worker()
        live.wait_healthy(1, timeout=60)
    # (the unacknowledged job is reclaimed later by the new worker and then finishes at once; the walking-skeleton
    # e2e test covers re-delivery)
