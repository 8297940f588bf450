"""One call of a module: a fresh Store and instance, limited in time (epoch deadline, optional fuel), memory and
output; every violation is a classified WasmError. Also what a module says about itself (describe) and the checks
a call would fail before running any module code (static_check)."""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wasmtime

from engine import protocol as P
from engine.wasm.abi import (
    ABI_ERROR,
    FUEL_EXHAUSTED,
    I64,
    MEMORY_LIMIT,
    NO_FUEL_LIMIT,
    OUTPUT_CAP_BYTES,
    PAGE,
    TABLE_ELEMENTS_LIMIT,
    TICK_SECS,
    TRAP,
    WasmError,
    first_line,
    signature_matches,
    unpack,
)
from engine.wasm.compile_cache import CompiledModule, get_engine, load_module, ticker
from engine.wasm.host import CallContext, check_imports, current, linker, log
from engine.wasm.policy import WasmPolicy


@dataclass
class Execution:
    output: bytes
    logs: list[str]
    elapsed_ms: float
    sha256: str
    cache: str
    warnings: list[str]


def execute(wasm_path: Path, input_bytes: bytes, *, policy: WasmPolicy, capabilities: Iterable[str] = (),
            timeout_secs: float = 30.0, env: Any = None, read_root: Path | None = None,
            memory_limit_mb: int | None = None, on_log: Callable[[str], None] | None = None,
            wasi_dir: Path | None = None) -> Execution:
    """Run az_tool_execute once on a fresh instance; the raw output bytes. Raises WasmError (classified)."""
    started = time.monotonic()
    compiled = load_module(wasm_path, policy)
    names, wasi = check_imports(compiled, capabilities, policy)
    if compiled.abi_problem:
        raise WasmError(ABI_ERROR, compiled.abi_problem)
    limit_mb = min(policy.memory_limit_mb, memory_limit_mb or policy.memory_limit_mb)
    limit = limit_mb * 1024 * 1024
    if compiled.min_memory_bytes > limit:
        raise WasmError(MEMORY_LIMIT, f"module needs {compiled.min_memory_bytes} bytes of initial memory, over the "
                                      f"{limit_mb} MiB limit")
    ctx = CallContext(env=env or {}, read_root=read_root if "az_read_file" in names else None, policy=policy,
                      deadline=started + timeout_secs, on_log=on_log)
    for warning in compiled.warnings:
        log(ctx, f"[WARN] {warning}")
    store = wasmtime.Store(get_engine())
    store.set_limits(memory_size=limit, table_elements=TABLE_ELEMENTS_LIMIT, instances=4, tables=8, memories=2)
    store.set_fuel(policy.fuel_limit or NO_FUEL_LIMIT)
    store.set_epoch_deadline(max(1, math.ceil(timeout_secs / TICK_SECS)) + 1)
    stderr_path = None
    if wasi:
        stderr_path = _stderr_file()
        store.set_wasi(_wasi_config(wasi_dir, policy, stderr_path))
    current.ctx = ctx
    try:
        with ticker:
            output = _run(store, compiled, names, wasi, input_bytes, limit, ctx, policy, timeout_secs)
    finally:
        current.ctx = None
        if stderr_path is not None:
            _drain_stderr(stderr_path, ctx)
    return Execution(output, ctx.logs, (time.monotonic() - started) * 1000, compiled.sha256, compiled.cache,
                     compiled.warnings)


def _wasi_config(wasi_dir: Path | None, policy: WasmPolicy, stderr_path: str | None) -> wasmtime.WasiConfig:
    """WASI preview1 for guests that import it: no args, no env, no stdin; stderr to a file we read after the call
    (no Python callbacks from wasmtime's I/O threads); the workspace pre-opened at "." only when the policy allows."""
    cfg = wasmtime.WasiConfig()
    if stderr_path is not None:
        cfg.stderr_file = stderr_path
    if wasi_dir is not None and (policy.allow_workspace_read or policy.allow_workspace_write) and wasi_dir.is_dir():
        cfg.preopen_dir(str(wasi_dir), ".", policy.allow_workspace_write)
    return cfg


def _stderr_file() -> str:
    fd, path = tempfile.mkstemp(prefix="lf-wasm-stderr-")
    os.close(fd)
    return path


def _drain_stderr(path: str, ctx: CallContext) -> None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(OUTPUT_CAP_BYTES)
    except OSError:
        data = b""
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    for line in data.split(b"\n"):
        text = line.decode("utf-8", errors="replace").rstrip("\r")
        if text.strip():
            log(ctx, text)


def _run(store: wasmtime.Store, compiled: CompiledModule, names: frozenset, wasi: bool, input_bytes: bytes,
         limit: int, ctx: CallContext, policy: WasmPolicy, timeout_secs: float) -> bytes:
    pre_key = frozenset(names | ({"<wasi>"} if wasi else set()))
    pre = compiled.instance_pres.get(pre_key)
    try:
        if pre is None:
            pre = linker(names, wasi).instantiate_pre(compiled.module)
            compiled.instance_pres[pre_key] = pre
        instance = pre.instantiate(store)
    except wasmtime.Trap as exc:
        raise _classify_trap(exc, store, None, limit, policy, timeout_secs, "start function") from exc
    except wasmtime.WasmtimeError as exc:
        text = str(exc)
        if ("memory" in text or "table" in text) and ("limit" in text or "minimum" in text or "resource" in text):
            raise WasmError(MEMORY_LIMIT, f"failed to instantiate module: {first_line(exc)}") from exc
        raise WasmError(ABI_ERROR, f"failed to instantiate module: {first_line(exc)}") from exc
    exports = instance.exports(store)
    memory, alloc, entry = exports["memory"], exports["az_alloc"], exports["az_tool_execute"]
    try:
        ptr = alloc(store, len(input_bytes))
    except wasmtime.Trap as exc:
        raise _classify_trap(exc, store, memory, limit, policy, timeout_secs, "az_alloc") from exc
    size = memory.data_len(store)
    if ptr < 0 or ptr + len(input_bytes) > size:
        raise WasmError(ABI_ERROR, f"az_alloc returned ptr {ptr} but memory size is {size} "
                                   f"(need {ptr + len(input_bytes)})")
    memory.write(store, input_bytes, ptr)
    try:
        packed = entry(store, ptr, len(input_bytes))
    except wasmtime.Trap as exc:
        raise _classify_trap(exc, store, memory, limit, policy, timeout_secs, "az_tool_execute") from exc
    except wasmtime.ExitTrap as exc:
        raise WasmError(TRAP, f"module called proc_exit({exc.code}) instead of returning its output") from exc
    except wasmtime.WasmtimeError as exc:
        raise WasmError(TRAP, f"az_tool_execute failed: {_trap_text(exc)}") from exc
    out_ptr, out_len = unpack(packed)
    if out_len == 0:
        return b""
    size = memory.data_len(store)
    if out_ptr + out_len > size:
        raise WasmError(P.INVALID_OUTPUT, f"plugin output ptr/len ({out_ptr}, {out_len}) exceeds memory bounds "
                                          f"({size})")
    if out_len > OUTPUT_CAP_BYTES:
        raise WasmError(P.OUTPUT_OVERFLOW, f"plugin output is {out_len} bytes, over the {OUTPUT_CAP_BYTES} cap")
    return bytes(memory.read(store, out_ptr, out_ptr + out_len))


def _classify_trap(exc: wasmtime.Trap, store: wasmtime.Store, memory: wasmtime.Memory | None, limit: int,
                   policy: WasmPolicy, timeout_secs: float, where: str) -> WasmError:
    code = exc.trap_code
    if code == wasmtime.TrapCode.INTERRUPT:
        return WasmError(P.TIMEOUT, f"plugin execution exceeded time limit ({timeout_secs * 1000:g} ms)")
    if code == wasmtime.TrapCode.OUT_OF_FUEL:
        return WasmError(FUEL_EXHAUSTED, f"plugin execution exceeded its fuel budget ({policy.fuel_limit} units)")
    message = _trap_text(exc)
    if memory is not None:
        try:
            if memory.data_len(store) + PAGE > limit:
                return WasmError(MEMORY_LIMIT, f"{where} trapped at the memory limit ({limit // (1024 * 1024)} "
                                               f"MiB; memory.grow was refused): {message}")
        except wasmtime.WasmtimeError:
            pass
    return WasmError(TRAP, f"{where} call failed: {message}")


def _trap_text(exc: BaseException) -> str:
    """The cause line of a wasmtime trap ("wasm trap: wasm `unreachable` instruction executed"), else line 1."""
    text = str(getattr(exc, "message", "") or exc)
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return type(exc).__name__


def decode_output(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WasmError(P.INVALID_OUTPUT, f"plugin output is not valid UTF-8: {exc}") from exc


_describe_cache: dict[str, dict[str, Any]] = {}


def describe(wasm_path: Path, policy: WasmPolicy, capabilities: Iterable[str] = (),
             timeout_secs: float = 1.0) -> dict[str, Any]:
    """What a module says about itself: `az_tool_name` and `az_tool_schema` when exported (None otherwise).

    Raises WasmError when the module cannot be loaded or linked. Cached per module sha256.
    """
    compiled = load_module(wasm_path, policy)
    cached = _describe_cache.get(compiled.sha256)
    if cached is not None:
        return cached
    names, wasi = check_imports(compiled, capabilities, policy)
    info: dict[str, Any] = {"name": None, "schema": None, "sha256": compiled.sha256,
                            "imports": [f"{i.module}::{i.name}" for i in compiled.module.imports]}
    store = wasmtime.Store(get_engine())
    store.set_limits(memory_size=policy.memory_limit_mb * 1024 * 1024, table_elements=TABLE_ELEMENTS_LIMIT, instances=4,
                     tables=8, memories=2)
    store.set_fuel(policy.fuel_limit or NO_FUEL_LIMIT)
    store.set_epoch_deadline(max(1, math.ceil(timeout_secs / TICK_SECS)) + 1)
    ctx = CallContext(env={}, read_root=None, policy=policy, deadline=time.monotonic() + timeout_secs)
    if wasi:
        store.set_wasi(_wasi_config(None, policy, None))
    current.ctx = ctx
    try:
        with ticker:
            instance = linker(names, wasi).instantiate(store, compiled.module)
            exports = instance.exports(store)
            memory = exports.get("memory")
            for export, key in (("az_tool_name", "name"), ("az_tool_schema", "schema")):
                fn = exports.get(export)
                if not isinstance(fn, wasmtime.Func) or not isinstance(memory, wasmtime.Memory) \
                        or not signature_matches(fn.type(store), [], [I64]):
                    continue
                ptr, length = unpack(fn(store))
                if not length or ptr + length > memory.data_len(store) or length > OUTPUT_CAP_BYTES:
                    continue
                text = bytes(memory.read(store, ptr, ptr + length)).decode("utf-8", errors="replace")
                if key == "schema":
                    try:
                        info[key] = json.loads(text)
                    except ValueError:
                        info[key] = None
                else:
                    info[key] = text
    except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
        raise WasmError(ABI_ERROR, f"cannot read the module's name/schema: {_trap_text(exc)}") from exc
    finally:
        current.ctx = None
    _describe_cache[compiled.sha256] = info
    return info


def static_check(path: Path, capabilities: Iterable[str], policy: WasmPolicy) -> None:
    """Raise the WasmError a call would fail with before running any module code (load, imports, ABI, memory)."""
    compiled = load_module(path, policy)
    check_imports(compiled, capabilities, policy)
    if compiled.abi_problem:
        raise WasmError(ABI_ERROR, compiled.abi_problem)
    limit = policy.memory_limit_mb * 1024 * 1024
    if compiled.min_memory_bytes > limit:
        raise WasmError(MEMORY_LIMIT, f"module needs {compiled.min_memory_bytes} bytes of initial memory, over the "
                                      f"{policy.memory_limit_mb} MiB limit")
