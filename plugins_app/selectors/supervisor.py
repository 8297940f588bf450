"""What the `librefang start` supervisor says about its children (librefang_site/supervisor.py writes it).

The status file `$LIBREFANG_HOME/run/supervisor.json`:

    {"pid": 1234, "host": "box1", "started_at": 1795426128.46, "updated_at": 1795426143.08, "stopping": false,
     "start_again_signal": "SIGUSR1",
     "children": [{"slot": "worker 1", "role": "worker", "index": 1, "pid": 1240 | null,
                   "state": "starting" | "running" | "backoff" | "fatal" | "stopping" | "stopped",
                   "started_at": …, "restarts": 2, "failed_starts": 0,
                   "last_exit": {"pid": 1239, "code": null, "signal": "SIGKILL",
                                 "cause": "SIGKILL (possibly out of memory)"} | null,
                   "last_exit_at": … | null, "next_restart_at": … | null}, …]}

Times are Unix seconds. `failed_starts` counts exits within 10 s of their start, in a row; at 6 the child is given
up (`fatal`) until the supervisor gets `start_again_signal` (plugins_app/services/supervisor.py sends it). The
supervisor rewrites the file on every change and at least every 2 s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from django.conf import settings

from engine.process.pids import alive

STATUS_FILE = Path("run") / "supervisor.json"
STALE_AFTER_SECS = 30.0  # a live supervisor refreshes the file every 2 s
UP = ("starting", "running")


def supervisor_status(home: Path | None = None) -> dict | None:
    """The supervisor's status, or None when no supervisor runs (no file, its pid is dead, or the file has not
    been refreshed for STALE_AFTER_SECS: a pid reused by another process must not look like a supervisor)."""
    path = Path(home or settings.LIBREFANG_HOME) / STATUS_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("pid"), int):
        return None
    if not alive(doc["pid"]):
        return None
    updated = doc.get("updated_at")
    if not isinstance(updated, int | float) or time.time() - updated > STALE_AFTER_SECS:
        return None
    for child in doc.get("children") or []:
        if child.get("state") == "fatal":
            child["given_up"] = given_up_words(child)
    return doc


def given_up_words(child: dict) -> str:
    """What the dashboard and /api/health say of a child the supervisor gave up."""
    cause = (child.get("last_exit") or {}).get("cause") or "unknown cause"
    return f"given up: {cause}, {child.get('failed_starts', 0)} failed starts"


def worker_problems(doc: dict | None) -> list[str]:
    """Workers the supervisor has given up or is restarting (none while it stops everything)."""
    if not doc or doc.get("stopping"):
        return []
    problems = []
    for child in doc.get("children") or []:
        if child.get("role") != "worker" or child.get("state") in UP:
            continue
        slot = child.get("slot", "a worker")
        state = child.get("state")
        problems.append(f"supervisor: {slot} " + (given_up_words(child) if state == "fatal" else
                                                  "is restarting" if state == "backoff" else f"is {state}"))
    return problems


def given_up(doc: dict | None) -> list[dict]:
    """The children the supervisor has given up (for the dashboard)."""
    return [child for child in (doc or {}).get("children") or [] if child.get("state") == "fatal"]
