"""Liveness of the pieces the service depends on, and what /api/health makes of them.

Status (plugins_app/api/health.py answers it):
- `down` (503): Redis or the database is unreachable. Agents still get answers (the default engine for blocking
  hooks, 503 + Retry-After for after_turn/on_event), but nothing reaches a plugin.
- `degraded` (503): Redis and the database answer but plugins cannot be served normally: no worker heartbeats,
  jobs wait while no worker has read the stream for STALLED_READ_SECS, or the supervisor is restarting a worker.
- `ok` (200): everything above is fine.
"""

from __future__ import annotations

import logging
import time

from django.db import connection

log = logging.getLogger("librefang.health")
STALLED_READ_SECS = 10.0


def database_ok() -> bool:
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return True
    except Exception:
        return False


def supervisor() -> dict | None:
    """The `librefang start` supervisor's view, when one runs (None under systemd, containers, tests)."""
    try:
        from plugins_app.selectors.supervisor import supervisor_status
    except ImportError:
        return None
    try:
        return supervisor_status()
    except Exception:
        log.warning("could not read the supervisor status", exc_info=True)
        return None


def last_read_age(workers: list[dict], now: float | None = None) -> float | None:
    """Seconds since any live worker last read the stream (None: none has read yet)."""
    reads = [float(w["last_read_at"]) for w in workers if w.get("last_read_at")]
    if not reads:
        return None
    return round(max(0.0, (now or time.time()) - max(reads)), 2)


def assess(*, redis_ok: bool, db_ok: bool, workers: list[dict], queue: dict, read_age: float | None,
           supervisor_doc: dict | None) -> tuple[str, list[str]]:
    """(status, problems) from what the health route gathered."""
    problems = []
    if not redis_ok:
        problems.append("redis unreachable")
    if not db_ok:
        problems.append("database unreachable")
    if problems:
        return "down", problems
    if not workers:
        problems.append("no live worker (no heartbeat)")
    waiting = int(queue.get("lag") or 0)
    if workers and waiting and (read_age is None or read_age > STALLED_READ_SECS):
        problems.append(f"{waiting} job(s) waiting and no worker read the stream for "
                        f"{'ever' if read_age is None else f'{read_age:.0f}s'}")
    for child in (supervisor_doc or {}).get("children") or []:
        if child.get("role") == "worker" and child.get("state") != "running" and not supervisor_doc.get("stopping"):
            problems.append(f"supervisor: {child.get('slot', 'a worker')} is {child.get('state')}")
    return ("degraded" if problems else "ok"), problems


def sandbox_state(workers: list[dict]) -> dict:
    """`sandbox.degraded` as /api/health says it: what each live worker reports of its hooks' sandbox (heartbeat
    `sandbox_degraded`), and this web process's own probe; {"degraded": False, "reasons": []} when hooks get all of
    docs/security.md. Loud but not a health failure: agents are still served."""
    from engine.process import sandbox

    reasons = list(sandbox.degraded_reasons())
    for worker in workers:
        for reason in worker.get("sandbox_degraded") or ():
            reasons.append(f"worker {worker.get('host', '?')}/{worker.get('pid', '?')}: {reason}")
    return {"degraded": bool(reasons), "reasons": list(dict.fromkeys(reasons))}
