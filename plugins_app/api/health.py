"""GET /api/health: web, Redis, database and live workers. No auth: load balancers and `make run` use it."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from ninja import Router

from plugins_app import bus
from plugins_app.api.errors import json_response
from plugins_app.schemas import HealthOut
from plugins_app.selectors.health import database_ok

router = Router(tags=["health"])


@router.get("/health", auth=None, response={200: HealthOut, 503: HealthOut})
async def health(request):
    redis_ok = await bus.ping()
    db_ok = await sync_to_async(database_ok)()
    workers = await bus.live_workers() if redis_ok else []
    queue = await bus.queue_stats() if redis_ok else {}
    healthy = redis_ok and db_ok and bool(workers)
    body = {"status": "ok" if healthy else "degraded", "web": True, "redis": redis_ok, "database": db_ok,
            "workers": workers, "queue": queue}
    return json_response(body, 200 if redis_ok and db_ok else 503)
