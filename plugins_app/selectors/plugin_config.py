"""A plugin's settings as its plugin.toml sets them: its `[env]` and the `[hooks]` settings the advanced-config
routes show (plugins_app/services/plugin_config.py writes both)."""

from __future__ import annotations

from engine.plugins.permissions import masked_env
from plugins_app.home import catalog as plugin_catalog


def _manifest(name: str):
    catalog = plugin_catalog()
    if not catalog.exists(name):
        return None
    entry = catalog.get(name)
    return entry.plugin.manifest if entry.plugin is not None else None


def plugin_env(name: str) -> dict:
    """[env] (values of keys that look secret masked as ***), env_schema with which keys are present."""
    m = _manifest(name)
    if m is None:
        return {"name": name, "env": {}, "env_schema": {}, "enable_shared_state": False, "valid": False}
    schema = {}
    for key, spec in m.hooks.env_schema.items():
        required = key.startswith("!")
        k = key[1:] if required else key
        desc = spec.get("description") if isinstance(spec, dict) else spec if isinstance(spec, str) else None
        schema[k] = {"description": desc, "required": required or bool(isinstance(spec, dict) and spec.get("required")),
                     "present": k in m.env}
    return {"name": name, "env": masked_env(dict(sorted(m.env.items()))), "env_schema": schema,
            "enable_shared_state": m.hooks.enable_shared_state, "valid": True}


def advanced_config(name: str) -> dict:
    m = _manifest(name)
    if m is None:
        return {"name": name, "valid": False}
    h = m.hooks
    return {
        "name": name, "valid": True, "runtime": m.runtime.label,
        "hook_timeout_secs": h.hook_timeout_secs, "on_hook_failure": h.on_hook_failure, "max_retries": h.max_retries,
        "retry_delay_ms": h.retry_delay_ms, "ingest_filter": h.ingest_filter, "ingest_regex": h.ingest_regex,
        "only_for_agent_ids": list(h.only_for_agent_ids), "hook_cache_ttl_secs": h.hook_cache_ttl_secs,
        "assemble_cache_ttl_secs": h.assemble_cache_ttl_secs, "compact_cache_ttl_secs": h.compact_cache_ttl_secs,
        "persistent_subprocess": h.persistent_subprocess, "prewarm_subprocesses": h.prewarm_subprocesses,
        "warm_start": h.warm_start, "after_turn_queue_depth": h.after_turn_queue_depth,
        "after_turn_max_chars": h.after_turn_max_chars, "allow_network": h.allow_network,
        "allow_filesystem": h.allow_filesystem, "max_memory_mb": h.max_memory_mb, "max_cpu_secs": h.max_cpu_secs,
        "circuit_breaker": h.circuit_breaker.model_dump() if h.circuit_breaker else None, "priority": h.priority,
        "enable_shared_state": h.enable_shared_state, "otel_endpoint": h.otel_endpoint,
    }
