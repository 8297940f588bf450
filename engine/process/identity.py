"""The host identity a plugin's hooks run as when the service is root: uid = gid = `[sandbox] uid_base` + a stable
slot of the plugin's name (engine/config.py `SandboxConfig`), never root nor the service's own user. Stable across
restarts and hosts (a hash, no state), so files a plugin wrote keep their owner. Two plugins may share a slot
(about 1 in 2,000 for 100 plugins with the default range): each still sees only its own directories
(docs/security.md)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from engine.config import ConfigCache
from engine.home import Home
from engine.process import sandbox

_lock = threading.Lock()
_caches: dict[Path, ConfigCache] = {}


def hook_ids(home_dir: Path | None, plugin: str) -> tuple[int, int]:
    """(uid, gid) of `plugin`'s hooks under the config.toml of `home_dir` ($LIBREFANG_HOME when None)."""
    config = _config(Path(home_dir) if home_dir is not None else Home.from_env().root).sandbox
    slot = int.from_bytes(hashlib.sha256(plugin.encode("utf-8")).digest()[:8], "big") % config.uid_count
    uid = config.uid_base + slot
    if uid in (0, os.getuid()):  # a range an operator set over the service's own uid: never that one
        raise ValueError(f"[sandbox] uid range gives plugin {plugin!r} uid {uid}, the service's own")
    return uid, uid


def plugin_ids(home_dir: Path | None, plugin: str) -> tuple[int, int] | None:
    """`hook_ids` where hooks drop to an identity of their own here (a root service); None where they run as the
    service's user (sandbox.degraded says so)."""
    return hook_ids(home_dir, plugin) if sandbox.uid_drop() else None


def _config(home: Path):
    path = home / "config.toml"
    with _lock:
        cache = _caches.get(path)
        if cache is None:
            cache = _caches[path] = ConfigCache(path)
    return cache.get()
