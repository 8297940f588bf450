"""Monitoring pages: metrics charts (and their JSON), the trace explorer and trace detail, workers and queue (and
the supervisor's "Start again")."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from engine.errors import ServiceError
from engine.hooks import ALL_HOOKS
from plugins_app import bus
from plugins_app.selectors import health
from plugins_app.selectors import metrics as metric_selectors
from plugins_app.selectors import supervisor as supervisor_selectors
from plugins_app.selectors import traces as trace_selectors
from plugins_app.selectors import workers as worker_selectors
from plugins_app.services import supervisor as supervisor_service
from plugins_app.views.roles import role_required, user_may


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


async def _workers_context(request, outcome: dict | None = None) -> dict:
    redis_ok = await bus.ping()
    heartbeats = await bus.live_workers() if redis_ok else []
    queue = await bus.queue_stats() if redis_ok else {}
    supervisor = await sync_to_async(health.supervisor)()
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    calls_5m = await sync_to_async(worker_selectors.calls_since)(since)
    live, dead = worker_selectors.split_dead(heartbeats, supervisor)
    user = await request.auser()
    return {
        "redis_ok": redis_ok, "hosts": worker_selectors.workers_by_host(live, time.time()), "dead": dead,
        "worker_count": len(live), "queue": queue, "supervisor": supervisor,
        "given_up": supervisor_selectors.given_up(supervisor), "outcome": outcome,
        "may_start_again": await sync_to_async(user_may)(user, START_AGAIN_ROLE),
        "outcomes": await sync_to_async(worker_selectors.job_outcomes)(since),
        "calls_5m": calls_5m, "calls_per_min": calls_5m / 5,
    }


@login_required
async def workers_page(request):
    context = await _workers_context(request)
    template = ("plugins_app/partials/workers_panel.html" if request.htmx
                else "plugins_app/workers.html")
    return await sync_to_async(render)(request, template, context)


START_AGAIN_ROLE = "admin"  # restarting a process is operating the service, as disabling a plugin is
SEEN_STARTED_SECS = 2.0  # how long the answer waits for the supervisor to show them started (it looks every 0.1 s)


@login_required
@require_POST
@role_required(START_AGAIN_ROLE)
async def start_given_up_again(request):
    """The workers page's "Start again": the supervisor starts every process it gave up."""
    user = await request.auser()
    try:
        names = await sync_to_async(supervisor_service.start_given_up_again)(f"user:{user.get_username()}")
    except ServiceError as exc:
        outcome = {"ok": False, "message": exc.message}
    else:
        await _until_started(names)
        outcome = {"ok": True, "message": f"the supervisor starts {', '.join(names)} again."}
    if not request.htmx:
        (messages.success if outcome["ok"] else messages.error)(request, outcome["message"])
        return redirect("workers")
    context = await _workers_context(request, outcome)
    return await sync_to_async(render)(request, "plugins_app/partials/workers_panel.html", context,
                                       status=200 if outcome["ok"] else 409)


async def _until_started(names: list[str]) -> None:
    """Waits (briefly) until the status file no longer shows them given up, so the page answered is current."""
    deadline = time.monotonic() + SEEN_STARTED_SECS
    while time.monotonic() < deadline:
        doc = await sync_to_async(health.supervisor)()
        if not {child.get("slot") for child in supervisor_selectors.given_up(doc)} & set(names):
            return
        await asyncio.sleep(0.05)
