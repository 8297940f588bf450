"""Runtime probes for the doctor: every runtime's launcher run with its version flag, 5 s cap each, probed
concurrently and cached briefly (as LibreFang's doctor probes them)."""

from __future__ import annotations

import concurrent.futures
import subprocess
import threading
import time
from dataclasses import asdict, dataclass

from engine.process.runtimes import RUNTIMES, find_launcher

PROBE_TIMEOUT_SECS = 5.0
CACHE_SECS = 30.0


@dataclass
class RuntimeStatus:
    runtime: str
    launcher: str | None
    available: bool
    version: str | None
    install_hint: str

    def to_dict(self) -> dict:
        return asdict(self)


def probe(tag: str, timeout: float = PROBE_TIMEOUT_SECS) -> RuntimeStatus:
    rt = RUNTIMES[tag]
    if rt.launcher is None:
        return RuntimeStatus(tag, None, True, None, rt.install_hint)
    path = find_launcher(tag)
    if path is None:
        return RuntimeStatus(tag, rt.launcher, False, None, rt.install_hint)
    try:
        out = subprocess.run([path, *rt.version_args], stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=timeout, start_new_session=True)
    except (OSError, subprocess.SubprocessError):
        return RuntimeStatus(tag, path, False, None, rt.install_hint)
    if out.returncode != 0:
        return RuntimeStatus(tag, path, False, None, rt.install_hint)
    text = out.stdout.decode("utf-8", "replace").strip() or out.stderr.decode("utf-8", "replace").strip()
    version = next((line.strip() for line in text.splitlines() if line.strip()), None)
    return RuntimeStatus(tag, path, True, version, rt.install_hint)


_cache_lock = threading.Lock()
_cache: tuple[float, list[RuntimeStatus]] | None = None


def probe_all(max_age: float = CACHE_SECS) -> list[RuntimeStatus]:
    """All 12 runtimes, in RUNTIMES order. Cached for `max_age` seconds (0 forces a fresh probe)."""
    global _cache
    with _cache_lock:
        if _cache is not None and max_age > 0 and time.monotonic() - _cache[0] < max_age:
            return list(_cache[1])
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(RUNTIMES)) as pool:
        results = list(pool.map(probe, RUNTIMES))
    with _cache_lock:
        _cache = (time.monotonic(), results)
    return list(results)
