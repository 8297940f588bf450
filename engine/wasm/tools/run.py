"""Running a tool once. `module_hash_policy` (config `[runtime.wasm.security]`) is checked every time a tool runs
(AgentZero only checks at install): "warn" = the module's sha256 differs from the manifest's `wasm_sha256`: run it
and report a warning in the reply and the log; "enforce" = refuse to run (`wasm_hash_mismatch`); "skip" = no check."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import protocol as P
from engine.home import Home
from engine.wasm.abi import HASH_MISMATCH, TRAP, WasmError, first_line
from engine.wasm.compile_cache import load_module
from engine.wasm.execution import decode_output
from engine.wasm.execution import execute as run_module
from engine.wasm.policy import WasmPolicy, policy_for
from engine.wasm.tools.installed import get_tool, refresh_if_stale
from engine.wasm.tools.manifest import ToolError


@dataclass
class ToolRun:
    """One execution. `output`/`error` are the agent-facing result (AgentZero's WasmTool mapping)."""

    ok: bool
    output: str
    error: str | None
    kind: str | None = None  # failure kind when not ok
    warnings: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    elapsed_ms: float = 0.0
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "output": self.output, "error": self.error, "kind": self.kind,
                "warnings": self.warnings, "logs": self.logs, "elapsed_ms": round(self.elapsed_ms, 3),
                "version": self.version}


def workspace_for(home: Home, policy: WasmPolicy) -> Path:
    return Path(policy.workspace_root).expanduser() if policy.workspace_root else home.root / "workspace"


def map_output(text: str) -> tuple[bool, str, str | None]:
    """AgentZero's output contract: {"output": str, "error": str|null}; (ok, output, error)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise WasmError(P.INVALID_OUTPUT, f"plugin output is not valid JSON: {exc} (raw: {text[:200]})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("output"), str):
        raise WasmError(P.INVALID_OUTPUT, f"plugin output is not valid JSON: missing field `output` "
                                            f"(raw: {text[:200]})")
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        error = json.dumps(error)
    if error and not data["output"]:
        return False, "", f"plugin error: {error}"
    if error:
        return True, f"{data['output']}\n[plugin warning: {error}]", None
    return True, data["output"], None


def execute(home: Home, tool_id: str, input_text: str, *, policy: WasmPolicy | None = None,
            on_log: Callable[[str], None] | None = None, environ: dict[str, str] | None = None) -> ToolRun:
    """Run a tool once. Unknown/disabled tools raise ToolError; everything the module does is a ToolRun."""
    policy = policy or policy_for(home.config_path)
    tool = get_tool(home, tool_id)
    if not tool.enabled:
        raise ToolError(f"tool {tool_id!r} is disabled", code="tool_disabled", status=409)
    started = time.monotonic()
    logs: list[str] = []
    warnings: list[str] = []

    def log(line: str) -> None:
        logs.append(line)
        if on_log is not None:
            on_log(line)

    def failed(kind: str, message: str) -> ToolRun:
        return ToolRun(False, "", message, kind, warnings, logs, (time.monotonic() - started) * 1000, tool.version)

    if tool.manifest is None or tool.problems:
        return failed(P.MANIFEST_INVALID, "; ".join(tool.problems) or "tool cannot be loaded")
    manifest = tool.manifest
    try:
        compiled = load_module(tool.wasm_path, policy)
        if policy.module_hash_policy != "skip" and compiled.sha256 != manifest.wasm_sha256.lower():
            message = (f"module_hash_policy={policy.module_hash_policy}: sha256 of `{manifest.wasm_file}` is "
                       f"{compiled.sha256}, the manifest says {manifest.wasm_sha256.lower()}")
            if policy.module_hash_policy == "enforce":
                log(f"[ERROR] {message}; refused")
                return failed(HASH_MISMATCH, message + "; refused to run")
            warnings.append(message)
            log(f"[WARN] {message}; running anyway")
        refresh_if_stale(tool, compiled.sha256, policy)
        workspace = workspace_for(home, policy)
        workspace.mkdir(parents=True, exist_ok=True)
        source_env = os.environ if environ is None else environ
        env = {k: source_env[k] for k in policy.allowed_env_vars if k in source_env}
        payload = json.dumps({"input": input_text, "workspace_root": str(workspace)}, ensure_ascii=False)
        run = run_module(tool.wasm_path, payload.encode("utf-8"), policy=policy, capabilities=manifest.capabilities,
                        timeout_secs=policy.max_execution_ms / 1000, env=env, read_root=workspace, on_log=log,
                        wasi_dir=workspace)
        if not run.output:
            return failed(P.EMPTY_OUTPUT, "plugin error: plugin returned empty output")
        ok, output, error = map_output(decode_output(run.output))
    except WasmError as exc:
        return failed(exc.kind, exc.message)
    except Exception as exc:  # never let a module crash the worker
        return failed(TRAP, f"wasm runtime error: {type(exc).__name__}: {first_line(exc)}")
    elapsed = (time.monotonic() - started) * 1000
    return ToolRun(ok, output, error, None if ok else "plugin_error", warnings, logs, elapsed, tool.version)
