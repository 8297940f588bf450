"""Which hook jobs go to their agent's worker host (`affinity = "agent"` in plugin.toml, docs/scale-out.md).

The caller that queues a job decides (plugins_app/services/hooks.py) and hands the bus only the agent id to hash
(`agent=`); plugins_app/bus/affinity.py knows hosts and streams, not plugins. The web tier asks this for every hook
job that carries an agent id, on the event loop, so the per-plugin answer is kept for a second: a manifest edit or a
configuration change routes the next second's jobs. It reads the process's cached catalog and config
(plugins_app/home.py): the web tier builds no ContextEngine.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import config_cache

log = logging.getLogger("librefang.bus")

TTL_SECS = 1.0
_cache: dict[str, tuple[float, bool]] = {}
_lock = threading.Lock()


def agent_to_route(request: Any, plugin: str = "") -> str | None:
    """The agent id a hook job is routed by (bus `agent=`), or None for the shared stream: the request names an
    agent and a plugin the job may run asks for agent affinity. `plugin` is the one plugin a test-console job runs;
    "" means the configured chain (an agent's hook call)."""
    agent = request.get("agent_id") if isinstance(request, dict) else None
    if not agent:
        return None
    try:
        wanted = wants_agent_affinity(plugin)
    except Exception:  # a configuration that does not load: the job still goes out, as without affinity
        log.warning("agent affinity unknown for %s; shared stream", plugin or "(chain)", exc_info=True)
        wanted = False
    return str(agent) if wanted else None


def wants_agent_affinity(plugin: str = "") -> bool:
    """Whether a job may run a plugin with `affinity = "agent"`: the plugin it names (the test console), or any
    plugin of the configured chain ("")."""
    now = time.monotonic()
    with _lock:
        hit = _cache.get(plugin)
    if hit is not None and now - hit[0] < TTL_SECS:
        return hit[1]
    names = [plugin] if plugin else list(config_cache().get().context_engine.chain)
    value = any(_affinity(name) == "agent" for name in names)
    with _lock:
        _cache[plugin] = (now, value)
    return value


def forget() -> None:
    with _lock:
        _cache.clear()


def _affinity(name: str) -> str:
    catalog = plugin_catalog()
    if not catalog.exists(name):
        return "none"
    loaded = catalog.get(name).plugin
    return loaded.manifest.affinity if loaded is not None else "none"
