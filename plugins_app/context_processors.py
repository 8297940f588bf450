"""Template context every dashboard page gets."""

from __future__ import annotations

from engine.process import sandbox
from plugins_app import bus
from plugins_app.selectors import health


def sandbox_state(request) -> dict:
    """Why hooks on this host run without their namespaces ([] when contained): a banner on every page, so a
    weaker sandbox is never silent. The probe runs once per process (engine/process/sandbox.py)."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {"sandbox_degraded": sandbox.degraded_reasons()}


def service_state(request) -> dict:
    """What is down (Redis, the database) and what agents get meanwhile: a banner on every page
    (plugins_app/selectors/health.py outages)."""
    if request.path.startswith("/api/"):
        return {}
    found = health.outages(_redis_ok)
    # While Redis is down no plugin serves (agents get the default engine): badges that would say "serving" say so.
    return {"outages": found, "redis_down": any(o["what"] == "redis" for o in found)}


def _redis_ok() -> bool:
    try:
        return bool(bus.client().ping())
    except Exception:
        return False
