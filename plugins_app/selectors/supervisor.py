"""What the `librefang start` supervisor says about its children (librefang_site/supervisor.py writes it).

The status file `$LIBREFANG_HOME/run/supervisor.json`:

    {"pid": 1234, "host": "box1", "started_at": 1795426128.46, "updated_at": 1795426143.08, "stopping": false,
     "children": [{"slot": "worker 1", "role": "worker", "index": 1, "pid": 1240 | null,
                   "state": "running" | "restarting" | "stopped", "started_at": …, "restarts": 2,
                   "last_exit": {"code": null, "signal": "SIGKILL", "pid": 1239} | null, "last_exit_at": … | null,
                   "next_restart_at": … | null}, …]}

Times are Unix seconds. The supervisor rewrites it on every change and at least every 2 s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from django.conf import settings

from engine.process.pids import alive

STATUS_FILE = Path("run") / "supervisor.json"
STALE_AFTER_SECS = 30.0  # a live supervisor refreshes the file every 2 s


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
    return doc

