"""Hook metrics per agent, from the stored traces of agent calls (`GET /api/context-engine/metrics/per-agent`)."""

from __future__ import annotations

import datetime as dt

from django.db.models import Avg, Count, Max, Q, Sum
from django.utils import timezone

from plugins_app.models import HookTrace


def per_agent_metrics(hours: float | None = None, agent_id: str | None = None) -> dict:
    """Calls, failures and latency per agent and hook, from the stored traces of agent calls (test-console runs
    left out), optionally over the last `hours`."""
    qs = HookTrace.objects.exclude(origin="test_console").exclude(agent_id="")
    if hours:
        qs = qs.filter(started_at__gte=timezone.now() - dt.timedelta(hours=hours))
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    rows = (qs.values("agent_id", "hook")
            .annotate(calls=Count("id"), failures=Count("id", filter=Q(ok=False)), total_ms=Sum("elapsed_ms"),
                      avg_ms=Avg("elapsed_ms"), last_call=Max("started_at"))
            .order_by("agent_id", "hook"))
    per_agent: dict[str, dict] = {}
    for r in rows:
        agent = per_agent.setdefault(r["agent_id"], {"hooks": {}, "calls": 0, "failures": 0})
        agent["hooks"][r["hook"]] = {"calls": r["calls"], "successes": r["calls"] - r["failures"],
                                     "failures": r["failures"], "total_ms": round(r["total_ms"] or 0.0, 3),
                                     "avg_ms": round(r["avg_ms"] or 0.0, 3),
                                     "last_call": r["last_call"].isoformat() if r["last_call"] else None}
        agent["calls"] += r["calls"]
        agent["failures"] += r["failures"]
    return {"per_agent": per_agent, "total_agents": len(per_agent), "window_hours": hours}
