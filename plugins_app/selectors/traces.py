"""Hook traces: one row per hook run (and per retry), newest first."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from django.core.paginator import Paginator
from django.db.models import Q

from plugins_app.models import HookTrace, JobRecord

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


# ---- the trace explorer ----

OUTCOMES = ("ok", "failed", "fallback")
PER_PAGE = 50


@dataclass
class TraceQuery:
    """What the explorer's search form asks for; every field optional."""

    agent: str = ""
    plugin: str = ""
    hook: str = ""
    outcome: str = ""  # "ok" | "failed" | "fallback" (the agent got the default engine's answer)
    error_kind: str = ""
    origin: str = ""  # "agent" | "test_console"
    text: str = ""  # in input, output, error, stderr, trace/job id or the job's fallback reason
    start: dt.datetime | None = None
    end: dt.datetime | None = None


def _filtered(q: TraceQuery):
    qs = HookTrace.objects.all()
    if q.agent:
        qs = qs.filter(agent_id__icontains=q.agent)
    if q.plugin:
        qs = qs.filter(plugin=q.plugin)
    if q.hook:
        qs = qs.filter(hook=q.hook)
    if q.origin:
        qs = qs.filter(origin=q.origin)
    if q.error_kind:
        qs = qs.filter(error_kind=q.error_kind)
    fell_back = JobRecord.objects.filter(source="default").exclude(job_id="").values("job_id")
    if q.outcome == "ok":
        qs = qs.filter(ok=True)
    elif q.outcome == "failed":
        qs = qs.filter(ok=False)
    elif q.outcome == "fallback":
        qs = qs.filter(job_id__in=fell_back)
    if q.start:
        qs = qs.filter(started_at__gte=q.start)
    if q.end:
        qs = qs.filter(started_at__lt=q.end)
    if q.text:
        t = q.text
        reasons = JobRecord.objects.filter(fallback_reason__icontains=t).exclude(job_id="").values("job_id")
        qs = qs.filter(Q(input_preview__icontains=t) | Q(output_preview__icontains=t) | Q(error__icontains=t)
                       | Q(stderr_tail__icontains=t) | Q(trace_id=t.lower()) | Q(job_id=t) | Q(job_id__in=reasons))
    return qs


def search_traces(q: TraceQuery, page: int = 1, per_page: int = PER_PAGE) -> dict:
    """One page of matching traces, newest first, with each trace's job outcome (source, fallback reason)."""
    paginator = Paginator(_filtered(q), per_page)
    page_obj = paginator.get_page(page)
    rows = list(page_obj.object_list)
    jobs = {j.job_id: j for j in JobRecord.objects.filter(job_id__in=[t.job_id for t in rows if t.job_id])}
    traces = []
    for t in rows:
        d = trace_dict(t)
        job = jobs.get(t.job_id)
        d.update(origin=t.origin, source=job.source if job else None,
                 fallback_reason=(job.fallback_reason or None) if job else None,
                 fell_back=bool(job and job.source == "default"))
        traces.append(d)
    return {"traces": traces, "page": page_obj, "count": paginator.count}


def trace_detail(trace_id: str) -> dict | None:
    """The full trace with its job's outcome and the other attempts of the same job; None if unknown or malformed."""
    if not TRACE_ID_RE.match(trace_id or ""):
        return None
    t = HookTrace.objects.filter(trace_id=trace_id).first()
    if t is None:
        return None
    out = trace_dict(t, full=True)
    out["origin"] = t.origin
    out["ended_at"] = (t.started_at + dt.timedelta(milliseconds=t.elapsed_ms)).isoformat()
    job = JobRecord.objects.filter(job_id=t.job_id).first() if t.job_id else None
    out["job"] = ({"job_id": job.job_id, "state": job.state, "source": job.source,
                   "fallback_reason": job.fallback_reason or None, "deliveries": job.deliveries,
                   "worker": job.worker, "finished_at": job.finished_at.isoformat()} if job else None)
    siblings = HookTrace.objects.filter(job_id=t.job_id).exclude(pk=t.pk).order_by("started_at") if t.job_id else []
    out["related"] = [trace_dict(s) for s in siblings[:20]]
    return out


def facets() -> dict:
    """Values the search form offers: plugins, hooks and error kinds seen in stored traces."""
    return {
        "plugins": sorted(HookTrace.objects.values_list("plugin", flat=True).distinct()),
        "hooks": sorted(HookTrace.objects.values_list("hook", flat=True).distinct()),
        "error_kinds": sorted(HookTrace.objects.exclude(error_kind="").values_list("error_kind", flat=True).distinct()),
    }
