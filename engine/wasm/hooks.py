"""`runtime = "wasm"` hooks: the hook request JSON is the ABI input, the module's output is read with the same rules
as a subprocess hook's stdout, `az_log` lines go to the same live stderr stream. Plus lint/doctor's checks of a wasm
plugin's modules (they compile, never run module code)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from engine import findings as F
from engine import protocol as P
from engine.home import Home
from engine.plugins.loader import read_manifest
from engine.process import data_disks
from engine.process.hook_call import HookCall, HookResult, StderrCallback
from engine.process.runner import DEFAULT_MAX_DISK_MB, build_env, locate_script, resolve_script
from engine.protocol import Failure
from engine.wasm import abi
from engine.wasm.execution import decode_output, execute, static_check
from engine.wasm.policy import WasmPolicy, narrowed, policy_for


def config_path_of(call: HookCall) -> Path:
    """The service's config.toml for a hook call: at the root of the call's $LIBREFANG_HOME."""
    return (Home(Path(call.home_dir)) if call.home_dir is not None else Home.from_env()).config_path


def capabilities_of(call: HookCall) -> tuple[str, ...]:
    """The plugin's `[wasm] capabilities`, from its manifest (parsed once per change, engine/plugins/loader.py)."""
    manifest = read_manifest(Path(call.plugin_dir))
    return manifest.wasm_capabilities if manifest is not None else ()


_made_dirs: set[str] = set()


class WasmRuntime:
    """The `Runtime` (engine/process/hook_call.py) of `runtime = "wasm"` hooks: in the worker, under wasmtime."""

    name = "wasm"

    def run(self, call: HookCall, on_stderr: StderrCallback | None = None) -> HookResult:
        return run_wasm_hook(call, on_stderr)


WASM = WasmRuntime()


def run_wasm_hook(call: HookCall, on_stderr: StderrCallback | None = None,
                  policy: WasmPolicy | None = None, capabilities: tuple[str, ...] | None = None) -> HookResult:
    """Run one `runtime = "wasm"` hook; its HookResult, never raises.

    `policy` defaults to the one in the call's config.toml, `capabilities` to the call's `wasm_capabilities` (set by
    engine/invoke.py), else to the plugin manifest's."""
    started = time.monotonic()
    logs: list[str] = []

    def fail(kind: str, message: str) -> HookResult:
        return HookResult(False, failure=Failure(kind, message), stderr="\n".join(logs),
                          elapsed_ms=(time.monotonic() - started) * 1000)

    script = locate_script(call)
    if isinstance(script, Failure):
        return fail(script.kind, script.message)
    if policy is None:
        policy = policy_for(config_path_of(call))
    if capabilities is None:
        capabilities = getattr(call, "wasm_capabilities", None)
    if capabilities is None:
        capabilities = capabilities_of(call)
    policy = narrowed(policy, network=getattr(call, "allow_network", True) is not False,
                      filesystem=getattr(call, "allow_filesystem", True) is not False)
    if call.data_dir is not None:
        if str(call.data_dir) not in _made_dirs:
            Path(call.data_dir).mkdir(parents=True, exist_ok=True)
            _made_dirs.add(str(call.data_dir))
        data_disks.ensure(Path(call.data_dir), call.max_disk_mb or DEFAULT_MAX_DISK_MB)  # capped as a process hook's
    payload = json.dumps(call.request, ensure_ascii=False).encode("utf-8")

    def log(line: str) -> None:
        logs.append(line)
        if on_stderr is not None:
            on_stderr(line)

    try:
        run = execute(script, payload, policy=policy, capabilities=capabilities,
                      timeout_secs=call.timeout_secs, env=lambda: build_env(call),
                      read_root=Path(call.data_dir) if call.data_dir is not None else None,
                      memory_limit_mb=call.max_memory_mb, on_log=log, wasi_dir=call.data_dir)
        text = decode_output(run.output)
    except abi.WasmError as exc:
        return fail(exc.kind, exc.message)
    except Exception as exc:  # anything unexpected from wasmtime is still a classified failure, not a crash
        return fail(abi.TRAP, f"wasm runtime error: {type(exc).__name__}: {abi.first_line(exc)}")
    elapsed = (time.monotonic() - started) * 1000
    stderr = "\n".join(logs)
    try:
        reply = P.parse_output(text)
    except P.EmptyOutput:
        return HookResult(False, failure=Failure(P.EMPTY_OUTPUT, "wasm hook returned empty output"), stderr=stderr,
                          stdout=text, elapsed_ms=elapsed, returncode=0)
    return HookResult(True, reply=reply, stderr=stderr, stdout=text, elapsed_ms=elapsed, returncode=0)


_KIND_FINDING = {abi.MODULE_INVALID: "wasm.module_invalid", abi.IMPORT_DENIED: "wasm.import_denied",
                 abi.MODULE_TOO_LARGE: "wasm.module_too_large", P.SCRIPT_NOT_FOUND: "wasm.module_missing",
                 P.PATH_TRAVERSAL: "wasm.module_path", P.IO_ERROR: "wasm.module_unreadable"}
_KIND_HINT = {
    "wasm.import_denied": "Declare the host call in [wasm] capabilities (\"host:<name>\") and allow it in "
                          "config.toml [runtime.wasm] allowed_host_calls, or stop importing it.",
    "wasm.abi": "Export memory, az_alloc(i32)->i32 and az_tool_execute(i32,i32)->i64 (AgentZero ABI v2).",
    "wasm.module_invalid": "Rebuild the module (wat2wasm, cargo build --target wasm32-wasip1).",
    "wasm.memory": "Declare less initial memory or raise [runtime.wasm] memory_limit_mb.",
}


def check_plugin(plugin_dir: Path, hooks: dict[str, str], policy: WasmPolicy,
                 capabilities: tuple[str, ...] = ()) -> list[F.Finding]:
    """Findings for a `runtime = "wasm"` plugin's modules (hook -> path): load, ABI exports, imports vs. its
    `[wasm] capabilities` and the service policy, initial memory vs. the limit. Compiles; runs no module code."""
    out = []
    for hook, script in hooks.items():
        try:
            static_check(resolve_script(plugin_dir, script), capabilities, policy)
        except ValueError as exc:
            out.append(F.error("wasm.module_path", f"{hook}: {exc}", "Keep modules inside the plugin directory."))
        except FileNotFoundError as exc:
            out.append(F.error("wasm.module_missing", f"{hook}: {exc}", "Build the module or fix the path."))
        except abi.WasmError as exc:
            fid = {abi.ABI_ERROR: "wasm.abi", abi.MEMORY_LIMIT: "wasm.memory"}.get(exc.kind) or _KIND_FINDING.get(
                exc.kind, "wasm.invalid")
            out.append(F.error(fid, f"{hook}: {exc.message}", _KIND_HINT.get(fid, "")))
    return out
