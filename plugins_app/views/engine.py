"""The context engine page: active plugin or stack (change it here), the chain, engine-wide per-hook metrics,
health and a global live stderr tail."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db import DatabaseError
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from engine.hooks import ALL_HOOKS
from plugins_app import bus, events
from plugins_app.forms import EngineConfigForm
from plugins_app.selectors import dashboard, health, outcomes
from plugins_app.selectors import supervisor as supervisor_selectors
from plugins_app.selectors import workers as worker_selectors
from plugins_app.selectors.health import database_ok
from plugins_app.services import plugins as plugin_service
from plugins_app.views.plugins import actor, role_required


def _context(form=None, outcome=None):
    state = dashboard.engine_state()
    cfg = state["config"]
    if form is None:
        mode = "stack" if cfg["plugin_stack"] else ("plugin" if cfg["plugin"] else "default")
        form = EngineConfigForm(initial={"mode": mode, "plugin": cfg["plugin"] or "",
                                         "stack": ", ".join(cfg["plugin_stack"])})
    return {"engine": state, "form": form, "outcome": outcome, "engine_hooks": dashboard.engine_hook_totals(),
            "stderr_backlog": events.recent_lines(None), "all_hooks": ALL_HOOKS}


@login_required
@require_GET
def engine_page(request):
    return render(request, "plugins_app/engine.html", _context())


@login_required
@require_POST
@role_required("engine_config_put")
def engine_config(request):
    form = EngineConfigForm(request.POST)
    outcome = None
    status = 200
    if form.is_valid():
        d = form.cleaned_data
        plugin = d["plugin"] if d["mode"] == "plugin" else None
        stack = d.get("stack_names") if d["mode"] == "stack" else None
        try:
            plugin_service.set_engine_config(plugin, stack, actor(request))
            outcome = {"ok": True, "message": "Saved: the next agent call uses the new chain."}
            form = None
        except plugin_service.PluginError as exc:
            outcome = {"ok": False, "message": exc.message}
            status = exc.status if 400 <= exc.status < 500 else 400
    else:
        status = 400
    template = "plugins_app/partials/engine_config.html" if request.htmx else "plugins_app/engine.html"
    return render(request, template, _context(form, outcome), status=status)


@login_required
async def engine_health(request):
    """Health fragment, polled by the page: Redis, database, live workers, what the supervisor gave up and the job
    queue."""
    from asgiref.sync import sync_to_async

    redis_ok = await bus.ping()
    db_ok = await sync_to_async(database_ok)()
    workers = await bus.live_workers() if redis_ok else []
    supervisor = await sync_to_async(health.supervisor)()
    workers, dead = worker_selectors.split_dead(workers, supervisor)
    given_up = supervisor_selectors.given_up(supervisor)
    queue = await bus.queue_stats() if redis_ok else {}
    failing = await sync_to_async(_failing_or_none)() if db_ok else None
    return await sync_to_async(render)(request, "plugins_app/partials/engine_health.html", {
        "redis_ok": redis_ok, "db_ok": db_ok, "workers": workers, "dead": dead, "queue": queue, "failing": failing,
        "given_up": given_up, "healthy": redis_ok and db_ok and bool(workers) and not failing and not given_up,
        "dropped": await sync_to_async(events.dropped_count)() if redis_ok else None,
    })


def _failing_or_none() -> dict | None:
    try:
        return outcomes.failing()
    except DatabaseError:  # went away since the check
        return None
