"""Plugin management routes, with LibreFang's paths and shapes.

Roles (LibreFang #6631): owner for anything that runs or writes plugin code (scaffold, install, install-with-deps,
update, install-deps, reload, enable, test-hook, benchmark, batch, prewarm: it starts interpreters and fetches
bundles on every worker, and PUT env / advanced-config: an environment variable such as LD_PRELOAD or a sandbox
switch changes what code runs and with what reach); admin for shutting a bad plugin off or cleaning up after it
(disable, uninstall, DELETE state) and for export (plugin.toml's [env] may hold
API keys, which GET env masks); viewer reads.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from ninja import Path, Query, Schema

from engine import hooks as H
from engine.filecache import tree_size
from plugins_app.api.context_engine import optional_body_openapi, validated
from plugins_app.api.errors import ApiError, json_body, json_response
from plugins_app.api.security import ActionRouter, actor
from plugins_app.schemas import (
    NAME_PATTERN,
    DoctorOut,
    EnabledOut,
    ErrorEnvelope,
    InstallIn,
    InstallOut,
    LintOut,
    NameIn,
    PluginHealthOut,
    PluginListOut,
    PluginOut,
    PluginStatusOut,
    ReloadOut,
    ScaffoldIn,
    ScaffoldOut,
    TestHookIn,
    TestHookOut,
    UninstallOut,
    UpdateIn,
    UpdateOut,
)
from plugins_app.schemas.parity import (
    AdvancedConfigIn,
    AdvancedConfigOut,
    BatchIn,
    BatchOut,
    BenchmarkIn,
    BenchmarkOut,
    EnvIn,
    InstallWithDepsIn,
    InstallWithDepsOut,
    PluginEnvOut,
    PluginStateOut,
    PrewarmIn,
    PrewarmOut,
    RegistriesOut,
    RegistrySearchOut,
    StateWipeOut,
    UpdateCheckOut,
)
from plugins_app.selectors import config as config_selectors
from plugins_app.selectors import doctor as doctor_selectors
from plugins_app.selectors import plugin_config as plugin_config_selectors
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors import registries as registry_selectors
from plugins_app.selectors.plugin_data import plugin_state
from plugins_app.services import audit, plugin_config
from plugins_app.services import benchmark as benchmark_service
from plugins_app.services import hooks as hook_service
from plugins_app.services import plugins as plugin_service
from plugins_app.services import prewarm as prewarm_service

router = ActionRouter(tags=["plugins"])
PluginPath = Path(..., pattern=NAME_PATTERN, max_length=128, description="the plugin's directory name")
E = {400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope, 404: ErrorEnvelope, 409: ErrorEnvelope,
     413: ErrorEnvelope}


def _lang(request: HttpRequest) -> str | None:
    return request.headers.get("Accept-Language")


class ListFilters(Schema):
    enabled: bool | None = None
    has_errors: bool | None = None


@router.get("", response={200: PluginListOut, **E}, operation_id="plugins_list")
def list_plugins(request, filters: Query[ListFilters]):
    """Every installed plugin with all nine hooks, validity, enabled, runtime and display_name."""
    items = [p.to_dict() for p in plugin_selectors.list_plugins(_lang(request))]
    if filters.enabled is not None:
        items = [p for p in items if p["enabled"] == filters.enabled]
    if filters.has_errors is not None:
        items = [p for p in items if (not p["valid"] or not p["hooks_valid"]) == filters.has_errors]
    return json_response({"items": items, "total": len(items), "offset": 0, "limit": None})


@router.get("/doctor", response={200: DoctorOut, **E}, operation_id="plugins_doctor")
def doctor(request, fresh: bool = False):
    """Every runtime probed (5 s cap each, cached 30 s unless `fresh`); per plugin runtime_available, hooks_valid
    and findings with hints."""
    return json_response(doctor_selectors.doctor(fresh=fresh))


@router.post("/scaffold", response={201: ScaffoldOut, **E}, operation_id="plugins_scaffold")
def scaffold(request, body: ScaffoldIn):
    """Create a plugin from the runtime's templates (201); 409 when it exists; 400 for a bad name or runtime."""
    summary = plugin_service.scaffold_plugin(body.name, body.description, body.runtime, body.hooks,
                                             actor=actor(request))
    return json_response({"scaffolded": True, "name": summary.name, "path": summary.path,
                          "plugin": summary.to_dict()}, 201)


@router.post("/install", response={201: InstallOut, **E}, operation_id="plugins_install")
def install(request, body: InstallIn):
    """Install from a local path, a git URL (optional ref) or a registry (git repo or local dir with
    plugins/<name>/). Honours `Idempotency-Key`; checks [integrity]; never copies symlinks; records plugins.lock."""
    key = request.headers.get("Idempotency-Key")
    result = plugin_service.install_plugin(body.model_dump(exclude_none=True), actor=actor(request),
                                           idempotency_key=key)
    return json_response(result, 201)


@router.post("/uninstall", response={200: UninstallOut, **E}, operation_id="plugins_uninstall")
def uninstall(request, body: NameIn):
    return json_response(plugin_service.uninstall_plugin(body.name, actor=actor(request)))


# ---- routes with fixed paths: declared before /{name}, which would otherwise take them ----

@router.post("/install-with-deps", response={201: InstallWithDepsOut, **E},
             operation_id="plugins_install_with_deps")
def install_with_deps(request, body: InstallWithDepsIn):
    """Install a registry plugin and, first, every plugin it depends on (`plugin_depends`, transitively; cycles are
    refused), from one fetch of the registry. Plugins already installed are kept as they are."""
    return json_response(plugin_service.install_with_deps(body.name, body.registry or body.github_repo, body.ref,
                                                          actor=actor(request)), 201)


@router.post("/batch", response={200: BatchOut, **E}, operation_id="plugins_batch")
def batch(request, body: BatchIn):
    """enable, disable or reload several plugins; one result per plugin (a failure does not stop the others)."""
    return json_response(plugin_service.batch(body.operation, body.plugins, actor=actor(request)))


@router.post("/prewarm", response={200: PrewarmOut, **E, 503: ErrorEnvelope},
             operation_id="plugins_prewarm", openapi_extra=optional_body_openapi(PrewarmIn))
async def prewarm_all(request):
    """Every live worker starts the warm-start zygotes of the python hooks of `plugins` (default: every enabled
    plugin) and fetches their pinned bundles; the answer says what each worker confirmed within a few seconds, which
    did not answer, and per plugin LibreFang's `{ok, message}` (a plugin that is not installed or is disabled gets
    ok false, the others are still warmed)."""
    body = json_body(request, PrewarmIn)
    return json_response(await prewarm_service.prewarm(None, actor(request), only=body.plugins or None))


@router.get("/registry/search", response={200: RegistrySearchOut, **E, 502: ErrorEnvelope},
            operation_id="plugins_registry_search")
def registry_search(request, q: str = Query("", max_length=200), registry: str | None = Query(None, max_length=4096)):
    """Plugins of a registry (default: the first configured) whose name, description or author hold every word
    of `q`; a registry with a configured key must present a valid signed index.json."""
    return json_response(registry_selectors.search(q, registry))


@router.get("/registries", response={200: RegistriesOut, **E}, operation_id="plugins_registries")
def registries(request):
    """Every configured registry with what it offers (or the error that kept it from being read)."""
    return json_response(registry_selectors.registries())


def _plugin_or_404(name: str, request: HttpRequest):
    summary = plugin_selectors.get_plugin(name, _lang(request))
    if summary is None:
        raise ApiError(404, "not_found", f"plugin {name!r} is not installed")
    return summary


@router.get("/{name}", response={200: PluginOut, **E}, operation_id="plugins_get")
def get_plugin(request, name: str = PluginPath):
    summary = _plugin_or_404(name, request)
    data = summary.to_dict()
    entry = plugin_selectors.installed_entry(name)
    m = entry.plugin.manifest if entry is not None and entry.plugin else None
    if m is not None:
        data.update(requirements=m.requirements, plugin_depends=m.plugin_depends, integrity_count=len(m.integrity),
                    hook_timeout_secs=m.hooks.hook_timeout_secs, on_hook_failure=m.hooks.on_hook_failure,
                    env_keys=sorted(m.env))
    return json_response(data)


@router.get("/{name}/status", response={200: PluginStatusOut, **E}, operation_id="plugins_status")
def status(request, name: str = PluginPath):
    """LibreFang's status shape: version, validity, enabled, and where the plugin sits in the active chain."""
    summary = _plugin_or_404(name, request)
    cfg = config_selectors.engine_config()
    chain = cfg["chain"]
    return json_response({
        "name": name, "version": summary.version, "description": summary.description,
        "hooks_valid": summary.hooks_valid, "valid": summary.valid, "path": summary.path,
        "size_bytes": tree_size(summary.path), "enabled": summary.enabled,
        "active": name in cfg["serving"], "active_as_single": cfg["mode"] == "single" and chain == [name],
        "stack_position": chain.index(name) if name in chain else None,
    })


@router.get("/{name}/health", response={200: PluginHealthOut, **E}, operation_id="plugins_health")
def health(request, name: str = PluginPath):
    """Loaded or disabled, per-hook stats from the persisted metrics, and the plugin's recent traces."""
    summary = _plugin_or_404(name, request)
    from plugins_app.selectors.metrics import metrics_by_plugin
    from plugins_app.selectors.traces import list_traces

    stats = metrics_by_plugin(name)["plugins"].get(name, {})
    hook_stats = {h: {"calls": m["calls"], "errors": m["failures"],
                      "error_rate_pct": round(100.0 * m["failures"] / m["calls"], 2) if m["calls"] else 0.0,
                      "avg_elapsed_ms": m["avg_ms"] or 0.0} for h, m in stats.items()}
    return json_response({
        "plugin": name, "status": "loaded" if summary.enabled else "disabled", "valid": summary.valid,
        "active": name in config_selectors.engine_config()["serving"], "version": summary.version,
        "hooks_valid": summary.hooks_valid, "hook_stats": hook_stats, "recent_traces": list_traces(plugin=name, limit=10),
    })


@router.get("/{name}/lint", response={200: LintOut, 422: LintOut, **E}, operation_id="plugins_lint")
def lint(request, name: str = PluginPath):
    """200 when the plugin has no errors, 422 with the report when it has."""
    try:
        report = doctor_selectors.lint(name)
    except KeyError as exc:
        raise ApiError(404, "not_found", f"plugin {name!r} is not installed") from exc
    return json_response(report, 200 if report["ok"] else 422)


@router.post("/{name}/reload", response={200: ReloadOut, **E}, operation_id="plugins_reload")
def reload(request, name: str = PluginPath):
    """Re-read plugin.toml: timeout, [env], hooks and runtime apply to the next call. A broken manifest gets 400
    and the previous configuration keeps serving."""
    return json_response(plugin_service.reload_plugin(name, actor=actor(request)))


@router.post("/{name}/enable", response={200: EnabledOut, **E}, operation_id="plugins_enable")
def enable(request, name: str = PluginPath):
    return json_response(plugin_service.set_enabled(name, True, actor=actor(request)))


@router.post("/{name}/disable", response={200: EnabledOut, **E}, operation_id="plugins_disable")
def disable(request, name: str = PluginPath):
    return json_response(plugin_service.set_enabled(name, False, actor=actor(request)))


@router.post("/{name}/update", response={200: UpdateOut, **E}, operation_id="plugins_update",
             openapi_extra=optional_body_openapi(UpdateIn))
def update(request, name: str = PluginPath):
    """Re-fetch from the recorded source; 409 `locally_modified` (with the changed files) unless `force`."""
    body = json_body(request, UpdateIn)
    return json_response(plugin_service.update_plugin(name, body.force, actor=actor(request)))


@router.post("/{name}/install-deps", response={200: dict, **E}, operation_id="plugins_install_deps")
def install_deps(request, name: str = PluginPath):
    return json_response(plugin_service.install_deps(name, actor=actor(request)))


def _test_hook_timeout(name: str, hook: str) -> float:
    """404/400 before anything runs (not installed, not loadable, hook not declared), else one attempt's timeout."""
    return H.timeout_for(hook, plugin_selectors.runnable_hooks(name, [hook]))


@router.post("/{name}/test-hook", response={200: TestHookOut, **E}, operation_id="plugins_test_hook")
async def test_hook(request, body: TestHookIn, name: str = PluginPath):
    """Run this plugin's hook once through a worker, whatever the active configuration. `error` carries the
    classified failure (timeout, script_error with exit code, empty_output, …)."""
    validated(body.hook, body.input)
    timeout = await sync_to_async(_test_hook_timeout)(name, body.hook)
    reply = await hook_service.test_hook(name, body.hook, body.input, timeout)
    out = {"plugin": name, "hook": body.hook, "ok": bool(reply.get("ok")), "success": bool(reply.get("ok")),
           "reply": reply.get("reply"), "error": reply.get("error"), "stderr": reply.get("stderr") or "",
           "elapsed_ms": reply.get("elapsed_ms"), "trace_id": reply.get("trace_id")}
    await sync_to_async(audit.record)(actor(request), "plugin.test_hook", name, ok=out["ok"],
                                      details={"hook": body.hook, "trace_id": out["trace_id"],
                                               "error": (out["error"] or {}).get("kind")})
    return json_response(out)


# ---- more of LibreFang's per-plugin routes ----

def _installed_or_404(name: str) -> None:
    if not plugin_selectors.is_installed(name):
        raise ApiError(404, "not_found", f"plugin {name!r} is not installed")


@router.post("/{name}/benchmark", response={200: BenchmarkOut, **E}, operation_id="plugins_benchmark",
             openapi_extra=optional_body_openapi(BenchmarkIn))
async def benchmark(request, name: str = PluginPath):
    """Run each declared hook (or `hook` only) `runs` times (default 5, max 50), one after another, through a
    worker as the test console does; latency_ms is what the worker measured per run (p50/p95/p99 of these runs)."""
    body = json_body(request, BenchmarkIn)
    if body.hook and body.input is not None:
        validated(body.hook, body.input)
    return json_response(await benchmark_service.benchmark(name, body.hook, body.input, body.runs, actor(request)))


@router.post("/{name}/prewarm", response={200: PrewarmOut, **E, 503: ErrorEnvelope},
             operation_id="plugins_prewarm_one")
async def prewarm_one(request, name: str = PluginPath):
    """POST /plugins/prewarm for one plugin (404 when not installed, 409 when disabled)."""
    return json_response(await prewarm_service.prewarm(name, actor(request)))


@router.get("/{name}/export", response={200: bytes, **E}, operation_id="plugins_export",
            openapi_extra={"responses": {"200": {"description": "`<name>.tar.gz`: the plugin directory and "
                                                               "`<name>/librefang-lock.json` (its plugins.lock entry)",
                                                "content": {"application/gzip": {"schema": {"type": "string",
                                                                                            "format": "binary"}}}}}})
def export(request, name: str = PluginPath):
    data = plugin_service.export_plugin(name, actor(request))
    resp = HttpResponse(data, content_type="application/gzip")
    resp["Content-Disposition"] = f'attachment; filename="{name}.tar.gz"'
    return resp


@router.get("/{name}/update-check", response={200: UpdateCheckOut, **E, 502: ErrorEnvelope},
            operation_id="plugins_update_check")
def update_check(request, name: str = PluginPath):
    """Fetch the recorded source and compare: a newer version, or the same version with different files."""
    return json_response(plugin_service.update_check(name))


@router.get("/{name}/state", response={200: PluginStateOut, **E}, operation_id="plugins_state")
def state(request, name: str = PluginPath):
    """The plugin's data directory ($LIBREFANG_HOME/plugin_data/<name>): size, files, agents with a state file."""
    _installed_or_404(name)
    return json_response(plugin_state(name))


@router.delete("/{name}/state", response={200: StateWipeOut, **E}, operation_id="plugins_state_wipe")
def wipe_state(request, name: str = PluginPath):
    """Empty the plugin's data directory (per-agent state, bootstrap overrides, whatever its hooks stored)."""
    return json_response(plugin_service.wipe_state(name, actor=actor(request)))


@router.get("/{name}/env", response={200: PluginEnvOut, **E}, operation_id="plugins_env")
def env(request, name: str = PluginPath):
    """[env] of plugin.toml (values of keys naming a key, secret, password or token shown as ***) and env_schema."""
    _installed_or_404(name)
    return json_response(plugin_config_selectors.plugin_env(name))


@router.put("/{name}/env", response={200: PluginEnvOut, **E}, operation_id="plugins_env_set",
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                "schema": EnvIn.model_json_schema()}}}})
def set_env(request, name: str = PluginPath):
    """Set keys of [env] (null removes one); written to plugin.toml, used from the next hook call."""
    body = json_body(request, EnvIn)
    return json_response(plugin_config.set_env(name, body.env, actor=actor(request)))


@router.get("/{name}/advanced-config", response={200: AdvancedConfigOut, **E},
            operation_id="plugins_advanced_config")
def advanced_config(request, name: str = PluginPath):
    _installed_or_404(name)
    return json_response(plugin_config_selectors.advanced_config(name))


@router.put("/{name}/advanced-config", response={200: AdvancedConfigOut, **E},
            operation_id="plugins_advanced_config_set",
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                "schema": AdvancedConfigIn.model_json_schema()}}}})
def set_advanced_config(request, name: str = PluginPath):
    """Change [hooks] settings (timeout, retries, caches, allow_network, limits…); only the keys given change,
    null restores a default. The whole manifest is validated before plugin.toml is written."""
    body = json_body(request, AdvancedConfigIn)
    return json_response(plugin_config.set_advanced_config(name, body.model_dump(exclude_unset=True),
                                                            actor=actor(request)))
