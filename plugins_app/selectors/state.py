"""Reads behind LibreFang's per-plugin routes: the plugin's data directory (state), its [env], its [hooks]
settings (advanced-config), the sandbox each plugin gets (sandbox-policy), and per-agent hook metrics."""

from __future__ import annotations

import datetime as dt
import os

from django.db.models import Avg, Count, Max, Q, Sum
from django.utils import timezone

from engine import hook_policy
from engine.filecache import tree_size
from engine.plugins.catalog import LAST_GOOD_FILE
from engine.plugins.permissions import masked_env
from engine.plugins.requirements import VENV_DIRS
from engine.process import data_disks
from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import config_cache, home
from plugins_app.models import HookTrace
from plugins_app.selectors import permissions

MAX_FILES_LISTED = 500
# Kept in the data dir by the service, not by the plugin: its virtualenv (install-deps) and the last manifest that
# loaded (engine/plugins/catalog.py). State routes neither list nor wipe them.
SERVICE_OWNED = frozenset(VENV_DIRS) | {LAST_GOOD_FILE}


def _manifest(name: str):
    catalog = plugin_catalog()
    if not catalog.exists(name):
        return None
    entry = catalog.get(name)
    return entry.plugin.manifest if entry.plugin is not None else None


def plugin_state(name: str) -> dict:
    """What the plugin keeps in $LIBREFANG_HOME/plugin_data/<name>: total size, file list (first 500 by path), and
    the agents that have a state file (enable_shared_state)."""
    root = home().data_dir(name)
    files, total, count = [], 0, 0
    if root.is_dir() and not root.is_symlink():
        for dirpath, dirnames, filenames in os.walk(root):
            top = dirpath == str(root)
            dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                                 and not (top and d in SERVICE_OWNED))
            for f in sorted(filenames):
                if top and f in SERVICE_OWNED:
                    continue
                full = os.path.join(dirpath, f)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                count += 1
                total += st.st_size
                if len(files) < MAX_FILES_LISTED:
                    files.append({"path": os.path.relpath(full, root), "size_bytes": st.st_size,
                                  "modified": dt.datetime.fromtimestamp(st.st_mtime, dt.UTC).isoformat()})
    agents_dir = root / "agents"
    agents = sorted(p.name for p in agents_dir.iterdir() if (p / "state.json").is_file()) \
        if agents_dir.is_dir() and not agents_dir.is_symlink() else []
    venv = root / VENV_DIRS[0]
    return {"plugin": name, "path": str(root), "exists": root.is_dir(), "size_bytes": total, "file_count": count,
            "files": files, "files_truncated": count > len(files), "agents_with_state": agents,
            "venv": {"present": venv.is_dir(), "size_bytes": tree_size(str(venv)) if venv.is_dir() else 0},
            # its own filesystem (engine/process/data_disks.py): None until its first hook, or where it cannot be
            "disk": data_disks.usage(root), "disk_unavailable": data_disks.unavailable()}


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


def per_agent_metrics(hours: float | None = None, agent_id: str | None = None) -> dict:
    """Calls, failures and latency per agent and hook, from the stored traces of agent calls (test-console runs
    left out), optionally over the last `hours`."""
    qs = HookTrace.objects.exclude(origin="test_console").exclude(agent_id="")
    if hours:
        qs = qs.filter(started_at__gte=timezone.now() - dt.timedelta(hours=hours))
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    rows = (qs.values("agent_id", "hook")
            .annotate(calls=Count("id"), failures=Count("id", filter=Q(ok=False)), total_ms=Sum("elapsed_ms"),
                      avg_ms=Avg("elapsed_ms"), last_call=Max("started_at"))
            .order_by("agent_id", "hook"))
    per_agent: dict[str, dict] = {}
    for r in rows:
        agent = per_agent.setdefault(r["agent_id"], {"hooks": {}, "calls": 0, "failures": 0})
        agent["hooks"][r["hook"]] = {"calls": r["calls"], "successes": r["calls"] - r["failures"],
                                     "failures": r["failures"], "total_ms": round(r["total_ms"] or 0.0, 3),
                                     "avg_ms": round(r["avg_ms"] or 0.0, 3),
                                     "last_call": r["last_call"].isoformat() if r["last_call"] else None}
        agent["calls"] += r["calls"]
        agent["failures"] += r["failures"]
    return {"per_agent": per_agent, "total_agents": len(per_agent), "window_hours": hours}
