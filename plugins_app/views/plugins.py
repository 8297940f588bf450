"""Dashboard pages (server-rendered, htmx). Thin: they call selectors and services."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from engine.hooks import ALL_HOOKS
from plugins_app import events
from plugins_app.selectors import metrics as metric_selectors
from plugins_app.selectors import plugins as plugin_selectors


@login_required
def plugin_list(request):
    plugins = plugin_selectors.list_plugins(request.headers.get("Accept-Language"))
    hour = metric_selectors.last_hour()
    rows = [{"plugin": p, "hour": hour.get(p.name)} for p in plugins]
    return render(request, "plugins_app/plugin_list.html", {
        "rows": rows, "hooks": ALL_HOOKS, "chain": plugin_selectors.active_chain(),
    })


@login_required
def plugin_detail(request, name: str):
    plugin = plugin_selectors.get_plugin(name, request.headers.get("Accept-Language"))
    if plugin is None:
        raise Http404(f"no plugin named {name}")
    metrics = metric_selectors.metrics_by_plugin(name)["plugins"].get(name, {})
    hook_rows = [{"hook": h, "script": plugin.hooks[h], "stats": metrics.get(h)} for h in ALL_HOOKS if plugin.hooks[h]]
    return render(request, "plugins_app/plugin_detail.html", {
        "plugin": plugin, "hook_rows": hook_rows,
        "stderr_backlog": events.tail(name)[-200:],
    })
