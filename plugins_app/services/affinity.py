"""Which jobs ask for agent affinity (`affinity = "agent"` in plugin.toml, docs/scale-out.md).

The web tier asks this for every hook job it queues with an agent id, so the answer is kept for a second: a
manifest edit or a configuration change takes effect on the next second's jobs. It reads the process's catalog and
config (plugins_app/home.py): the web tier builds no ContextEngine.
"""

from __future__ import annotations

import threading
import time

from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import config_cache

TTL_SECS = 1.0
_cache: dict[tuple[str, str], tuple[float, bool]] = {}
_lock = threading.Lock()


def wants_agent_affinity(kind: str, plugin: str) -> bool:
    """Whether a job of `kind` may run a plugin with `affinity = "agent"`: the plugin it names (the test console),
    or any plugin of the configured chain (an agent's hook call)."""
    key = (kind, plugin)
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
    if hit is not None and now - hit[0] < TTL_SECS:
        return hit[1]
    value = any(_affinity(name) == "agent" for name in _plugins_of(kind, plugin))
    with _lock:
        _cache[key] = (now, value)
    return value


def forget() -> None:
    with _lock:
        _cache.clear()


def _plugins_of(kind: str, plugin: str) -> list[str]:
    if kind == "test_hook":
        return [plugin] if plugin else []
    return list(config_cache().get().context_engine.chain)


def _affinity(name: str) -> str:
    catalog = plugin_catalog()
    if not catalog.exists(name):
        return "none"
    loaded = catalog.get(name).plugin
    return loaded.manifest.affinity if loaded is not None else "none"
