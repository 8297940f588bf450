"""Editing a plugin's plugin.toml over the API and the dashboard: its [env] and its [hooks] execution settings
(LibreFang's `PUT /plugins/{name}/env` and `/advanced-config`). Every edit is validated as a whole manifest before
anything is written, then published like a reload (plugins_app/services/plugins.py)."""

from __future__ import annotations

import re
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from engine.plugins.manifest import ManifestError, parse_manifest_text
from plugins_app.errors import PluginError
from plugins_app.home import catalog as plugin_catalog
from plugins_app.selectors.plugin_config import advanced_config, plugin_env
from plugins_app.services import audit, bundles, permissions
from plugins_app.services import config as config_service
from plugins_app.services.plugins import record_change, require_installed

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# Settings of [hooks] an operator may change over the API; the hook script paths and runtime are the plugin's own.
ADVANCED_KEYS = ("hook_timeout_secs", "on_hook_failure", "max_retries", "retry_delay_ms", "ingest_filter",
                 "ingest_regex", "only_for_agent_ids", "hook_cache_ttl_secs", "assemble_cache_ttl_secs",
                 "compact_cache_ttl_secs", "persistent_subprocess", "prewarm_subprocesses", "warm_start",
                 "after_turn_queue_depth", "after_turn_max_chars", "allow_network", "allow_filesystem",
                 "max_memory_mb", "max_cpu_secs", "circuit_breaker", "priority", "enable_shared_state",
                 "otel_endpoint")


def _edit_manifest(name: str, edit, actor: str, action: str, details: dict) -> None:
    """Apply `edit(doc)` to plugin.toml (tomlkit keeps comments and layout); the result must be a valid manifest
    or nothing is written. The catalog sees the new file on the next call."""
    path = require_installed(name) / "plugin.toml"
    try:
        original = path.read_text(encoding="utf-8")
        doc = tomlkit.parse(original)
    except (OSError, UnicodeDecodeError, TOMLKitError) as exc:
        raise PluginError("invalid_manifest", f"plugin.toml of {name!r} cannot be read: {exc}", 400) from exc
    edit(doc)
    text = tomlkit.dumps(doc)
    try:
        parse_manifest_text(text)
    except ManifestError as exc:
        audit.record(actor, action, name, ok=False, details={**details, "error": str(exc)})
        raise PluginError("invalid_config", f"the change would make plugin.toml invalid: {exc}", 400,
                          [f.to_dict() for f in exc.findings]) from exc
    was_in_force = permissions.in_force(name, original)
    config_service.atomic_write(path, text)
    plugin_catalog().forget(name)
    bundles.publish_bundle(name)
    # the owner's own edit of a version that was in force is approved; an edit of one that was not is not
    permissions.after_owner_act(name, actor, "edit", text=text, edited_in_force=was_in_force)
    record_change(name, "configured", actor, action, details)


def _set_keys(doc, table_name: str, changes: dict[str, Any]) -> None:
    """Set keys of one plugin.toml table (created when missing); a None value removes the key."""
    table = doc.get(table_name)
    if table is None:
        table = tomlkit.table()
        doc[table_name] = table
    for k, v in changes.items():
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v


def set_env(name: str, env: dict[str, str | None], actor: str) -> dict:
    """Set (or, with null, remove) keys of the plugin's [env]. Hooks get them on their next call."""
    bad = [k for k in env if not re.match(ENV_NAME, k)]
    if bad:
        raise PluginError("invalid_env", f"not an environment variable name: {', '.join(map(repr, bad))}", 400)

    def edit(doc):
        _set_keys(doc, "env", {k: None if v is None else str(v) for k, v in env.items()})
    _edit_manifest(name, edit, actor, "plugin.env", {"set": sorted(k for k, v in env.items() if v is not None),
                                                     "removed": sorted(k for k, v in env.items() if v is None)})
    return plugin_env(name)


def set_advanced_config(name: str, changes: dict[str, Any], actor: str) -> dict:
    """Change [hooks] execution settings (timeout, retries, caches, sandbox switches, limits); null removes a
    setting (its default applies). Validated as a whole manifest before anything is written."""
    unknown = sorted(set(changes) - set(ADVANCED_KEYS))
    if unknown:
        raise PluginError("invalid_config", f"not an advanced setting: {', '.join(unknown)}; settable: "
                                            f"{', '.join(ADVANCED_KEYS)}", 400)

    def edit(doc):
        _set_keys(doc, "hooks", changes)
    _edit_manifest(name, edit, actor, "plugin.advanced_config", {"changed": sorted(changes)})
    return advanced_config(name)
