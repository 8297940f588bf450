"""What keeps a failing or slow plugin from costing every call: a per-hook reply cache with a time to live, and
circuit breakers. Both in memory per worker process."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any


class TtlCache:
    """Per-hook reply cache (hook_cache_ttl_secs, assemble_cache_ttl_secs, compact_cache_ttl_secs), in memory per
    worker process, keyed by plugin and the SHA-256 of the request JSON (LibreFang's scheme)."""

    MAX_ENTRIES = 512

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._data: dict[tuple[str, str, str], tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self.clock = clock

    @staticmethod
    def key(plugin: str, hook: str, request: dict) -> tuple[str, str, str]:
        digest = hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()
        return (plugin, hook, digest)

    def get(self, key: tuple[str, str, str]) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            if hit[0] <= self.clock():
                del self._data[key]
                return None
            return hit[1]

    def put(self, key: tuple[str, str, str], value: Any, ttl: float) -> None:
        with self._lock:
            now = self.clock()
            if len(self._data) >= self.MAX_ENTRIES:
                for k in [k for k, (exp, _) in self._data.items() if exp <= now]:
                    del self._data[k]
                while len(self._data) >= self.MAX_ENTRIES:
                    self._data.pop(next(iter(self._data)))
            self._data[key] = (now + ttl, value)

    def clear(self, plugin: str | None = None) -> None:
        with self._lock:
            for k in [k for k in self._data if plugin is None or k[0] == plugin]:
                del self._data[k]


class CircuitBreakers:
    """`circuit_breaker = {max_failures, reset_secs}`: after max_failures consecutive failures of one plugin's hook
    for one agent, calls fail fast (circuit_open) until reset_secs pass; then one probe call decides. In memory per
    worker process (LibreFang persists it in SQLite; a worker restart closes every circuit here)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._state: dict[tuple[str, str, str], tuple[int, float]] = {}  # key -> (consecutive failures, opened at)
        self._lock = threading.Lock()

    def check(self, key: tuple[str, str, str], max_failures: int, reset_secs: float) -> str | None:
        """None when the call may go ahead; otherwise why it may not."""
        with self._lock:
            failures, opened = self._state.get(key, (0, 0.0))
            if failures < max_failures:
                return None
            remaining = opened + reset_secs - self.clock()
            if remaining <= 0:
                self._state[key] = (failures, self.clock())  # half-open: this call is the probe
                return None
            return f"circuit open after {failures} consecutive failures; retrying in {remaining:.0f}s"

    def record(self, key: tuple[str, str, str], ok: bool) -> None:
        with self._lock:
            if ok:
                self._state.pop(key, None)
            else:
                failures, _ = self._state.get(key, (0, 0.0))
                self._state[key] = (failures + 1, self.clock())
