"""Liveness of the pieces the service depends on, and what /api/health makes of them.

Status (plugins_app/api/health.py answers it):
- `down` (503): Redis or the database is unreachable. Agents still get answers (the default engine for blocking
  hooks, 503 + Retry-After for after_turn/on_event), but nothing reaches a plugin.
- `degraded` (503): Redis and the database answer but plugins cannot be served normally: no worker heartbeats,
  jobs wait while no worker has read the stream for STALLED_READ_SECS, or the supervisor is restarting a worker or
  has given one up (plugins_app/selectors/supervisor.py).
- `ok` (200): everything above is fine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import connection

from plugins_app.selectors.supervisor import supervisor_status, worker_problems

log = logging.getLogger("librefang.health")
STALLED_READ_SECS = 10.0


def database_ok() -> bool:
    """Whether the database answers a query that reads it: `SELECT 1` alone never opens SQLite's file, so a file that
    is no longer a database passed it while every real query failed."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1 FROM django_migrations LIMIT 1")
            cur.fetchall()
        return True
    except Exception:
        return False


def supervisor() -> dict | None:
    """The `librefang start` supervisor's view, when one runs (None under systemd, containers, tests)."""
    try:
        return supervisor_status()
    except Exception:
        log.warning("could not read the supervisor status", exc_info=True)
        return None


OUTAGE_CHECK_SECS = 2.0
_outage_cache: tuple[float, list[dict]] = (0.0, [])


def outages(redis_ok: Callable[[], bool]) -> list[dict]:
    """What is down, as the web process sees it (`redis_ok` pings Redis), and what agents get meanwhile: the banner
    on every dashboard page. Checked at most every OUTAGE_CHECK_SECS per process (a page render must not wait on a
    dead Redis each time)."""
    global _outage_cache
    at, found = _outage_cache
    if time.monotonic() - at < OUTAGE_CHECK_SECS:
        return found
    found = []
    if not redis_ok():
        found.append({"what": "redis", "title": "Redis is unreachable",
                      "agents": "Agents get the built-in default engine for blocking hooks (fallback_reason "
                                "bus_unavailable) and after_turn / on_event calls are refused with 503 and "
                                "Retry-After, so agents send them again; no plugin runs until Redis is back.",
                      "dashboard": "Live updates, stderr, workers and the queue are not shown meanwhile."})
    if not database_ok():
        found.append({"what": "database", "title": "The database is unreachable",
                      "agents": "Traces, metrics and job outcomes cannot be stored; workers keep jobs pending and "
                                "run them again once it is back.",
                      "dashboard": "Figures on this page may be missing or old."})
    _outage_cache = (time.monotonic(), found)
    return found


def failing_plugins() -> dict | None:
    """Plugins failing a hook (plugins_app/selectors/outcomes.py), None when the database cannot say."""
    from plugins_app.selectors import outcomes

    try:
        return outcomes.failing()
    except Exception:
        log.warning("could not read recent outcomes", exc_info=True)
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
    problems += worker_problems(supervisor_doc)
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
