"""The wasmtime engine, its epoch ticker, and compiled modules cached in memory and on disk.

On disk: `.cache/<stem>.cwasm` + `<stem>.sha256` next to the module (AgentZero's `plugin.cwasm` + `source.sha256`
when the module is `plugin.wasm`), sealed with a per-installation HMAC so only artefacts this service wrote load.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import wasmtime

from engine import protocol as P
from engine.wasm.abi import (
    I32,
    I64,
    MODULE_INVALID,
    MODULE_TOO_LARGE,
    PAGE,
    TICK_SECS,
    WasmError,
    first_line,
    signature_matches,
)
from engine.wasm.policy import WasmPolicy

_engine: wasmtime.Engine | None = None
_engine_lock = threading.Lock()


def get_engine() -> wasmtime.Engine:
    global _engine
    with _engine_lock:
        if _engine is None:
            cfg = wasmtime.Config()
            cfg.epoch_interruption = True
            cfg.consume_fuel = True
            _engine = wasmtime.Engine(cfg)
        return _engine


class _Ticker:
    """Advances the engine epoch every TICK_SECS while at least one call is running (idle: sleeps)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Ticker:
        with self._cond:
            self._active += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="wasm-epoch", daemon=True)
                self._thread.start()
            self._cond.notify()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._cond:
            self._active -= 1

    def _run(self) -> None:
        engine = get_engine()
        last = time.monotonic()
        while True:
            with self._cond:
                if not self._active:
                    while not self._active:
                        self._cond.wait()
                    last = time.monotonic()
            time.sleep(TICK_SECS)
            # One tick per TICK_SECS of wall time, even when this thread was scheduled late (a loaded machine).
            now = time.monotonic()
            ticks = max(1, int((now - last) / TICK_SECS))
            last += ticks * TICK_SECS
            for _ in range(min(ticks, 10_000)):
                engine.increment_epoch()


ticker = _Ticker()


@dataclass
class CompiledModule:
    module: wasmtime.Module
    sha256: str
    size: int
    cache: str  # "memory" | "disk" | "compiled" | "recompiled-stale" | "recompiled-corrupt"
    warnings: list[str] = field(default_factory=list)
    min_memory_bytes: int = 0
    instance_pres: dict[frozenset, wasmtime.InstancePre] = field(default_factory=dict)
    imports: tuple[tuple[str, str], ...] = ()
    abi_problem: str | None = None  # a required export missing or mistyped (checked once per compiled module)
    import_checks: dict[tuple, tuple[frozenset, bool] | WasmError] = field(default_factory=dict)


_MEM_CACHE_MAX = 256
_mem_cache: OrderedDict[tuple, CompiledModule] = OrderedDict()
_mem_lock = threading.Lock()


def clear_memory_cache() -> None:
    with _mem_lock:
        _mem_cache.clear()


def cache_paths(wasm_path: Path) -> tuple[Path, Path]:
    """(.cwasm, .sha256) for a module: AgentZero's plugin.cwasm/source.sha256 for plugin.wasm."""
    cache_dir = wasm_path.parent / ".cache"
    stem = wasm_path.stem
    if stem == "plugin":
        return cache_dir / "plugin.cwasm", cache_dir / "source.sha256"
    return cache_dir / f"{stem}.cwasm", cache_dir / f"{stem}.sha256"


def load_module(wasm_path: Path, policy: WasmPolicy) -> CompiledModule:
    """The compiled module for a .wasm file: from memory, else the disk AOT cache, else compiled (and cached).

    Raises WasmError (missing file, too large, symlink, invalid module). One stat per call when cached in memory.
    """
    try:
        if policy.reject_symlink_modules and wasm_path.is_symlink():
            raise WasmError(P.PATH_TRAVERSAL, f"module {wasm_path.name} is a symlink (refused by policy)")
        st = os.stat(wasm_path)
    except FileNotFoundError as exc:
        raise WasmError(P.SCRIPT_NOT_FOUND, f"wasm module {wasm_path} not found") from exc
    except OSError as exc:
        raise WasmError(P.IO_ERROR, f"cannot read wasm module {wasm_path}: {exc}") from exc
    if st.st_size > policy.max_module_bytes:
        raise WasmError(MODULE_TOO_LARGE, f"plugin module exceeds size policy ({st.st_size} > "
                                          f"{policy.max_module_bytes} bytes)")
    key = (str(wasm_path), st.st_mtime_ns, st.st_size, st.st_ino)
    with _mem_lock:
        hit = _mem_cache.get(key)
        if hit is not None:
            _mem_cache.move_to_end(key)
    if hit is not None:
        return replace(hit, cache="memory", warnings=[])
    try:
        source = wasm_path.read_bytes()
    except OSError as exc:
        raise WasmError(P.IO_ERROR, f"cannot read wasm module {wasm_path}: {exc}") from exc
    if len(source) > policy.max_module_bytes:
        raise WasmError(MODULE_TOO_LARGE, f"plugin module exceeds size policy ({len(source)} > "
                                          f"{policy.max_module_bytes} bytes)")
    sha = hashlib.sha256(source).hexdigest()
    compiled = _load_or_compile(wasm_path, source, sha)
    with _mem_lock:
        _mem_cache[key] = compiled
        while len(_mem_cache) > _MEM_CACHE_MAX:
            _mem_cache.popitem(last=False)
    return compiled


def _load_or_compile(wasm_path: Path, source: bytes, sha: str) -> CompiledModule:
    engine = get_engine()
    cwasm, sha_file = cache_paths(wasm_path)
    warnings: list[str] = []
    state = "compiled"
    try:
        cached_sha = sha_file.read_text().strip()
    except OSError:
        cached_sha = None
    if cached_sha is not None:
        if cached_sha == sha and cwasm.exists():
            try:
                artefact = cwasm.read_bytes()
                # The artefact is native code: only load bytes this installation wrote (HMAC with a secret kept
                # outside plugin directories), never a cache shipped inside a plugin package.
                stamp = cwasm.with_suffix(".cwasm.hmac")
                if not hmac.compare_digest(stamp.read_text().strip(), _seal(artefact)):
                    raise ValueError("not sealed by this installation")
                module = wasmtime.Module.deserialize(engine, artefact)
                return _compiled(module, sha, len(source), "disk", warnings)
            except (OSError, ValueError, wasmtime.WasmtimeError) as exc:
                warnings.append(f"AOT cache {cwasm.name} is unusable ({first_line(exc)}); recompiled from source")
                state = "recompiled-corrupt"
        else:
            state = "recompiled-stale"
    try:
        module = wasmtime.Module(engine, source)
    except wasmtime.WasmtimeError as exc:
        raise WasmError(MODULE_INVALID, f"{wasm_path.name} is not a valid wasm module: {first_line(exc)}") from exc
    try:
        artefact = bytes(module.serialize())
        cwasm.parent.mkdir(parents=True, exist_ok=True)
        tmp = cwasm.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(artefact)
        tmp.replace(cwasm)
        _atomic_write(cwasm.with_suffix(".cwasm.hmac"), _seal(artefact))
        _atomic_write(sha_file, sha)
    except (OSError, wasmtime.WasmtimeError) as exc:
        warnings.append(f"could not write the AOT cache: {exc}")
    return _compiled(module, sha, len(source), state, warnings)


_secret: bytes | None = None
_secret_lock = threading.Lock()


def _cache_secret() -> bytes:
    """A per-installation key ($LIBREFANG_HOME/.wasm-cache.key, 0600) sealing the AOT artefacts we write."""
    global _secret
    with _secret_lock:
        if _secret is None:
            path = Path(os.environ.get("LIBREFANG_HOME") or Path.home() / ".librefang").expanduser() / ".wasm-cache.key"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as fh:
                        fh.write(secrets.token_hex(32))
                except FileExistsError:
                    pass
                _secret = bytes.fromhex(path.read_text().strip())
            except (OSError, ValueError):
                _secret = secrets.token_bytes(32)  # unwritable home: the disk cache only helps this process
        return _secret


def _seal(artefact: bytes) -> str:
    return hmac.new(_cache_secret(), artefact, hashlib.sha256).hexdigest()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def _compiled(module: wasmtime.Module, sha: str, size: int, state: str, warnings: list[str]) -> CompiledModule:
    min_mem = 0
    exports: dict[str, Any] = {}
    for exp in module.exports:
        ty = exp.type
        exports[exp.name] = ty
        if isinstance(ty, wasmtime.MemoryType):
            min_mem = max(min_mem, ty.limits.min * PAGE)
    imports = []
    for imp in module.imports:
        imports.append((imp.module, imp.name or ""))
        if isinstance(imp.type, wasmtime.MemoryType):
            min_mem = max(min_mem, imp.type.limits.min * PAGE)
    problem = None
    alloc, entry = exports.get("az_alloc"), exports.get("az_tool_execute")
    if not isinstance(exports.get("memory"), wasmtime.MemoryType):
        problem = "module does not export 'memory'"
    elif not isinstance(alloc, wasmtime.FuncType) or not signature_matches(alloc, [I32], [I32]):
        problem = "module is missing the 'az_alloc' export (expected fn(i32) -> i32)"
    elif not isinstance(entry, wasmtime.FuncType) or not signature_matches(entry, [I32, I32], [I64]):
        problem = "module is missing the 'az_tool_execute' export (expected fn(i32, i32) -> i64)"
    return CompiledModule(module, sha, size, state, warnings, min_mem, imports=tuple(imports), abi_problem=problem)


