"""Reads of the context-engine configuration and the chain that serves agents."""

from __future__ import annotations

from engine import hook_policy
from engine import hooks as H
from engine.plugins.lint import hooks_valid
from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import config_cache, home
from plugins_app.selectors import outcomes


def engine_config() -> dict:
    cfg = config_cache().get()
    ce = cfg.context_engine
    return {
        "engine": "plugin" if ce.chain else "default",
        "mode": ce.mode,
        "plugin": ce.plugin,
        "plugin_stack": list(ce.plugin_stack),
        "chain": ce.chain,
        "serving": hook_policy.chain(plugin_catalog(), cfg),
        "stable_prefix_mode": ce.stable_prefix_mode,
        "max_recall_results": ce.max_recall_results,
        "context_window_tokens": ce.context_window_tokens,
        "allowed_env_vars": list(ce.allowed_env_vars),
        "after_turn_max_chars": ce.after_turn_max_chars,
        "config_path": str(home().config_path),
        "config_error": cfg.error,
    }


def chain() -> dict:
    """LibreFang's GET /context-engine/chain shape, plus per-layer validity."""
    cfg = config_cache().get()
    catalog = plugin_catalog()
    bad = outcomes.failing()
    out = []
    for name in cfg.context_engine.chain:
        if not catalog.exists(name):
            out.append({"plugin": name, "installed": False, "enabled": False, "hooks_valid": False, "hooks": {},
                        "runtime": None, "serving": False, "cannot_run": "not installed"})
            continue
        entry = catalog.get(name)
        m = entry.plugin.manifest if entry.plugin else None
        declared = m.hooks.declared_hooks() if m else {}
        out.append({
            "plugin": name, "installed": True, "enabled": entry.enabled, "valid": entry.valid,
            "hooks_valid": bool(m) and hooks_valid(entry.dir, declared),
            "hooks": {h: h in declared for h in H.ALL_HOOKS},
            "runtime": m.runtime.label if m else None,
            "hook_timeout_secs": m.hooks.hook_timeout_secs if m else None,
            "cache_ttl_secs": m.hooks.hook_cache_ttl_secs if m else None,
            "cannot_run": entry.cannot_run,
            # serving = enabled AND able to run: a deno plugin without deno is enabled but serves nothing
            "serving": entry.enabled and m is not None and not entry.cannot_run,
            # hooks whose recent agent calls fail (plugins_app/selectors/outcomes.py)
            "failing": bad.get(name, {}),
        })
    mode = cfg.context_engine.mode
    return {"mode": mode, "chain": out, "chain_length": len(out), "fallback": "default engine (built-in memory recall)"}
