"""Invoke one plugin's hook once (with its retries) and record what happened."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import protocol as P
from engine.home import Home
from engine.hook_schemas import validate as validate_schema
from engine.hooks import retry_delay_ms
from engine.overrides import Overrides
from engine.plugins.catalog import CatalogEntry
from engine.plugins.manifest import env_reference
from engine.plugins.permissions import BASELINE_MEMORY_MB, BASELINE_PROCESSES, PermissionPolicy, service_own
from engine.ports import Invocation, InvocationSink, StderrSink
from engine.process import hook_dirs, identity
from engine.process.hook_call import HookCall, HookResult, Runtime
from engine.process.runner import PROCESS
from engine.protocol import Failure
from engine.wasm.hooks import WASM

# stderr lines go to these loggers as they arrive (LibreFang's `plugin_stderr` target; python hooks' own name).
STDERR_LOGGERS = {False: logging.getLogger("plugin_stderr"), True: logging.getLogger("python_stderr")}
PREVIEW_BYTES = 2048
STDERR_TAIL_BYTES = 4096


def new_trace_id() -> str:
    return secrets.token_hex(8)


def expand_env(env: dict[str, str], allowed: frozenset[str] | set[str],
               parent: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """`[env]` values that are exactly `${VAR}` come from the service environment when VAR is one the call may read
    (engine/plugins/permissions.py Grant.env_vars: approved, allowlisted by the operator, not the service's own);
    any other reference becomes "" (the Grant's warnings say why), an unset one too (warned)."""
    parent = os.environ if parent is None else parent
    out, warnings = {}, []
    for key, value in env.items():
        var = env_reference(value)
        if var is None:
            out[key] = value
        elif var not in allowed:
            out[key] = ""
        else:
            if var not in parent:
                warnings.append(f"[env] {key} = ${{{var}}}: {var} is not set in the service environment; passing ''")
            out[key] = parent.get(var, "")
    return out, warnings


def preview(value: Any, limit: int = PREVIEW_BYTES) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore") + "…"


@dataclass(frozen=True)
class Verdict:
    """What a caller makes of a successful reply before it is recorded (a `Judge`): what it takes from it (`result`;
    None: nothing usable), why the attempt counts as failed for it (`failure`, e.g. assemble with no usable
    messages, as LibreFang counts it; None: it does not), and warnings for the trace (e.g. pinned messages
    restored)."""

    result: Any = None
    failure: str | None = None
    warnings: tuple[str, ...] = ()


Judge = Callable[[Any], Verdict]


@dataclass
class Attempt:
    """One plugin's hook as it ended (its last try), and, when a judge looked at its reply, the verdict."""

    plugin: str
    hook: str
    result: HookResult
    trace_id: str
    warnings: list[str] = field(default_factory=list)
    cached: bool = False
    verdict: Verdict | None = None

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
                  allowed_env_vars: tuple[str, ...] = (), overrides: Overrides | None = None,
                  warnings: list[str] | None = None, policy: PermissionPolicy | None = None) -> HookCall | Failure:
    """The HookCall of one attempt. What it may reach and spend comes from `policy` (engine/plugins/permissions.py:
    the owner's approvals, the operator's ceilings and variables), never from the manifest alone; without one,
    nothing is approved and the default ceilings apply. `allowed_env_vars` are the operator's own
    (`[context_engine] allowed_env_vars`): handed over unless they are the service's own."""
    plugin = entry.plugin
    if plugin is None:
        problems = "; ".join(f.message for f in entry.problems) or "plugin cannot be loaded"
        kind = P.INTEGRITY_FAILED if any(f.id.startswith("integrity") for f in entry.problems) else P.MANIFEST_INVALID
        return Failure(kind, problems)
    settings = plugin.manifest.hooks
    script = settings.script_for(hook)
    if not script:
        return Failure(P.HOOK_NOT_DECLARED, f"plugin {entry.name!r} does not declare the {hook} hook")
    granted = (policy or DEFAULT_POLICY).grant(plugin)
    notes = list(granted.warnings)
    env, env_warnings = expand_env(plugin.manifest.env, granted.env_vars)
    notes += env_warnings
    if overrides is not None and overrides.env:
        env = {**{str(k): str(v) for k, v in overrides.env.items()}, **env}
    allow_network = granted.network
    if overrides is not None and overrides.allow_network is not None:
        # a bootstrap reply may turn the network off, never on beyond what the plugin was granted
        allow_network = overrides.allow_network and granted.network
        if overrides.allow_network and not granted.network:
            notes.append("permissions.network: the bootstrap reply's allow_network = true is ignored: this plugin "
                         "is not granted the network")
    timeout = granted.timeout_for(hook) if timeout is None else min(timeout, granted.timeout_ceiling)
    extra_env = {}
    config_file = write_config_file(plugin, home)
    if config_file:
        extra_env["LIBREFANG_PLUGIN_CONFIG"] = str(config_file)
    for secret in granted.secrets:
        # No credential vault here: the service's own environment holds LIBREFANG_SECRET_<NAME>. Values are never
        # logged; a missing one only warns (LibreFang).
        var = "LIBREFANG_SECRET_" + re.sub(r"[^A-Za-z0-9_]", "_", secret).upper()
        if var in os.environ:
            extra_env[var] = os.environ[var]
        else:
            notes.append(f"allowed_secrets: {var} is not set in the service environment")
    if warnings is not None:
        warnings.extend(notes)
    passed = [v for v in allowed_env_vars if not service_own(v)]
    passed += [v for v in settings.allowed_env_vars if v in granted.env_vars]
    return HookCall(
        plugin_dir=entry.dir,
        script=script,
        runtime=plugin.manifest.runtime,
        request=request,
        timeout_secs=timeout,
        plugin_env=env,
        allowed_env_vars=tuple(dict.fromkeys(passed)),
        data_dir=home.data_dir(entry.name),
        max_memory_mb=_explicit(settings.max_memory_mb, granted.max_memory_mb, BASELINE_MEMORY_MB),
        max_cpu_secs=granted.max_cpu_secs,
        extra_env=extra_env,
        allow_network=allow_network,
        allow_filesystem=granted.filesystem,
        venv_dir=venv_dir(home, entry.name),
        warm_start=settings.warm_start,
        max_processes=_explicit(settings.max_processes, granted.max_processes, BASELINE_PROCESSES),
        home_dir=home.root,
        wasm_capabilities=granted.wasm_capabilities,
        max_disk_mb=granted.max_disk_mb,  # the operator's [limits] max_disk_mb (no manifest asks for disk)
    )


# No approvals, the default ceilings: what a call gets when its caller passes no policy.
DEFAULT_POLICY = PermissionPolicy()


def _explicit(asked: int | None, granted: int, baseline: int) -> int | None:
    """None (the runner's default) when the manifest set no value and the grant is that default: an explicit
    max_memory_mb also sets RLIMIT_AS, which runtimes that reserve address space (go, node) do not survive."""
    return None if asked is None and granted == baseline else granted


def venv_dir(home: Home, name: str):
    """The plugin's own virtualenv (made by engine.requirements), if it has one."""
    path = home.data_dir(name) / "venv"
    return path if (path / "bin" / "python").exists() else None


def runtime_for(call: HookCall) -> Runtime:
    """The runtime that runs `call`: wasm modules in the worker (engine/wasm/hooks.py); every other hook in its own
    process (engine/process/runner.py: forked from a warm zygote when it is a python hook that can be)."""
    return WASM if call.runtime.runtime.is_wasm else PROCESS


def write_config_file(plugin: Any, home: Home):
    """`[config]` defaults written to a JSON file named by LIBREFANG_PLUGIN_CONFIG (only rewritten when changed). The
    data directory is the hook's to write: read and written without following its links (engine/process/hook_dirs.py)."""
    if not plugin.manifest.config:
        return None
    data = json.dumps({k: f.default for k, f in plugin.manifest.config.items()}, sort_keys=True)
    data_dir = home.data_dir(plugin.name)
    try:
        if hook_dirs.read_private(data_dir, "plugin_config.json") != data:
            data_dir.mkdir(parents=True, exist_ok=True)
            hook_dirs.write_private(data_dir, "plugin_config.json", data, identity.plugin_ids(home.root, plugin.name))
    except (OSError, ValueError):
        return None
    return data_dir / "plugin_config.json"


_state_locks: dict[str, threading.Lock] = {}
_state_locks_guard = threading.Lock()


def shared_state_file(home: Home, plugin: str, agent_id: str) -> Path:
    """`enable_shared_state`: one JSON file per plugin and agent, created as {} (LIBREFANG_STATE_FILE)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", agent_id or "_")[:128].strip(".") or "_"
    data_dir = home.data_dir(plugin)
    data_dir.mkdir(parents=True, exist_ok=True)
    return hook_dirs.write_private(data_dir, f"agents/{safe}/state.json", "{}", identity.plugin_ids(home.root, plugin),
                                   replace=False)


def _state_lock(path: Path) -> threading.Lock:
    with _state_locks_guard:
        return _state_locks.setdefault(str(path), threading.Lock())


# Failures a retry cannot fix.
PERMANENT_FAILURES = frozenset({P.PATH_TRAVERSAL, P.SCRIPT_NOT_FOUND, P.LAUNCHER_NOT_FOUND, P.INVALID_INPUT,
                                P.MANIFEST_INVALID, P.INTEGRITY_FAILED, P.HOOK_NOT_DECLARED, P.INVALID_OUTPUT})


def invoke(entry: CatalogEntry, hook: str, request: dict, *, home: Home, invocations: InvocationSink,
           stderr: StderrSink, agent_id: str = "", job_id: str | None = None, timeout: float | None = None,
           allowed_env_vars: tuple[str, ...] = (), retries: int | None = None, overrides: Overrides | None = None,
           judge: Judge | None = None, sleep: Callable[[float], None] = time.sleep,
           policy: PermissionPolicy | None = None) -> Attempt:
    """Run `hook` of one plugin, with its `max_retries`, recording one invocation per try; the Attempt is the last
    try, judged. `policy`: what the call may reach and spend (hook_call_for). `judge` looks at each successful reply
    before it is recorded (Verdict): it may turn it into a failure and add warnings to the trace."""
    trace_id = new_trace_id()
    warnings: list[str] = []
    call = hook_call_for(entry, hook, request, home, timeout, allowed_env_vars, overrides, warnings, policy)
    tries = _Tries(entry, hook, request, invocations, stderr, agent_id, job_id, judge)
    if isinstance(call, Failure):
        return tries.recorded(trace_id, time.time(), HookResult(False, failure=call), warnings)
    settings = entry.plugin.manifest.hooks  # type: ignore[union-attr]
    guard: Any = contextlib.nullcontext()
    if settings.enable_shared_state:
        state = shared_state_file(home, entry.name, agent_id)
        call.extra_env = {**call.extra_env, "LIBREFANG_STATE_FILE": str(state)}
        guard = _state_lock(state)  # calls sharing a state file are serialised (in this process, like LibreFang)
    hook_schema = settings.hook_schemas.get(hook) if isinstance(settings.hook_schemas, dict) else None
    hook_schema = hook_schema if isinstance(hook_schema, dict) else {}
    if hook_schema.get("input"):
        warnings += [f"input schema: {v}" for v in validate_schema(request, hook_schema["input"])]
    runtime = runtime_for(call)
    attempt = Attempt(entry.name, hook, HookResult(False), trace_id, list(warnings))
    with guard:
        for n in range(1 + (settings.max_retries if retries is None else retries)):
            if n:
                sleep(retry_delay_ms(settings.retry_delay_ms, n) / 1000)
                trace_id = new_trace_id()
            attempt = tries.once(runtime, call, trace_id, warnings, hook_schema.get("output"),
                                 settings.output_schema_strict)
            if attempt.ok or (attempt.failure and attempt.failure.kind in PERMANENT_FAILURES):
                break
    return attempt


@dataclass
class _Tries:
    """The tries of one plugin's hook for one request: each run, checked (the output schema, the caller's judge),
    and recorded as an invocation."""

    entry: CatalogEntry
    hook: str
    request: dict
    invocations: InvocationSink
    stderr: StderrSink
    agent_id: str
    job_id: str | None
    judge: Judge | None

    def once(self, runtime: Runtime, call: HookCall, trace_id: str, warnings: list[str], output_schema: Any,
             strict: bool) -> Attempt:
        started = time.time()
        python = call.runtime.runtime.tag == "python" and not call.runtime.custom_launcher
        stderr_log = STDERR_LOGGERS[python]
        where = {"plugin": self.entry.name, "hook": self.hook, "trace_id": trace_id}

        def on_line(line: str) -> None:
            stderr_log.info("%s", line, extra=where)
            self.stderr.line(self.entry.name, self.hook, line, trace_id)

        result = runtime.run(call, on_line)
        if result.stderr.strip():
            stderr_log.debug("hook stderr (%s/%s, %d bytes): %s", self.entry.name, self.hook, len(result.stderr),
                             result.stderr[-STDERR_TAIL_BYTES:], extra=where)
        tried_warnings = list(warnings) + result.warnings  # e.g. sandbox.degraded (engine/process/runner.py)
        if result.ok and output_schema:
            violations = validate_schema(result.reply, output_schema)
            if violations and strict:
                result.ok = False
                result.failure = Failure(P.INVALID_OUTPUT, "output schema: " + "; ".join(violations[:5]))
            else:
                tried_warnings += [f"output schema: {v}" for v in violations]
        verdict = None
        if result.ok and self.judge is not None:
            verdict = self.judge(result.reply)
            tried_warnings += verdict.warnings
            if verdict.failure:
                result.ok = False
                result.failure = Failure(P.INVALID_OUTPUT, verdict.failure)
        return self.recorded(trace_id, started, result, tried_warnings, verdict)

    def recorded(self, trace_id: str, started: float, result: HookResult, warnings: list[str],
                 verdict: Verdict | None = None) -> Attempt:
        annotations: dict[str, Any] = {}
        if result.ok and isinstance(result.reply, dict) and result.reply.get("annotations") is not None:
            annotations["plugin"] = result.reply["annotations"]  # after_turn replies may carry annotations
        if warnings:
            annotations["warnings"] = list(warnings)
        try:
            self.invocations.record(Invocation(
                trace_id=trace_id, plugin=self.entry.name, hook=self.hook, agent_id=self.agent_id,
                started_at=started, elapsed_ms=result.elapsed_ms, ok=result.ok,
                error_kind=result.failure.kind if result.failure else None,
                error=result.failure.message if result.failure else None, input_preview=preview(self.request),
                output_preview=preview(result.reply) if result.ok else preview(result.stdout),
                stderr_tail=result.stderr[-STDERR_TAIL_BYTES:], job_id=self.job_id, annotations=annotations or None,
            ))
        except Exception:  # recording must never break a call
            pass
        return Attempt(self.entry.name, self.hook, result, trace_id, warnings, verdict=verdict)
