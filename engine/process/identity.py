"""The host identity a plugin's hooks run as: a stable slot of the plugin's name in a range of ids, never root nor the
service's own user. A root service takes uid = gid = `[sandbox] uid_base` + the slot among `uid_count`
(engine/config.py `SandboxConfig`); a service that is not root takes uid and gid from its user's first subordinate
ranges (/etc/subuid, /etc/subgid: engine/process/sandbox_userns.py), start + the slot among the smaller count.
Stable across restarts and hosts (a hash, no state), so files a plugin wrote keep their owner. Two plugins may share
a slot (about 1 in 2,000 for 100 plugins with the root default, about 1 in 14 with a 65,536-id subordinate range): each
still sees only its own directories (docs/security.md)."""

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
    """(uid, gid) of `plugin`'s hooks: from the subordinate ranges where the service is not root and has them, else
    from the `[sandbox]` range of the config.toml of `home_dir` ($LIBREFANG_HOME when None)."""
    ranges = sandbox.mapped_ids()
    if ranges:
        (uid_start, uid_count), (gid_start, gid_count) = ranges
        slot = _slot(plugin, min(uid_count, gid_count))
        return uid_start + slot, gid_start + slot
    config = _config(Path(home_dir) if home_dir is not None else Home.from_env().root).sandbox
    uid = config.uid_base + _slot(plugin, config.uid_count)
    if uid in (0, os.getuid()):  # a range an operator set over the service's own uid: never that one
        raise ValueError(f"[sandbox] uid range gives plugin {plugin!r} uid {uid}, the service's own")
    return uid, uid


def plugin_ids(home_dir: Path | None, plugin: str) -> tuple[int, int] | None:
    """`hook_ids` where hooks drop to an identity of their own here (a root service, or one with subordinate ids);
    None where they run as the service's user (sandbox.degraded says so)."""
    return hook_ids(home_dir, plugin) if sandbox.uid_drop() else None


def _slot(plugin: str, count: int) -> int:
    return int.from_bytes(hashlib.sha256(plugin.encode("utf-8")).digest()[:8], "big") % count


def _config(home: Path):
    path = home / "config.toml"
    with _lock:
        cache = _caches.get(path)
        if cache is None:
            cache = _caches[path] = ConfigCache(path)
    return cache.get()
