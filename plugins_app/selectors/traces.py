"""Hook traces: one row per hook run (and per retry), newest first."""

from __future__ import annotations

import re

from plugins_app.models import HookTrace

TRACE_ID_RE = re.compile(r"^[0-9a-f]{16}$")
MAX_LIMIT = 500


def trace_dict(t: HookTrace, full: bool = False) -> dict:
    out = {
        "trace_id": t.trace_id, "job_id": t.job_id or None, "plugin": t.plugin, "hook": t.hook,
        "agent_id": t.agent_id, "started_at": t.started_at.isoformat(), "elapsed_ms": t.elapsed_ms,
        "success": t.ok, "error_kind": t.error_kind or None, "error": t.error or None,
        "input_preview": t.input_preview, "output_preview": t.output_preview,
    }
    if full:
        out["stderr_tail"] = t.stderr_tail
        out["annotations"] = t.annotations
    return out


def list_traces(plugin: str | None = None, hook: str | None = None, agent: str | None = None,
                failures_only: bool = False, limit: int = 50) -> list[dict]:
    qs = HookTrace.objects.all()
    if plugin:
        qs = qs.filter(plugin=plugin)
    if hook:
        qs = qs.filter(hook=hook)
    if agent:
        qs = qs.filter(agent_id=agent)
    if failures_only:
        qs = qs.filter(ok=False)
    limit = max(1, min(int(limit), MAX_LIMIT))
    return [trace_dict(t) for t in qs[:limit]]


def get_trace(trace_id: str) -> dict | None:
    """The full trace, or None. Raises ValueError for an id that is not 16 lowercase hex characters."""
    if not TRACE_ID_RE.match(trace_id or ""):
        raise ValueError(f"trace id {trace_id!r} must be 16 lowercase hex characters")
    t = HookTrace.objects.filter(trace_id=trace_id).first()
    return trace_dict(t, full=True) if t else None
