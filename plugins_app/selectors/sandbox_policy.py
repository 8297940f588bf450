"""The sandbox each installed plugin gets, as its manifest asks and as it is granted (`GET
/api/context-engine/sandbox-policy`, the engine page's extras)."""

from __future__ import annotations

from engine import hook_policy
from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import config_cache, home
from plugins_app.selectors import permissions


def sandbox_policy() -> dict:
    """What each installed plugin's manifest asks: network, filesystem, resource limits (null: the service's default
    applies), and where its writable data lives; `granted`: what its hooks get now (an unapproved version gets the
    defaults instead of its asks, and the ceilings bound everything: plugins_app/selectors/permissions.py).
    `serving` marks the active chain."""
    catalog = plugin_catalog()
    cfg = config_cache().get()
    serving = set(hook_policy.chain(catalog, cfg))
    plugins = []
    for name in catalog.names():
        try:
            entry = catalog.get(name)
        except KeyError:  # uninstalled meanwhile
            continue
        m = entry.plugin.manifest if entry.plugin is not None else None
        row = {"name": entry.name, "enabled": entry.enabled, "valid": m is not None, "serving": entry.name in serving}
        if m is not None:
            h = m.hooks
            row.update({
                "runtime": m.runtime.label,
                "network": {"allowed": h.allow_network},
                "filesystem": {"allow_filesystem": h.allow_filesystem, "plugin_dir": str(entry.dir),
                               "data_dir": str(home().data_dir(entry.name)),
                               "shared_state": h.enable_shared_state},
                "limits": {"hook_timeout_secs": h.hook_timeout_secs, "max_memory_mb": h.max_memory_mb,
                           "max_cpu_secs": h.max_cpu_secs, "after_turn_queue_depth": h.after_turn_queue_depth},
                "env": {"keys": sorted(m.env), "allowed_env_vars": sorted(set(h.allowed_env_vars)
                                                                          | set(cfg.context_engine.allowed_env_vars)),
                        "allowed_secrets": list(h.allowed_secrets)},
                "persistent_subprocess": h.persistent_subprocess, "prewarm_subprocesses": h.prewarm_subprocesses,
                "warm_start": h.warm_start, "otel_endpoint": h.otel_endpoint,
                "circuit_breaker": h.circuit_breaker.model_dump() if h.circuit_breaker else None,
                "granted": permissions.effective(entry.name),
            })
        plugins.append(row)
    return {"mode": cfg.context_engine.mode if cfg.context_engine.chain else "default", "plugins": plugins,
            "global_defaults": {"allow_network": False, "allow_filesystem": True,
                                "allowed_env_vars": list(cfg.context_engine.allowed_env_vars)}}
