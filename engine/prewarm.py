"""Prewarm: start the warm-start zygote(s) a plugin's python hooks will be forked from, before their first call.

A hook call is resolved here exactly as a real call resolves it (engine/invoke.py `hook_call_for`, engine/process/runner.py
`build_env` and `hook_argv`), so the zygote started is the one the call will find: same interpreter,
same start-up environment (engine/process/warmstart.py `startup_env`). Only what warmstart.ensure() confirms is reported as
warmed; every other hook says why nothing was warmed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.home import Home
from engine.invoke import hook_call_for
from engine.plugins.catalog import CatalogEntry
from engine.plugins.permissions import PermissionPolicy
from engine.process import warmstart
from engine.process.runner import build_env, hook_argv, locate_script
from engine.process.runtimes import LauncherNotFound
from engine.protocol import Failure

Ensure = Callable[[str, Mapping[str, str]], bool]


def warm_plugin(entry: CatalogEntry, home: Home, ensure: Ensure = warmstart.ensure,
                policy: PermissionPolicy | None = None) -> dict[str, Any]:
    """{"plugin", "runtime", "warmed": [hook...], "skipped": {hook: why}, "failed": {hook: why}, "zygotes": n}.
    `zygotes` counts distinct (interpreter, start-up environment) pairs confirmed running. `policy`: the engine's
    (what the plugin's calls are granted decides their environment, hence their zygote)."""
    out: dict[str, Any] = {"plugin": entry.name, "runtime": "", "warmed": [], "skipped": {}, "failed": {},
                           "zygotes": 0}
    plugin = entry.plugin
    if plugin is None:
        out["failed"]["*"] = "; ".join(f.message for f in entry.problems) or "plugin cannot be loaded"
        return out
    out["runtime"] = plugin.manifest.runtime.label
    started: dict[tuple, bool] = {}
    for hook in plugin.manifest.hooks.declared_hooks():
        call = hook_call_for(entry, hook, {}, home, policy=policy)
        if isinstance(call, Failure):
            out["failed"][hook] = f"{call.kind}: {call.message}"
            continue
        why_not = _not_warmable(call)
        if why_not:
            out["skipped"][hook] = why_not
            continue
        script = locate_script(call)
        if isinstance(script, Failure):
            out["failed"][hook] = f"{script.kind}: {script.message}"
            continue
        try:
            argv = hook_argv(call, script)
        except LauncherNotFound as exc:
            out["failed"][hook] = f"launcher_not_found: {exc}"
            continue
        if not warmstart.applies(call, argv):
            out["skipped"][hook] = f"runs as {argv[0]!r}, which is not forked from a zygote"
            continue
        env = build_env(call)
        key = (argv[0], tuple(sorted(warmstart.startup_env(env).items())))
        if key not in started:
            started[key] = ensure(argv[0], env)
        if started[key]:
            out["warmed"].append(hook)
        else:
            out["failed"][hook] = f"the zygote for {argv[0]} did not start (hooks spawn normally)"
    out["zygotes"] = sum(1 for ok in started.values() if ok)
    return out


def _not_warmable(call: Any) -> str:
    if call.runtime.runtime.tag != "python":
        return f"runtime {call.runtime.label!r} starts a fresh process per call: nothing to warm"
    if call.runtime.custom_launcher:
        return "custom launcher: spawned per call, nothing to warm"
    if not call.warm_start:
        return "[hooks] warm_start = false"
    if not warmstart.globally_enabled():
        return "warm start is off on this worker (LIBREFANG_WARM_START=0)"
    return warmstart.why_cold(call)
