"""What a plugin's reply may change beyond its own answer: bootstrap overrides (env, ingest_filter, allow_network,
kept for every later call), and pinned messages an assemble/compact reply dropped (put back)."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from engine.filecache import file_stamp
from engine.home import Home

log = logging.getLogger("librefang.engine")

OVERRIDES_FILE = "bootstrap_overrides.json"

@dataclass
class Overrides:
    """What a plugin's bootstrap reply changed for its later calls (per worker process, like LibreFang)."""

    env: dict[str, str] = field(default_factory=dict)  # env_overrides; static [env] keys win
    ingest_filter: str | None = None
    allow_network: bool | None = None


class BootstrapOverrides:
    """Per plugin, what its last bootstrap reply changed. Stored in the plugin's data dir so every worker process
    sharing this LIBREFANG_HOME applies them (LibreFang keeps them in its single daemon's memory); re-read on
    change, one stat per read."""

    def __init__(self, home: Home):
        self.home = home
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple, Overrides | None]] = {}

    def path(self, plugin: str):
        return self.home.data_dir(plugin) / OVERRIDES_FILE

    def store(self, plugin: str, reply: dict[str, Any]) -> None:
        """Keep what a bootstrap reply overrides (env_overrides, ingest_filter, allow_network)."""
        o = Overrides()
        if isinstance(reply.get("env_overrides"), dict):
            o.env = {str(k): str(v) for k, v in reply["env_overrides"].items() if v is not None}
        if isinstance(reply.get("ingest_filter"), str):
            o.ingest_filter = reply["ingest_filter"]
        if isinstance(reply.get("allow_network"), bool):
            o.allow_network = reply["allow_network"]
        path = self.path(plugin)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_text(json.dumps({"env_overrides": o.env, "ingest_filter": o.ingest_filter,
                                       "allow_network": o.allow_network}))
            tmp.replace(path)
        except OSError:
            log.warning("cannot store bootstrap overrides of %s", plugin, exc_info=True)
        with self._lock:
            self._cache[plugin] = (file_stamp(path), o)

    def get(self, plugin: str) -> Overrides | None:
        """What the plugin's last bootstrap reply changed (None: no bootstrap override)."""
        path = self.path(plugin)
        stamp = file_stamp(path)
        with self._lock:
            cached = self._cache.get(plugin)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        value = None
        if stamp:
            try:
                raw = json.loads(path.read_text())
                value = Overrides(env={str(k): str(v) for k, v in (raw.get("env_overrides") or {}).items()},
                                  ingest_filter=raw.get("ingest_filter") if isinstance(raw.get("ingest_filter"), str)
                                  else None,
                                  allow_network=raw.get("allow_network") if isinstance(raw.get("allow_network"), bool)
                                  else None)
            except (OSError, ValueError, AttributeError):
                value = None
        with self._lock:
            self._cache[plugin] = (stamp, value)
        return value


def restore_pinned(original: list[dict], result: list[dict]) -> tuple[list[dict], list[str]]:
    """Put back any pinned message a plugin dropped, in its original relative order; one warning per message."""
    def key(m: dict) -> str:
        return json.dumps([m.get("role"), m.get("content")], sort_keys=True, default=str)

    present = {key(m) for m in result}
    missing = [(i, m) for i, m in enumerate(original) if isinstance(m, dict) and m.get("pinned") and key(m) not in present]
    if not missing:
        return result, []
    out = list(result)
    warnings = []
    for i, m in missing:
        # insert before the first result message that came after it in the original, else append
        out.insert(_insert_at(original, m, out, key), m)
        warnings.append(f"pinned message #{i} ({m.get('role')}) was dropped by the plugin and has been restored")
    return out, warnings


def _insert_at(original: list[dict], pinned: dict, out: list[dict], key) -> int:
    orig_keys = [key(m) for m in original]
    pos = orig_keys.index(key(pinned))
    later = set(orig_keys[pos + 1:])
    for idx, m in enumerate(out):
        if key(m) in later:
            return idx
    return len(out)
