"""Invoke one plugin's hook once (with its retries) and record what happened."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

from engine import protocol as P
from engine.catalog import CatalogEntry
from engine.home import Home
from engine.ports import Invocation, InvocationSink, StderrSink
from engine.protocol import Failure
from engine.runner import HookCall, HookResult, run_hook

PREVIEW_BYTES = 2048
STDERR_TAIL_BYTES = 4096


def new_trace_id() -> str:
    return secrets.token_hex(8)


def expand_env(env: dict[str, str], parent: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """`[env]` values that are exactly `${VAR}` come from the service environment; unset ones become "" (warned)."""
    parent = os.environ if parent is None else parent
    out, warnings = {}, []
    for key, value in env.items():
        if value.startswith("${") and value.endswith("}") and value.count("${") == 1:
            var = value[2:-1]
            if var not in parent:
                warnings.append(f"[env] {key} = ${{{var}}}: {var} is not set in the service environment; passing ''")
            out[key] = parent.get(var, "")
        else:
            out[key] = value
    return out, warnings


def preview(value: Any, limit: int = PREVIEW_BYTES) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore") + "…"


@dataclass
class Attempt:
    plugin: str
    hook: str
    result: HookResult
    trace_id: str

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def reply(self) -> Any:
        return self.result.reply

    @property
    def failure(self) -> Failure | None:
        return self.result.failure


def hook_call_for(entry: CatalogEntry, hook: str, request: dict, home: Home, timeout: float | None = None,
                  allowed_env_vars: tuple[str, ...] = ()) -> HookCall | Failure:
    plugin = entry.plugin
    if plugin is None:
        problems = "; ".join(f.message for f in entry.problems) or "plugin cannot be loaded"
        kind = P.INTEGRITY_FAILED if any(f.id.startswith("integrity") for f in entry.problems) else P.MANIFEST_INVALID
        return Failure(kind, problems)
    settings = plugin.manifest.hooks
    script = settings.script_for(hook)
    if not script:
        return Failure(P.HOOK_NOT_DECLARED, f"plugin {entry.name!r} does not declare the {hook} hook")
    env, _warnings = expand_env(plugin.manifest.env)
    if timeout is None:
        timeout = settings.hook_timeout_secs * (2 if hook == "bootstrap" else 1)
    extra_env = {}
    config_file = write_config_file(plugin, home)
    if config_file:
        extra_env["LIBREFANG_PLUGIN_CONFIG"] = str(config_file)
    return HookCall(
        plugin_dir=entry.dir,
        script=script,
        runtime=plugin.manifest.runtime,
        request=request,
        timeout_secs=timeout,
        plugin_env=env,
        allowed_env_vars=tuple(allowed_env_vars) + tuple(settings.allowed_env_vars),
        data_dir=home.data_dir(entry.name),
        max_memory_mb=settings.max_memory_mb,
        max_cpu_secs=settings.max_cpu_secs,
        extra_env=extra_env,
    )


def write_config_file(plugin: Any, home: Home):
    """`[config]` defaults written to a JSON file named by LIBREFANG_PLUGIN_CONFIG (only rewritten when changed)."""
    if not plugin.manifest.config:
        return None
    data = json.dumps({k: f.default for k, f in plugin.manifest.config.items()}, sort_keys=True)
    path = home.data_dir(plugin.name) / "plugin_config.json"
    try:
        if not path.exists() or path.read_text() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(data)
            tmp.replace(path)
    except OSError:
        return None
    return path


def invoke(entry: CatalogEntry, hook: str, request: dict, *, home: Home, invocations: InvocationSink,
           stderr: StderrSink, agent_id: str = "", job_id: str | None = None, timeout: float | None = None,
           allowed_env_vars: tuple[str, ...] = (), retries: int | None = None) -> Attempt:
    """Run `hook` of one plugin, with its `max_retries`, recording one invocation per attempt."""
    trace_id = new_trace_id()
    call = hook_call_for(entry, hook, request, home, timeout, allowed_env_vars)
    started_wall = time.time()
    if isinstance(call, Failure):
        result = HookResult(False, failure=call)
        _record(invocations, trace_id, entry.name, hook, agent_id, started_wall, result, request, job_id)
        return Attempt(entry.name, hook, result, trace_id)
    settings = entry.plugin.manifest.hooks  # type: ignore[union-attr]
    attempts = 1 + (settings.max_retries if retries is None else retries)
    result = HookResult(False)
    for n in range(attempts):
        if n:
            time.sleep(min(settings.retry_delay_ms * (2 ** (n - 1)), 30_000) / 1000)
            trace_id = new_trace_id()
            started_wall = time.time()
        tid = trace_id
        result = run_hook(call, on_stderr=lambda line, tid=tid: stderr.line(entry.name, hook, line, tid))
        _record(invocations, trace_id, entry.name, hook, agent_id, started_wall, result, request, job_id)
        if result.ok or (result.failure and result.failure.kind in (P.PATH_TRAVERSAL, P.SCRIPT_NOT_FOUND,
                                                                    P.LAUNCHER_NOT_FOUND)):
            break
    return Attempt(entry.name, hook, result, trace_id)


def _record(sink: InvocationSink, trace_id: str, plugin: str, hook: str, agent_id: str, started: float,
            result: HookResult, request: Any, job_id: str | None) -> None:
    try:
        sink.record(Invocation(
            trace_id=trace_id, plugin=plugin, hook=hook, agent_id=agent_id, started_at=started,
            elapsed_ms=result.elapsed_ms, ok=result.ok,
            error_kind=result.failure.kind if result.failure else None,
            error=result.failure.message if result.failure else None,
            input_preview=preview(request), output_preview=preview(result.reply) if result.ok else preview(result.stdout),
            stderr_tail=result.stderr[-STDERR_TAIL_BYTES:], job_id=job_id,
        ))
    except Exception:  # recording must never break a call
        pass
