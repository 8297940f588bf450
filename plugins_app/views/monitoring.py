"""Monitoring pages: metrics charts (and their JSON), the trace explorer and trace detail, workers and queue."""

from __future__ import annotations

import datetime as dt
import time

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from engine.hooks import ALL_HOOKS
from plugins_app import bus
from plugins_app.selectors import metrics as metric_selectors
from plugins_app.selectors import traces as trace_selectors
from plugins_app.selectors import workers as worker_selectors


def _range_args(request) -> dict:
    return {"name": request.GET.get("range") or None, "start": request.GET.get("from") or None,
            "end": request.GET.get("to") or None}


@login_required
@require_GET
def chart_data(request):
    """JSON for one chart: per-step calls/errors/test-console calls and p50/p95/p99 over the asked range."""
    try:
        start, end, label = metric_selectors.parse_range(**_range_args(request))
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    data = metric_selectors.series(start, end, plugin=request.GET.get("plugin") or None,
                                   hook=request.GET.get("hook") or None)
    data["range"] = label
    return JsonResponse(data)


@login_required
@require_GET
def metrics_page(request):
    """Charts for the whole context engine, or one plugin, or one hook of a plugin (chosen in the form)."""
    plugin, hook = request.GET.get("plugin") or "", request.GET.get("hook") or ""
    facets = trace_selectors.facets()
    by_plugin = metric_selectors.metrics_by_plugin()["plugins"]
    plugins = sorted(set(facets["plugins"]) | set(by_plugin))
    return render(request, "plugins_app/metrics.html", {
        "plugin": plugin, "hook": hook, "plugins": plugins, "hooks": ALL_HOOKS,
        "plugin_hooks": [h for h in ALL_HOOKS if h in by_plugin.get(plugin, {})] if plugin else [],
        "range": request.GET.get("range") or metric_selectors.DEFAULT_RANGE, "ranges": metric_selectors.RANGES,
    })


def _trace_query(request) -> tuple[trace_selectors.TraceQuery, str | None]:
    g = request.GET
    q = trace_selectors.TraceQuery(
        agent=g.get("agent", "").strip(), plugin=g.get("plugin", "").strip(), hook=g.get("hook", "").strip(),
        outcome=g.get("outcome", "") if g.get("outcome") in trace_selectors.OUTCOMES else "",
        error_kind=g.get("error_kind", "").strip(), origin=g.get("origin", "").strip(), text=g.get("q", "").strip())
    error = None
    if g.get("range") or g.get("from") or g.get("to"):
        try:
            q.start, q.end, _ = metric_selectors.parse_range(g.get("range") or None, _local(g.get("from"), g),
                                                             _local(g.get("to"), g))
        except ValueError as exc:
            error = str(exc)
    return q, error


def _local(value: str | None, g) -> str | None:
    """The form's datetime-local fields carry no zone: app.js fills `tz` with the browser's getTimezoneOffset()
    (minutes behind UTC), so "09:30" means the operator's 09:30. Without it they are read as UTC."""
    if not value:
        return None
    try:
        naive = dt.datetime.fromisoformat(value)
        offset = int(g.get("tz") or 0)
    except ValueError:
        return value  # parse_range reports it
    if naive.tzinfo is None:
        naive = naive.replace(tzinfo=dt.UTC) + dt.timedelta(minutes=offset)
    return naive.isoformat()


@login_required
@require_GET
def traces_page(request):
    q, error = _trace_query(request)
    try:
        page = int(request.GET.get("page") or 1)
    except ValueError:
        page = 1
    result = trace_selectors.search_traces(q, page)
    params = request.GET.copy()
    params.pop("page", None)
    context = {"result": result, "q": q, "error": error, "facets": trace_selectors.facets(), "hooks": ALL_HOOKS,
               "outcomes": trace_selectors.OUTCOMES, "query_string": params.urlencode(), "form": request.GET,
               "ranges": metric_selectors.RANGES}
    template = ("plugins_app/partials/traces_results.html" if request.htmx
                and request.htmx.target == "trace-results" else "plugins_app/traces.html")
    return render(request, template, context)


@login_required
@require_GET
def trace_detail(request, trace_id: str):
    trace = trace_selectors.trace_detail(trace_id)
    if trace is None:
        raise Http404("no such trace")
    return render(request, "plugins_app/trace_detail.html", {"trace": trace})


async def _workers_context() -> dict:
    redis_ok = await bus.ping()
    heartbeats = await bus.live_workers() if redis_ok else []
    queue = await bus.queue_stats() if redis_ok else {}
    supervisor = None
    try:  # written alongside this page (plugins_app/selectors/supervisor.py); absent in older checkouts
        from plugins_app.selectors import supervisor as supervisor_selectors

        supervisor = await sync_to_async(supervisor_selectors.supervisor_status)()
    except Exception:  # noqa: BLE001 - the page must render without a supervisor
        supervisor = None
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    calls_5m = await sync_to_async(worker_selectors.calls_since)(since)
    live, dead = worker_selectors.split_dead(heartbeats, supervisor)
    return {
        "redis_ok": redis_ok, "hosts": worker_selectors.workers_by_host(live, time.time()), "dead": dead,
        "worker_count": len(live), "queue": queue, "supervisor": supervisor,
        "outcomes": await sync_to_async(worker_selectors.job_outcomes)(since),
        "calls_5m": calls_5m, "calls_per_min": calls_5m / 5,
    }


@login_required
async def workers_page(request):
    context = await _workers_context()
    template = ("plugins_app/partials/workers_panel.html" if request.htmx
                else "plugins_app/workers.html")
    return await sync_to_async(render)(request, template, context)
