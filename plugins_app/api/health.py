"""GET /api/health: web, Redis, database, live workers, the job queue and the supervisor. No auth: load
balancers and `librefang start` use it. What each status means: plugins_app/selectors/health.py."""

from __future__ import annotations

from typing import Any, Literal

from asgiref.sync import sync_to_async
from ninja import Router, Schema
from pydantic import ConfigDict

from plugins_app import bus
from plugins_app.api.errors import json_response
from plugins_app.selectors import health as H
from plugins_app.selectors.workers import split_dead

router = Router(tags=["health"])


class QueueOut(Schema):
    length: int = 0
    pending: int = 0  # delivered to a worker, not acked yet
    lag: int = 0  # in the stream, not delivered to any worker yet


class HealthOut(Schema):
    model_config = ConfigDict(extra="allow")
    status: Literal["ok", "degraded", "down"]
    problems: list[str]
    web: bool
    redis: bool
    database: bool
    workers: list[dict[str, Any]]  # each live worker's heartbeat, with heartbeat_age_secs and last_read_at
    queue: QueueOut | None
    last_read_age_secs: float | None  # since any worker last read the stream
    supervisor: dict[str, Any] | None  # `librefang start`'s children, when it runs
    # plugins whose recent agent calls of a hook fail (plugins_app/selectors/outcomes.py): {plugin: {hook: …}};
    # agents get the default engine for those calls (reported here, not counted in `status`)
    failing: dict[str, dict[str, dict[str, Any]]] | None = None
    dead_workers: list[dict[str, Any]] = []  # heartbeats of workers the supervisor has reaped (not yet expired)
    sandbox: dict[str, Any]  # {"degraded": bool, "reasons": [...]}: hooks run with less than docs/security.md says


@router.get("/health", auth=None, response={200: HealthOut, 503: HealthOut})
async def health(request):
    """200 `ok`; 503 `degraded` (no live worker, stalled queue, worker restarting) or `down` (Redis or database
    unreachable)."""
    redis_ok = await bus.ping()
    db_ok = await sync_to_async(H.database_ok, thread_sensitive=False)()
    workers, queue = [], None
    if redis_ok:
        try:
            workers = await bus.live_workers()
            queue = await bus.queue_stats()
        except Exception:  # Redis went away between the ping and now
            redis_ok = False
    supervisor = await sync_to_async(H.supervisor, thread_sensitive=False)()
    workers, dead = split_dead(workers, supervisor)  # a worker its supervisor reaped is dead at once
    read_age = H.last_read_age(workers)
    status, problems = H.assess(redis_ok=redis_ok, db_ok=db_ok, workers=workers, queue=queue or {},
                                read_age=read_age, supervisor_doc=supervisor)
    failing = await sync_to_async(H.failing_plugins, thread_sensitive=False)() if db_ok else None
    body = {"status": status, "problems": problems, "web": True, "redis": redis_ok, "database": db_ok,
            "workers": workers, "queue": queue, "last_read_age_secs": read_age, "supervisor": supervisor,
            "failing": failing, "dead_workers": dead, "sandbox": H.sandbox_state(workers)}
    return json_response(body, 200 if status == "ok" else 503)
