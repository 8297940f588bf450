"""Dashboard controls for LibreFang's extra plugin routes (benchmark, prewarm, export, update-check, state, env, advanced
config, batch, registry browser, per-agent metrics, sandbox policy). Thin: each calls the same service or selector
as its API route (plugins_app/api/plugins.py, plugins_app/api/context_engine_extra.py) and checks the same role
through plugins_app.auth.ACTION_ROLES (keyed by the route's operation id)."""

from __future__ import annotations

import json

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST
from pydantic import ValidationError

from plugins_app.schemas.parity import AdvancedConfigIn, EnvIn
from plugins_app.selectors import plugin_config as plugin_config_selectors
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors import registries as registry_selectors
from plugins_app.selectors.agent_metrics import per_agent_metrics
from plugins_app.selectors.plugin_data import plugin_state
from plugins_app.selectors.sandbox_policy import sandbox_policy
from plugins_app.services import benchmark as benchmark_service
from plugins_app.services import plugin_config
from plugins_app.services import plugins as plugin_service
from plugins_app.services import prewarm as prewarm_service
from plugins_app.views.roles import actor, role_required

# The dashboard keeps a benchmark short: it holds an htmx request open while the worker runs every call.
MAX_DASHBOARD_RUNS = 20
P = "plugins_app/partials/"


def _installed_or_404(name: str):
    plugin = plugin_selectors.get_plugin(name)
    if plugin is None:
        raise Http404(f"no plugin named {name}")
    return plugin


def _error(exc: plugin_service.PluginError) -> dict:
    details = exc.details if isinstance(exc.details, list) else []
    return {"message": exc.message, "details": [d.get("message", d) if isinstance(d, dict) else d for d in details]}


# ---- plugin page ----

@login_required
@role_required("plugins_benchmark")
async def benchmark(request, name: str):
    """Run every declared hook N times through a worker (the API's benchmark service) and show p50/p95/p99."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    arender = sync_to_async(render)
    try:
        runs = int(request.POST.get("runs", benchmark_service.DEFAULT_RUNS))
    except ValueError:
        runs = 0
    if not 1 <= runs <= MAX_DASHBOARD_RUNS:
        return await arender(request, P + "parity_benchmark_result.html",
                             {"error": {"message": f"runs must be a whole number from 1 to {MAX_DASHBOARD_RUNS}"}})
    try:
        who = f"user:{(await request.auser()).get_username()}"  # request.user is lazy and sync-only here
        result = await benchmark_service.benchmark(name, None, None, runs, who)
    except plugin_service.PluginError as exc:
        return await arender(request, P + "parity_benchmark_result.html", {"error": _error(exc)})
    return await arender(request, P + "parity_benchmark_result.html", {"result": result})


@login_required
@role_required("plugins_prewarm_one")
async def prewarm(request, name: str):
    """Warm this plugin on every live worker (the API's prewarm service); one row per worker, with what it
    confirmed, and the workers that did not answer."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    arender = sync_to_async(render)
    try:
        who = f"user:{(await request.auser()).get_username()}"
        result = await prewarm_service.prewarm(name, who)
    except plugin_service.PluginError as exc:
        return await arender(request, P + "parity_prewarm_result.html", {"error": _error(exc)})
    return await arender(request, P + "parity_prewarm_result.html", {"result": result})


@login_required
@require_GET
@role_required("plugins_export")
def export(request, name: str):
    try:
        data = plugin_service.export_plugin(name, actor(request))
    except plugin_service.PluginError as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
    resp = HttpResponse(data, content_type="application/gzip")
    resp["Content-Disposition"] = f'attachment; filename="{name}.tar.gz"'
    return resp


@login_required
@require_GET
@role_required("plugins_update_check")
def update_check(request, name: str):
    try:
        result, error = plugin_service.update_check(name), None
    except plugin_service.PluginError as exc:
        result, error = None, _error(exc)
    return render(request, P + "parity_update_check.html", {"result": result, "error": error})


def _state_context(name: str, **extra) -> dict:
    return {"plugin_name": name, "state": plugin_state(name), **extra}


@login_required
@require_GET
@role_required("plugins_state")
def state(request, name: str):
    _installed_or_404(name)
    return render(request, P + "parity_state.html", _state_context(name))


@login_required
@require_POST
@role_required("plugins_state_wipe")
def state_wipe(request, name: str):
    try:
        wiped, error = plugin_service.wipe_state(name, actor(request)), None
    except plugin_service.PluginError as exc:
        wiped, error = None, _error(exc)
    return render(request, P + "parity_state.html", _state_context(name, wiped=wiped, error=error))


def _env_lines(env: dict) -> str:
    return "\n".join(f"{k}={v}" for k, v in env.items())


def _parse_env_lines(text: str) -> dict[str, str | None]:
    """KEY=value sets a key, -KEY removes one; blank lines and # comments are skipped."""
    out: dict[str, str | None] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-") and "=" not in line:
            out[line[1:].strip()] = None
        elif "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value
        else:
            raise ValueError(f"line {n}: write KEY=value to set a key or -KEY to remove one")
    return out


def _config_context(name: str, **extra) -> dict:
    current = plugin_config_selectors.advanced_config(name)
    settable = {k: current[k] for k in plugin_config.ADVANCED_KEYS if k in current}
    return {"plugin_name": name, "env": plugin_config_selectors.plugin_env(name), "advanced": settable,
            "advanced_text": json.dumps(settable, indent=2), "env_text": "", **extra}


def _config_refused(request, name: str, form: str, text: str, exc: Exception):
    """The config panel again (400) with the operator's text of `form` ("env" or "advanced") unchanged and why it
    was refused beside it."""
    message = exc.message if isinstance(exc, plugin_service.PluginError) else str(exc)
    return render(request, P + "parity_config.html",
                  _config_context(name, **{f"{form}_text": text, f"{form}_error": message}), status=400)


@login_required
@require_GET
@role_required("plugins_env")
def config(request, name: str):
    _installed_or_404(name)
    return render(request, P + "parity_config.html", _config_context(name))


@login_required
@require_POST
@role_required("plugins_env_set")
def env_set(request, name: str):
    """Same validation as PUT /plugins/{name}/env (EnvIn, then the service's name check and whole-manifest
    check); on an error the operator's text comes back unchanged with the message beside it."""
    _installed_or_404(name)
    text = request.POST.get("env", "")
    try:
        body = EnvIn(env=_parse_env_lines(text))
        plugin_config.set_env(name, body.env, actor(request))
    except (ValueError, ValidationError, plugin_service.PluginError) as exc:
        return _config_refused(request, name, "env", text, exc)
    return render(request, P + "parity_config.html", _config_context(name, env_saved=True))


@login_required
@require_POST
@role_required("plugins_advanced_config_set")
def advanced_set(request, name: str):
    """Same validation as PUT /plugins/{name}/advanced-config; only the settings that differ from the current
    ones are sent, so plugin.toml does not fill up with defaults."""
    _installed_or_404(name)
    text = request.POST.get("advanced", "")
    current = _config_context(name)["advanced"]
    try:
        wanted = json.loads(text)
        if not isinstance(wanted, dict):
            raise ValueError("write a JSON object of settings")
        changes = {k: v for k, v in wanted.items() if k not in current or current[k] != v}
        body = AdvancedConfigIn(**changes)
        if changes:
            plugin_config.set_advanced_config(name, body.model_dump(exclude_unset=True), actor(request))
    except (ValueError, ValidationError, TypeError, plugin_service.PluginError) as exc:
        return _config_refused(request, name, "advanced", text, exc)
    return render(request, P + "parity_config.html",
                  _config_context(name, advanced_saved=sorted(changes)))


# ---- plugin list ----

@login_required
@require_GET
def batch_panel(request):
    return render(request, P + "parity_batch.html", {"plugins": plugin_selectors.list_plugins()})


@login_required
@require_POST
@role_required("plugins_batch")
def batch(request):
    names = [n for n in request.POST.getlist("plugins") if n][:200]
    operation = request.POST.get("operation", "")
    error = result = None
    if not names:
        error = "select at least one plugin"
    else:
        try:
            result = plugin_service.batch(operation, names, actor(request))
        except plugin_service.PluginError as exc:
            error = exc.message
    return render(request, P + "parity_batch.html",
                  {"plugins": plugin_selectors.list_plugins(), "result": result, "error": error,
                   "selected": set(names)}, status=400 if error else 200)


# ---- install page ----

@login_required
@require_GET
@role_required("plugins_registry_search")
def registry_browser(request):
    q = request.GET.get("q", "").strip()[:200]
    registry = request.GET.get("registry", "").strip()[:4096] or None
    listing = registry_selectors.registries()
    searched = "q" in request.GET  # the panel's first load searches nothing, so it shows no error before a search
    found = error = None
    if searched:
        try:
            found = registry_selectors.search(q, registry)
        except plugin_service.PluginError as exc:
            error = exc.message
    return render(request, P + "parity_registry.html",
                  {"registries": listing["registries"], "found": found, "error": error, "q": q,
                   "registry": registry or "", "searched": searched})


@login_required
@require_POST
@role_required("plugins_install_with_deps")
def registry_install(request):
    name = request.POST.get("name", "").strip()[:128]
    registry = request.POST.get("registry", "").strip()[:4096] or None
    try:
        result, error = plugin_service.install_with_deps(name, registry, None, actor(request)), None
    except plugin_service.PluginError as exc:
        result, error = None, _error(exc)
    return render(request, P + "parity_install_result.html", {"name": name, "result": result, "error": error},
                  status=200 if result else 400)


# ---- context engine page ----

@login_required
@require_GET
@role_required("context_engine_metrics_per_agent")
def engine_extras(request):
    try:
        hours = float(request.GET.get("hours", "") or 0) or None
    except ValueError:
        hours = None
    if hours is not None and not 0 < hours <= 24 * 365:
        hours = None
    return render(request, P + "parity_engine.html", {
        "per_agent": per_agent_metrics(hours), "policy": sandbox_policy(),
        "hours": hours})
