"""Plugin lifecycle: scaffold, reload, enable/disable, install, update, uninstall, install-deps and the active
chain in config.toml (editing [env] and [hooks] settings: plugins_app/services/plugin_config.py). Every change writes
an AuditEntry and announces itself with events.plugin_changed.

Callers (API, dashboard views, CLI) catch PluginError (plugins_app/errors.py, re-exported here): `code` is stable, `status` is the HTTP status to answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from django.db import IntegrityError

from engine.plugins import install as I
from engine.plugins.catalog import DISABLED_MARKER
from engine.plugins.manifest import NAME_RE, ManifestError
from engine.plugins.scaffold import ScaffoldError, plan
from engine.process import plugin_files
from plugins_app import bus, events
from plugins_app.errors import PluginError
from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import config_cache, home
from plugins_app.models import IdempotentResponse
from plugins_app.selectors.plugins import PluginSummary, get_plugin
from plugins_app.selectors.registries import default_registry, registry_configs
from plugins_app.services import audit, bundles, permissions
from plugins_app.services import config as config_service

log = logging.getLogger("librefang.plugins")


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise PluginError("invalid_name", f"plugin name {name!r} is not allowed: use 1-128 ASCII letters, digits, "
                                          "'-' or '_', starting with a letter or digit", 400)


def require_installed(name: str) -> Path:
    """The plugin's directory; PluginError 400 for a bad name, 404 when it is not installed."""
    _check_name(name)
    if not plugin_catalog().exists(name):
        raise PluginError("not_found", f"plugin {name!r} is not installed", 404)
    return home().plugin_dir(name)


def record_change(name: str, what: str, actor: str, action: str, details: dict | None = None,
                  ok: bool = True) -> None:
    """Every change to a plugin: an AuditEntry, and (when it happened) the dashboard's plugin_changed event."""
    audit.record(actor, action, name, ok=ok, details=details)
    if ok:
        events.plugin_changed(name, what)


# ---- scaffold ----

def same_but_case(name: str) -> str | None:
    """An installed plugin whose name differs from `name` only by case, if any."""
    folded = name.casefold()
    return next((n for n in plugin_catalog().names() if n != name and n.casefold() == folded), None)


def scaffold_plugin(name: str, description: str, runtime: str, hooks: list[str] | None, actor: str,
                    author: str = "") -> PluginSummary:
    """Create $LIBREFANG_HOME/plugins/<name>/ from the runtime's templates (runs as written)."""
    try:
        p = plan(name, description, runtime, hooks, author)
    except ScaffoldError as exc:
        raise PluginError(exc.code, exc.message, 400) from exc
    h = home()
    target = h.plugin_dir(name)
    if target.exists() or target.is_symlink():
        raise PluginError("already_exists", f"plugin {name!r} already exists", 409)
    twin = same_but_case(name)
    if twin:  # `UxPy` beside `uxpy`: one directory each on Linux, the same one on macOS and Windows
        raise PluginError("already_exists", f"plugin {twin!r} already exists (names differing only by case are "
                          "refused)", 409, {"existing": twin})
    h.plugins_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".scaffold-", dir=h.plugins_dir))
    try:
        for rel, data in p.files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if rel in p.executable:
                os.chmod(path, 0o755)
        try:
            os.rename(staging, target)  # atomic; fails if another request created it meanwhile
        except OSError as exc:
            raise PluginError("already_exists", f"plugin {name!r} already exists", 409) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    bundles.publish_bundle(name)
    permissions.after_owner_act(name, actor, "scaffold")
    record_change(name, "scaffolded", actor, "plugin.scaffold", {"runtime": p.runtime, "files": sorted(p.files)})
    summary = get_plugin(name)
    assert summary is not None
    return summary


# ---- reload / enable / disable ----

def reload_plugin(name: str, actor: str) -> dict:
    """Re-read plugin.toml now. A broken manifest is rejected (400) and the previous configuration keeps serving."""
    require_installed(name)
    catalog = plugin_catalog()
    try:
        loaded = catalog.validate(name)
    except ManifestError as exc:
        audit.record(actor, "plugin.reload", name, ok=False, details={"error": str(exc)})
        raise PluginError("invalid_manifest", f"plugin.toml of {name!r} is invalid; the previous configuration keeps "
                                              f"serving: {exc}", 400, [f.to_dict() for f in exc.findings]) from exc
    entry = catalog.get(name)
    from engine.plugins.lint import hooks_valid

    declared = loaded.manifest.hooks.declared_hooks()
    valid = hooks_valid(entry.dir, declared)
    bundles.publish_bundle(name)
    granted = permissions.after_owner_act(name, actor, "reload")
    record_change(name, "reloaded", actor, "plugin.reload", {"version": loaded.manifest.version})
    return {"status": "ok", "plugin": name, "name": name, "version": loaded.manifest.version,
            "runtime": loaded.manifest.runtime.label, "hooks": sorted(declared), "hooks_valid": valid,
            "hook_timeout_secs": loaded.manifest.hooks.hook_timeout_secs, "enabled": entry.enabled,
            "warnings": [f.to_dict() for f in loaded.findings], "permissions": granted,
            "message": "reloaded: the next call uses this configuration"
            + ("" if granted.get("in_force", True) else "; " + granted["message"])}


def set_enabled(name: str, enabled: bool, actor: str) -> dict:
    pdir = require_installed(name)
    marker = pdir / DISABLED_MARKER
    was = not marker.exists()
    if enabled:
        marker.unlink(missing_ok=True)
    else:
        marker.touch()
    bundles.set_bundle_enabled(name, enabled)
    what = "enabled" if enabled else "disabled"
    record_change(name, what, actor, f"plugin.{'enable' if enabled else 'disable'}", {"changed": was != enabled})
    return {"name": name, "enabled": enabled, "changed": was != enabled,
            "message": f"{name} is {what}; this takes effect on the next call"}


# ---- install / update / uninstall ----

def _from_install_error(exc: I.InstallError) -> PluginError:
    return PluginError(exc.code, exc.message, exc.status, exc.details)


@contextlib.contextmanager
def _install_errors() -> Iterator[None]:
    """engine/plugins/install.py's refusals as this service's (same code, message, status and details); the
    operations that audit a failure (install, update, install with dependencies) catch InstallError themselves."""
    try:
        yield
    except I.InstallError as exc:
        raise _from_install_error(exc) from exc


def install_plugin(source: dict, actor: str, idempotency_key: str | None = None) -> dict:
    """Install from {"source": "local", "path"} | {"source": "git", "url", "ref"?} |
    {"source": "registry", "name", "registry"?|"github_repo"?}. Same Idempotency-Key + same body replays the first
    answer; the same key with a different body is a 409."""
    body_hash = hashlib.sha256(json.dumps(source, sort_keys=True, default=str).encode()).hexdigest()
    if idempotency_key is not None:
        if not idempotency_key.strip() or len(idempotency_key) > 200:
            raise PluginError("invalid_idempotency_key", "Idempotency-Key must be 1-200 characters", 400)
        prior = IdempotentResponse.objects.filter(key=idempotency_key).first()
        if prior is not None:
            if prior.body_sha256 != body_hash:
                raise PluginError("idempotency_conflict", "this Idempotency-Key was used with a different body", 409)
            return {**prior.response, "idempotent_replay": True}
    try:
        src = I.Source.parse(source)
        result = I.install(home(), src, default_registry(), registry_configs())
    except I.InstallError as exc:
        audit.record(actor, "plugin.install", str(source.get("name") or source.get("path") or source.get("url") or ""),
                     ok=False, details={"source": source, "error": exc.message})
        raise _from_install_error(exc) from exc
    result["permissions"] = permissions.after_owner_act(result["name"], actor, "install")
    if idempotency_key is not None:
        try:
            IdempotentResponse.objects.create(key=idempotency_key, body_sha256=body_hash, status=201, response=result)
        except IntegrityError:
            pass
    plugin_catalog().forget(result["name"])
    bundles.publish_bundle(result["name"])
    record_change(result["name"], "installed", actor, "plugin.install", {"source": src.to_dict(),
                                                                      "version": result["version"]})
    return result


def update_plugin(name: str, force: bool, actor: str) -> dict:
    require_installed(name)
    try:
        result = I.update(home(), name, force=force, default_registry=default_registry(),
                          registries=registry_configs())
    except I.InstallError as exc:
        audit.record(actor, "plugin.update", name, ok=False, details={"error": exc.message, "force": force})
        raise _from_install_error(exc) from exc
    plugin_catalog().forget(name)
    bundles.publish_bundle(name)
    result["permissions"] = permissions.after_owner_act(name, actor, "update")
    record_change(name, "updated", actor, "plugin.update", {"version": result["version"], "force": force})
    return result


def uninstall_plugin(name: str, actor: str) -> dict:
    _check_name(name)
    with _install_errors():
        result = I.uninstall(home(), name)
    plugin_catalog().forget(name)
    bundles.retire_bundle(name)
    active = name in config_cache().get().context_engine.chain
    result["was_active"] = active
    record_change(name, "uninstalled", actor, "plugin.uninstall", {"was_active": active})
    return result


INSTALL_DEPS_WAIT_SECS = 330  # engine/plugins/requirements.py's own pip timeout (300 s) plus venv creation


def install_deps(name: str, actor: str, via_worker: bool = True) -> dict:
    """Install the plugin's requirements into its own virtualenv. pip runs build code from the internet, so it
    runs on a worker (the CLI may run it in-process when no worker is alive)."""
    require_installed(name)
    entry = plugin_catalog().get(name)
    if entry.plugin is None:
        raise PluginError("invalid_manifest", f"plugin {name!r} cannot be loaded", 400,
                          [f.to_dict() for f in entry.problems])
    if via_worker:
        try:
            reply = bus.submit_and_wait_sync("install_deps", "", {}, INSTALL_DEPS_WAIT_SECS, plugin=name)
        except Exception as exc:
            raise PluginError("worker_unavailable", f"the job bus is unreachable: {exc}", 503) from exc
        if reply is None:
            raise PluginError("worker_unavailable", f"no worker answered within {INSTALL_DEPS_WAIT_SECS}s", 503)
        data = {"ok": False, "success": False, "error": reply.body} if reply.failed else reply.data()
    else:
        data = run_install_deps(name)
    ok = bool(data.get("success", data.get("ok", False)))
    audit.record(actor, "plugin.install_deps", name, ok=ok, details={k: v for k, v in data.items() if k != "output"})
    if not ok:
        raise PluginError("install_deps_failed", str(data.get("error") or "installing dependencies failed"), 400, data)
    events.plugin_changed(name, "deps_installed")
    return {"success": True, **data}


def run_install_deps(name: str) -> dict:
    """The work itself (on a worker): build the plugin's venv with engine/plugins/requirements.py."""
    from engine.plugins import requirements as R

    entry = plugin_catalog().get(name)
    if entry.plugin is None:
        return {"ok": False, "success": False, "error": f"plugin {name!r} cannot be loaded"}
    try:
        outcome = R.install_requirements(entry.dir, entry.plugin.manifest, home(),
                                         disk_mb=config_cache().get().limits.max_disk_mb)
    except Exception as exc:
        return {"ok": False, "success": False, "error": f"installing dependencies failed: {exc}"}
    return outcome.to_dict()


# ---- the active chain ----

def set_engine_config(plugin: str | None, plugin_stack: list[str] | None, actor: str) -> dict:
    """Make `plugin` (or `plugin_stack`) the active context engine; both empty: the default engine."""
    if plugin is not None and plugin_stack:
        raise PluginError("invalid_config", "give either `plugin` or `plugin_stack`, not both", 400)
    names = list(plugin_stack or []) + ([plugin] if plugin else [])
    if len(set(names)) != len(names):
        raise PluginError("invalid_config", "plugin_stack lists a plugin twice", 400)
    catalog = plugin_catalog()
    for n in names:
        _check_name(n)
        if not catalog.exists(n):
            raise PluginError("not_found", f"plugin {n!r} is not installed", 400)
    path = home().config_path
    try:
        config_service.write_chain(path, plugin or None, list(plugin_stack or []) or None)
    except config_service.ConfigWriteError as exc:
        raise PluginError("config_invalid", str(exc), 409) from exc
    bundles.publish_config()
    audit.record(actor, "engine.config", ",".join(names) or "default",
                 details={"plugin": plugin, "plugin_stack": plugin_stack})
    for n in names or ["default"]:
        events.plugin_changed(n, "config")
    from plugins_app.selectors.config import engine_config

    return engine_config()


# ---- LibreFang's further plugin routes: install-with-deps, batch, export, update-check, state, env,
# advanced-config, registries (kept apart from the reload/enable/disable paths above) ----

def install_with_deps(name: str, registry: str | None, ref: str | None, actor: str) -> dict:
    """Install a registry plugin after the plugins it depends on (plugin_depends), from one fetch of the registry."""
    _check_name(name)
    try:
        result = I.install_with_dependencies(home(), name, registry, default_registry(), registry_configs(), ref)
    except I.InstallError as exc:
        audit.record(actor, "plugin.install_with_deps", name, ok=False,
                     details={"registry": registry, "error": exc.message})
        raise _from_install_error(exc) from exc
    for n in result["installed"]:
        plugin_catalog().forget(n)
        bundles.publish_bundle(n)
        result.setdefault("permissions", {})[n] = permissions.after_owner_act(n, actor, "install")
        record_change(n, "installed", actor, "plugin.install", {"source": {"kind": "registry", "registry": registry},
                                                           "as_dependency_of": name if n != name else None})
    return result


BATCH_OPERATIONS = ("enable", "disable", "reload")


def batch(operation: str, names: list[str], actor: str) -> dict:
    """The same operation on several plugins; each gets its own result, one failure does not stop the others."""
    if operation not in BATCH_OPERATIONS:
        raise PluginError("invalid_operation", f"operation must be one of {', '.join(BATCH_OPERATIONS)}", 400)
    results = []
    for name in names:
        try:
            if operation == "reload":
                out = reload_plugin(name, actor=actor)
            else:
                out = set_enabled(name, operation == "enable", actor=actor)
            results.append({"plugin": name, "ok": True, "result": out})
        except PluginError as exc:
            results.append({"plugin": name, "ok": False, "status": exc.status, "error": exc.to_dict()})
    return {"operation": operation, "results": results, "all_ok": all(r["ok"] for r in results),
            "succeeded": sum(r["ok"] for r in results), "failed": sum(not r["ok"] for r in results)}


def export_plugin(name: str, actor: str) -> bytes:
    require_installed(name)
    with _install_errors():
        data = I.export_archive(home(), name)
    audit.record(actor, "plugin.export", name, details={"bytes": len(data)})
    return data


def update_check(name: str) -> dict:
    require_installed(name)
    with _install_errors():
        return I.update_check(home(), name, default_registry(), registry_configs())


def wipe_state(name: str, actor: str) -> dict:
    """Empty the plugin's data directory ($LIBREFANG_HOME/plugin_data/<name>: per-agent state files, bootstrap
    overrides, anything its hooks wrote there). The directory itself stays, and so do what the service keeps there
    (the plugin's virtualenv, its last good manifest: plugins_app/selectors/plugin_data.py SERVICE_OWNED). What the
    hooks wrote is their identity's: engine/process/plugin_files.py removes it (a service that is not root, as root
    of its user namespace); what could not be removed is said (409 `state_wipe_incomplete`), never passed over."""
    from plugins_app.selectors.plugin_data import SERVICE_OWNED

    require_installed(name)
    root = home().data_dir(name)
    try:
        done = plugin_files.wipe(root, SERVICE_OWNED)
    except OSError as exc:
        raise PluginError("state_wipe_incomplete", f"the data directory of {name!r} was not emptied: {exc}",
                          409) from exc
    removed, freed = done["files_removed"], done["bytes_freed"]
    record_change(name, "state_wiped", actor, "plugin.state_wipe", {"files_removed": removed, "bytes_freed": freed})
    return {"plugin": name, "wiped": True, "files_removed": removed, "bytes_freed": freed, "path": str(root)}
