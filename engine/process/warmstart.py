"""Warm start for python hooks: fork each call from a per-interpreter zygote instead of exec'ing a new interpreter.

The protocol's promise is kept: every call is still a fresh process (forked from a zygote that has never run plugin
code), in a new session with its stdio pipes, and with the very sandbox a spawned hook gets: the runner's
SandboxSpec (engine/process/sandbox.py) travels as JSON and the zygote's child applies it with the same function
(`enter`: environment, cwd, namespaces, mounts, limits). The script runs as `__main__` with
`sys.argv = [script]` and `sys.path[0]` = its directory. The runner drives the child through the same loop as a
spawned one (`WarmProcess` quacks like `subprocess.Popen`), so timeouts kill the whole group and stderr streams the
same way. The zygote itself is `engine/process/warmstart_zygote.py`, run as a script by the resolved interpreter; the
worker's handle on it and on its children is `engine/process/zygote_client.py`; this module keeps the zygotes.

When it does not apply (another runtime, a custom launcher, `[hooks] warm_start = false`,
`LIBREFANG_WARM_START=0`) or the zygote is unavailable (it failed to start or died: it is restarted for later calls),
`spawn()` returns None and the runner spawns the hook cold: `spawn_exec()` hands it to the spawner
(engine/process/hook_spawner.py: the zygote's loop in exec mode, one per worker, run by the worker's own interpreter), which
execs it inside the same sandbox; only when that is unavailable too (or LIBREFANG_SPAWNER=0) does the worker spawn it.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.process import native_spare
from engine.process.zygote_client import (
    SANDBOX_MODULE,
    SPAWNER_SCRIPT,
    ZYGOTE_SCRIPT,
    WarmProcess,
    Zygote,
    ZygoteUnavailable,
)

__all__ = [
    "MAX_ZYGOTES", "SANDBOX_MODULE", "SPAWNER_SCRIPT", "ZYGOTE_HOME", "ZYGOTE_SCRIPT", "WarmProcess", "Zygote",
    "ZygoteUnavailable", "applies", "ensure", "globally_enabled", "helper_pids", "shutdown", "spawn", "spawn_exec",
    "spawner_enabled", "startup_env", "why_cold", "zygote_pids",
]

log = logging.getLogger("librefang.warmstart")

MAX_ZYGOTES = 8  # distinct (interpreter, start-up env) pairs kept warm; the least recently used one is stopped
RETRY_AFTER_FAILURE_SECS = 30.0

# Variables an interpreter reads while starting up (site, sys.path, locale, io encoding, hash seed ...). A zygote is
# started with exactly these from the hook's environment, and only serves hooks whose values are the same. HOME (the
# hook's data directory) is not one: a zygote starts with `ZYGOTE_HOME`, where no user site directory can be, and a
# hook whose own home has one is not forked warm (`why_cold`).
_STARTUP_PREFIXES = ("PYTHON", "LC_")
_STARTUP_KEYS = ("LANG", "LANGUAGE", "TZ", "VIRTUAL_ENV")
ZYGOTE_HOME = "/nonexistent"
# A zygote runs as root outside any sandbox: nothing a plugin controls may run in its start-up. Of the start-up
# variables a plugin may set in [env], these only choose among the interpreter's own behaviours; any other (PYTHONPATH,
# PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE, PYTHONPYCACHEPREFIX, PYTHONWARNINGS, ...) makes its hooks cold.
SAFE_PLUGIN_STARTUP = frozenset({
    "PYTHONIOENCODING", "PYTHONHASHSEED", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
    "PYTHONFAULTHANDLER", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONINTMAXSTRDIGITS", "PYTHONOPTIMIZE",
    "PYTHONCOERCECLOCALE", "PYTHONWARNDEFAULTENCODING", "PYTHONDEVMODE", "PYTHONMALLOC",
})


def globally_enabled(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get("LIBREFANG_WARM_START", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def applies(call: Any, argv: Sequence[str]) -> bool:
    """Whether this hook call can be forked from a zygote (a python hook run as `<python> <script>`, nothing of its
    plugin in the zygote's start-up)."""
    runtime = call.runtime
    return (
        getattr(call, "warm_start", True)
        and runtime.runtime.tag == "python"
        and not runtime.custom_launcher
        and len(argv) == 2
        and os.path.isabs(argv[0])
        and sys.platform.startswith("linux")
        and globally_enabled()
        and not why_cold(call)
    )


def why_cold(call: Any) -> str:
    """Why a python hook that could be forked warm is not: its start-up would run code its plugin controls (a
    zygote is root, outside any sandbox), or its home holds a user site a zygote cannot have. "" when it may."""
    if getattr(call, "venv_dir", None) is not None:
        return "it runs its plugin's own virtualenv, whose start-up (site, .pth files) its plugin wrote"
    for source in (getattr(call, "plugin_env", None) or {}, getattr(call, "extra_env", None) or {}):
        unsafe = sorted(k for k in source if k.startswith("PYTHON") and k not in SAFE_PLUGIN_STARTUP)
        if unsafe:
            return f"its plugin sets {', '.join(unsafe)}, which a zygote's start-up would follow"
    data_dir = getattr(call, "data_dir", None)
    if data_dir is not None and os.path.isdir(os.path.join(data_dir, ".local")):
        return "its home (the data directory) has a .local user site, which a zygote's start-up cannot have"
    return ""


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """What of a hook's environment its zygote is started with (and keyed by)."""
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_KEYS}


_lock = threading.Lock()
_zygotes: OrderedDict[tuple, Zygote] = OrderedDict()
_spawners: dict[tuple, Zygote] = {}  # one per launcher running engine/process/hook_spawner.py (in practice: one)
_key_locks: dict[tuple, threading.Lock] = {}
_failed_until: dict[tuple, float] = {}


def _get(launcher: str, env: Mapping[str, str], script: Path = ZYGOTE_SCRIPT) -> Zygote | None:
    spawner = script == SPAWNER_SCRIPT
    # The spawner starts with an empty environment but whether it may use the native spare (a test turns it off), a
    # zygote with its interpreter's start-up variables and that switch (its hooks' init is the same program).
    native = {k: os.environ[k] for k in (native_spare.SWITCH,) if k in os.environ}
    boot = native if spawner else {**startup_env(env), "HOME": ZYGOTE_HOME, **native}
    registry: dict = _spawners if spawner else _zygotes
    key = (str(script), launcher, tuple(sorted(boot.items())))
    with _lock:
        z = registry.get(key)
        if z is not None and z.alive():
            if not spawner:
                _zygotes.move_to_end(key)
            return z
        if _failed_until.get(key, 0) > time.monotonic():
            return None
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:
        with _lock:
            z = registry.get(key)
            if z is not None and z.alive():
                return z
        if z is not None:
            log.warning("warm start: %s %s for %s died; restarting it", script.name, z.pid, launcher)
            z.stop()
        z = Zygote(launcher, boot, script)
        try:
            z.start()
        except (OSError, ZygoteUnavailable) as exc:
            log.warning("%s unavailable for %s: %s (hooks spawn from the worker)", script.name, launcher, exc)
            with _lock:
                _failed_until[key] = time.monotonic() + RETRY_AFTER_FAILURE_SECS
                registry.pop(key, None)
            return None
        evicted = []
        with _lock:
            registry[key] = z
            if not spawner:
                _zygotes.move_to_end(key)
                while len(_zygotes) > MAX_ZYGOTES:
                    evicted.append(_zygotes.popitem(last=False)[1])
    for old in evicted:
        old.retire()
    return z


def spawner_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Cold hooks are exec'd by the spawner unless LIBREFANG_SPAWNER=0 (then the worker forks them itself)."""
    value = (os.environ if environ is None else environ).get("LIBREFANG_SPAWNER", "1").strip().lower()
    return value not in ("0", "false", "no", "off") and sys.platform.startswith("linux") and bool(sys.executable)


def ensure(launcher: str, env: Mapping[str, str]) -> bool:
    """Start the zygote for `launcher` with the start-up part of `env` now (prewarm), and the cold-hook spawner,
    so that the next call pays for neither (each keeps a spare child in a cgroup of its own). True when the zygote
    is running."""
    if spawner_enabled():
        _get(sys.executable, {}, SPAWNER_SCRIPT)
    return _get(launcher, env) is not None


def spawn(argv: Sequence[str], sandbox: Any, stdin: bytes = b"") -> WarmProcess | None:
    """Fork the hook `argv = [python, script]` from its zygote, inside `sandbox` (a SandboxSpec); None
    means: spawn it normally instead. What of `stdin` is already in its pipe: `WarmProcess.stdin_written`."""
    z = _get(argv[0], sandbox.env)
    if z is None:
        return None
    proc = z.fork(argv[1], sandbox, stdin=stdin)
    if proc is None and not z.alive():
        z.stop()
    return proc


def spawn_exec(argv: Sequence[str], sandbox: Any, stdin: bytes = b"") -> WarmProcess | None:
    """Exec `argv` (argv[0] an absolute path) from the spawner, inside `sandbox`; None means: the spawner is
    unavailable, spawn it from the worker. Raises OSError when the exec itself failed."""
    if not spawner_enabled():
        return None
    z = _get(sys.executable, {}, SPAWNER_SCRIPT)
    if z is None:
        return None
    proc = z.fork("", sandbox, argv, stdin=stdin)
    if proc is None and not z.alive():
        z.stop()
    return proc


def zygote_pids() -> list[int]:
    """The python zygotes (not the spawner)."""
    with _lock:
        return [z.pid for z in _zygotes.values() if z.alive() and z.pid]


def helper_pids() -> list[int]:
    """Every process this module started to fork hooks from: zygotes and the spawner (their CPU is the hooks')."""
    with _lock:
        return [z.pid for z in [*_zygotes.values(), *_spawners.values()] if z.alive() and z.pid]


def shutdown() -> None:
    """Stop every zygote and the spawner (worker exit, tests)."""
    with _lock:
        zs = [*_zygotes.values(), *_spawners.values()]
        _zygotes.clear()
        _spawners.clear()
        _failed_until.clear()
    for z in zs:
        z.stop()


atexit.register(shutdown)
