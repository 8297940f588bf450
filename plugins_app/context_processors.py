"""Template context every dashboard page gets."""

from __future__ import annotations

from engine.process import sandbox


def sandbox_state(request) -> dict:
    """Why hooks on this host run without their namespaces ([] when contained): a banner on every page, so a
    weaker sandbox is never silent. The probe runs once per process (engine/process/sandbox.py)."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {"sandbox_degraded": sandbox.degraded_reasons()}
