"""The `wasm` runtime: WebAssembly modules run in-process under wasmtime, speaking AgentZero's ABI v2.

A module exports `memory`, `az_alloc(i32) -> i32` and `az_tool_execute(ptr, len) -> i64` (packed `ptr | len << 32`);
`az_tool_name`/`az_tool_schema` are read when present. Every call gets a fresh Store and instance from a compiled
module cached in memory and on disk (`.cache/<stem>.cwasm` + `<stem>.sha256`, AgentZero's `plugin.cwasm` +
`source.sha256` when the module is `plugin.wasm`). Host functions live in import module `az`; each is linked only
when the plugin declares it AND the service's isolation policy allows it; anything else is refused before
instantiation with a clear message. Time (epoch deadline, optional fuel), memory (Store limits) and module size are
limited; every violation is a classified failure, never an exception out of this module.

Hooks (`runtime = "wasm"`): the hook request JSON is the ABI input, the module's output is read with the same rules as
a subprocess hook's stdout, `az_log` lines go to the same live stderr stream. WASM tools: see engine/wasm_tools.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import wasmtime

from engine import protocol as P
from engine.filecache import FileCache
from engine.filecache import confine as _confine
from engine.protocol import Failure

# ---- failure kinds specific to wasm (stable strings, like engine.protocol's) ----
MODULE_INVALID = "wasm_module_invalid"  # not a wasm module / does not compile
ABI_ERROR = "wasm_abi_error"  # a required export is missing or has the wrong type, or bad pointers
IMPORT_DENIED = "wasm_import_denied"  # imports a host call it did not declare or the policy refuses
MODULE_TOO_LARGE = "wasm_module_too_large"
MEMORY_LIMIT = "wasm_memory_limit"
FUEL_EXHAUSTED = "wasm_fuel_exhausted"
TRAP = "wasm_trap"
HASH_MISMATCH = "wasm_hash_mismatch"
# Time limit: P.TIMEOUT. Output problems: P.EMPTY_OUTPUT / P.INVALID_OUTPUT.

HOST_MODULE = "az"
WASI_MODULE = "wasi_snapshot_preview1"
HOST_CALLS = ("az_log", "az_env_get", "az_read_file", "az_http_get")
LOG_LEVELS = {0: "ERROR", 1: "WARN", 2: "INFO", 3: "DEBUG"}
OUTPUT_CAP_BYTES = P.STREAM_CAP_BYTES
HTTP_BODY_CAP_BYTES = 1024 * 1024
READ_FILE_CAP_BYTES = 1024 * 1024
LOG_LINE_CAP = 4096
MAX_LOG_LINES = 1000
PAGE = 65536
TICK_SECS = 0.002  # epoch granularity
NO_FUEL_LIMIT = 2**62
TABLE_ELEMENTS_LIMIT = 100_000  # function-table entries per table (a huge declared table would eat host memory)


class WasmError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def failure(self) -> Failure:
        return Failure(self.kind, self.message)


def pack(ptr: int, length: int) -> int:
    return (ptr & 0xFFFF_FFFF) | ((length & 0xFFFF_FFFF) << 32)


def unpack(packed: int) -> tuple[int, int]:
    packed &= 0xFFFF_FFFF_FFFF_FFFF  # i64 results arrive signed
    return packed & 0xFFFF_FFFF, (packed >> 32) & 0xFFFF_FFFF


# ---------------------------------------------------------------------------------------------------------------
# Isolation policy: `[runtime.wasm]` and `[runtime.wasm.security]` in $LIBREFANG_HOME/config.toml
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WasmPolicy:
    """The service's sandbox boundaries for every wasm module (hooks and tools).

    `allowed_host_calls` lists host calls beyond `az_log` (always linked) that modules may import, as
    `"az::name"` (AgentZero's key) or a bare `"name"`. `allow_workspace_read` also permits `az_read_file`;
    `allow_network` also permits `az_http_get`, whose URLs must still match `allowed_hosts`.
    `module_hash_policy` (tools): "warn" = log the mismatch and run; "enforce" = refuse to run; "skip" = no check.
    """

    max_execution_ms: int = 30_000  # tools; hooks use their hook_timeout_secs
    fuel_limit: int | None = None  # instructions budget per call; None = only the time limit
    memory_limit_mb: int = 64
    max_module_bytes: int = 50 * 1024 * 1024
    allow_workspace_read: bool = False
    allow_workspace_write: bool = False
    allow_network: bool = False
    allowed_hosts: tuple[str, ...] = ()
    allowed_host_calls: tuple[str, ...] = ()
    allowed_env_vars: tuple[str, ...] = ()  # tools only: service env vars az_env_get may read
    module_hash_policy: str = "warn"
    reject_symlink_modules: bool = True
    workspace_root: str = ""  # tools; "" = $LIBREFANG_HOME/workspace

    def permits(self, name: str) -> bool:
        if name == "az_log":
            return True
        listed = f"az::{name}" in self.allowed_host_calls or name in self.allowed_host_calls
        if name == "az_read_file":
            return listed or self.allow_workspace_read
        if name == "az_http_get":
            return listed or self.allow_network
        return listed

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for pattern in self.allowed_hosts:
            pattern = pattern.lower().strip()
            if pattern == "*" or pattern == host:
                return True
            if pattern.startswith("*.") and host.endswith(pattern[1:]):
                return True
        return False


def policy_from_toml(raw: dict[str, Any]) -> WasmPolicy:
    """Build the policy from a parsed config.toml; raises ValueError with a readable message on bad values."""
    section = ((raw.get("runtime") or {}).get("wasm") or {}) if isinstance(raw.get("runtime"), dict) else {}
    if not isinstance(section, dict):
        raise ValueError("[runtime.wasm] must be a table")
    security = section.get("security") or {}
    kw: dict[str, Any] = {}

    def number(key: str, scale: int = 1, positive: bool = True) -> None:
        if key in section:
            value = section[key]
            if isinstance(value, bool) or not isinstance(value, int) or (positive and value <= 0):
                raise ValueError(f"[runtime.wasm] {key} must be a positive integer")
            kw[target.get(key, key)] = value * scale

    target = {"max_module_size_mb": "max_module_bytes"}
    number("max_execution_ms")
    number("fuel_limit")
    number("memory_limit_mb")
    number("max_module_bytes")
    if "max_module_size_mb" in section:
        number("max_module_size_mb", 1024 * 1024)
    for key in ("allow_workspace_read", "allow_workspace_write", "allow_network"):
        if key in section:
            if not isinstance(section[key], bool):
                raise ValueError(f"[runtime.wasm] {key} must be true or false")
            kw[key] = section[key]
    for key in ("allowed_hosts", "allowed_host_calls", "allowed_env_vars"):
        if key in section:
            value = section[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"[runtime.wasm] {key} must be a list of strings")
            kw[key] = tuple(value)
    if "workspace_root" in section:
        kw["workspace_root"] = str(section["workspace_root"])
    if isinstance(security, dict):
        mode = security.get("module_hash_policy", "warn")
        if mode not in ("warn", "enforce", "skip"):
            raise ValueError('[runtime.wasm.security] module_hash_policy must be "warn", "enforce" or "skip"')
        kw["module_hash_policy"] = mode
        if "reject_symlink_modules" in security:
            kw["reject_symlink_modules"] = bool(security["reject_symlink_modules"])
    return WasmPolicy(**kw)


def policy_cache(path: Path) -> FileCache[WasmPolicy]:
    """The policy from config.toml, re-read when the file changes; a broken file keeps the last good policy."""
    return FileCache(path, lambda text: policy_from_toml(tomllib.loads(text)), WasmPolicy(), "wasm policy")


_policy_caches: dict[Path, FileCache[WasmPolicy]] = {}
_policy_lock = threading.Lock()


def policy_for(config_path: Path) -> WasmPolicy:
    with _policy_lock:
        cache = _policy_caches.get(config_path)
        if cache is None:
            cache = _policy_caches[config_path] = policy_cache(config_path)
    return cache.get()


# ---------------------------------------------------------------------------------------------------------------
# Engine, epoch ticker, compiled-module cache
# ---------------------------------------------------------------------------------------------------------------

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


_ticker = _Ticker()


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
                warnings.append(f"AOT cache {cwasm.name} is unusable ({_first_line(exc)}); recompiled from source")
                state = "recompiled-corrupt"
        else:
            state = "recompiled-stale"
    try:
        module = wasmtime.Module(engine, source)
    except wasmtime.WasmtimeError as exc:
        raise WasmError(MODULE_INVALID, f"{wasm_path.name} is not a valid wasm module: {_first_line(exc)}") from exc
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
    elif not isinstance(alloc, wasmtime.FuncType) or not _sig(alloc, [_I32], [_I32]):
        problem = "module is missing the 'az_alloc' export (expected fn(i32) -> i32)"
    elif not isinstance(entry, wasmtime.FuncType) or not _sig(entry, [_I32, _I32], [_I64]):
        problem = "module is missing the 'az_tool_execute' export (expected fn(i32, i32) -> i64)"
    return CompiledModule(module, sha, size, state, warnings, min_mem, imports=tuple(imports), abi_problem=problem)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------------------------
# Import validation and linking
# ---------------------------------------------------------------------------------------------------------------

def declared(name: str, capabilities: Iterable[str]) -> bool:
    caps = set(capabilities)
    if name == "az_log":
        return True
    if {f"host:{name}", f"az::{name}", name} & caps:
        return True
    return name == "az_read_file" and bool({"wasi:filesystem/read", "wasi:filesystem/read-write"} & caps)


def check_imports(compiled: CompiledModule, capabilities: Iterable[str], policy: WasmPolicy) -> tuple[frozenset, bool]:
    """(host calls to link, needs WASI). Raises WasmError(IMPORT_DENIED) naming the first refused import."""
    caps = tuple(capabilities)
    key = (caps, policy)
    hit = compiled.import_checks.get(key)
    if hit is None:
        try:
            hit = _check_imports(compiled.imports, caps, policy)
        except WasmError as exc:
            hit = exc
        compiled.import_checks[key] = hit
    if isinstance(hit, WasmError):
        raise WasmError(hit.kind, hit.message)
    return hit


def _check_imports(imports: Iterable[tuple[str, str]], caps: tuple[str, ...], policy: WasmPolicy) \
        -> tuple[frozenset, bool]:
    names: set[str] = set()
    wasi = False
    for mod, name in imports:
        if mod == WASI_MODULE:
            wasi = True
            continue
        if mod != HOST_MODULE:
            raise WasmError(IMPORT_DENIED, f"host call `{mod}::{name}` is not allowed by isolation policy "
                                           f"(only `az::*` host calls and WASI preview1 exist)")
        if name not in HOST_CALLS:
            raise WasmError(IMPORT_DENIED, f"host function `az::{name}` does not exist (available: "
                                           f"{', '.join(HOST_CALLS)})")
        if not declared(name, caps):
            raise WasmError(IMPORT_DENIED, f"host function `az::{name}` is imported but not declared: add "
                                           f"\"host:{name}\" to the plugin's capabilities")
        if not policy.permits(name):
            raise WasmError(IMPORT_DENIED, f"host function `az::{name}` is not permitted by isolation policy "
                                           f"(add \"az::{name}\" to [runtime.wasm] allowed_host_calls)")
        names.add(name)
    return frozenset(names), wasi


_I32 = wasmtime.ValType.i32()
_I64 = wasmtime.ValType.i64()
_SIGS = {
    "az_log": wasmtime.FuncType([_I32, _I32, _I32], []),
    "az_env_get": wasmtime.FuncType([_I32, _I32], [_I64]),
    "az_read_file": wasmtime.FuncType([_I32, _I32], [_I64]),
    "az_http_get": wasmtime.FuncType([_I32, _I32], [_I64]),
}


@dataclass
class CallContext:
    """Per-call state the host functions see (set in a thread-local while the guest runs)."""

    env: Any  # dict[str, str], or a callable building it on first az_env_get
    read_root: Path | None
    policy: WasmPolicy
    deadline: float
    on_log: Callable[[str], None] | None = None
    logs: list[str] = field(default_factory=list)


_current = threading.local()


def _ctx() -> CallContext:
    return _current.ctx


def _read_guest(caller: wasmtime.Caller, ptr: int, length: int) -> bytes | None:
    mem = caller.get("memory")
    if not isinstance(mem, wasmtime.Memory) or ptr < 0 or length < 0:
        return None
    if ptr + length > mem.data_len(caller):
        return None
    return bytes(mem.read(caller, ptr, ptr + length))


def _write_guest(caller: wasmtime.Caller, data: bytes) -> int:
    """Copy bytes into guest memory through its az_alloc; packed ptr|len, or 0 when that is impossible."""
    alloc = caller.get("az_alloc")
    mem = caller.get("memory")
    if not isinstance(alloc, wasmtime.Func) or not isinstance(mem, wasmtime.Memory):
        return 0
    ptr = alloc(caller, len(data))
    if not isinstance(ptr, int) or ptr < 0 or ptr + len(data) > mem.data_len(caller):
        return 0
    mem.write(caller, data, ptr)
    return pack(ptr, len(data))


def _log(ctx: CallContext, line: str) -> None:
    if len(ctx.logs) >= MAX_LOG_LINES:
        return
    ctx.logs.append(line)
    if ctx.on_log is not None:
        try:
            ctx.on_log(line)
        except Exception:  # a broken sink never breaks the call
            pass


def _host_az_log(caller: wasmtime.Caller, level: int, ptr: int, length: int) -> None:
    raw = _read_guest(caller, ptr, min(length, LOG_LINE_CAP))
    if raw is None:
        return  # out of bounds: ignored, as AgentZero does
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    ctx = _ctx()
    for part in text.splitlines() or [""]:
        if part.strip():
            _log(ctx, f"[{LOG_LEVELS.get(level, 'TRACE')}] {part}")


def _host_az_env_get(caller: wasmtime.Caller, ptr: int, length: int) -> int:
    raw = _read_guest(caller, ptr, length)
    if raw is None:
        return 0
    try:
        key = raw.decode("utf-8")
    except UnicodeDecodeError:
        return 0
    ctx = _ctx()
    if callable(ctx.env):  # built on first use: most modules never ask
        ctx.env = ctx.env()
    value = ctx.env.get(key)
    if value is None:
        return 0
    return _write_guest(caller, value.encode("utf-8"))


def confine(root: Path, rel: str) -> Path:
    """`rel` under the workspace root (see engine.filecache.confine). Raises ValueError."""
    return _confine(root, rel, "path", "the workspace")


def _host_az_read_file(caller: wasmtime.Caller, ptr: int, length: int) -> int:
    ctx = _ctx()
    raw = _read_guest(caller, ptr, length)
    if raw is None or ctx.read_root is None:
        return 0
    try:
        rel = raw.decode("utf-8")
        target = confine(ctx.read_root, rel)
        with open(target, "rb") as fh:
            data = fh.read(READ_FILE_CAP_BYTES + 1)
    except (UnicodeDecodeError, ValueError, OSError) as exc:
        _log(ctx, f"[WARN] az_read_file refused: {exc}")
        return 0
    if len(data) > READ_FILE_CAP_BYTES:
        _log(ctx, f"[WARN] az_read_file refused: file larger than {READ_FILE_CAP_BYTES} bytes")
        return 0
    return _write_guest(caller, data)


def _host_az_http_get(caller: wasmtime.Caller, ptr: int, length: int) -> int:
    ctx = _ctx()
    raw = _read_guest(caller, ptr, length)
    if raw is None:
        return 0
    try:
        url = raw.decode("utf-8")
        body = http_get(url, ctx.policy, max(0.05, ctx.deadline - time.monotonic()))
    except (UnicodeDecodeError, ValueError, OSError) as exc:
        _log(ctx, f"[WARN] az_http_get refused: {exc}")
        return 0
    return _write_guest(caller, body)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect could leave the allowlist


_opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


def http_get(url: str, policy: WasmPolicy, timeout: float) -> bytes:
    """GET `url` if its host is in the allowlist; the body, capped. Raises ValueError (refused) or OSError."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"scheme {parts.scheme!r} is not allowed (http and https only)")
    host = parts.hostname or ""
    if not host or not policy.host_allowed(host):
        raise ValueError(f"host {host!r} is not in [runtime.wasm] allowed_hosts")
    req = urllib.request.Request(url, headers={"User-Agent": "librefang-wasm/1"})
    try:
        with _opener.open(req, timeout=timeout) as resp:
            body = resp.read(HTTP_BODY_CAP_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code}") from exc
    if len(body) > HTTP_BODY_CAP_BYTES:
        raise ValueError(f"response larger than {HTTP_BODY_CAP_BYTES} bytes")
    return body


_HOST_IMPLS = {
    "az_log": _host_az_log,
    "az_env_get": _host_az_env_get,
    "az_read_file": _host_az_read_file,
    "az_http_get": _host_az_http_get,
}
_linkers: dict[tuple[frozenset, bool], wasmtime.Linker] = {}
_linker_lock = threading.Lock()


def _linker(names: frozenset, wasi: bool) -> wasmtime.Linker:
    key = (names, wasi)
    with _linker_lock:
        linker = _linkers.get(key)
        if linker is None:
            linker = wasmtime.Linker(get_engine())
            if wasi:
                linker.define_wasi()
            for name in sorted(names):
                linker.define_func(HOST_MODULE, name, _SIGS[name], _HOST_IMPLS[name], access_caller=True)
            _linkers[key] = linker
        return linker


# ---------------------------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------------------------

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
        _log(ctx, f"[WARN] {warning}")
    store = wasmtime.Store(get_engine())
    store.set_limits(memory_size=limit, table_elements=TABLE_ELEMENTS_LIMIT, instances=4, tables=8, memories=2)
    store.set_fuel(policy.fuel_limit or NO_FUEL_LIMIT)
    store.set_epoch_deadline(max(1, math.ceil(timeout_secs / TICK_SECS)) + 1)
    stderr_path = None
    if wasi:
        stderr_path = _stderr_file()
        store.set_wasi(_wasi_config(wasi_dir, policy, stderr_path))
    _current.ctx = ctx
    try:
        with _ticker:
            output = _run(store, compiled, names, wasi, input_bytes, limit, ctx, policy, timeout_secs)
    finally:
        _current.ctx = None
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
            _log(ctx, text)


def _run(store: wasmtime.Store, compiled: CompiledModule, names: frozenset, wasi: bool, input_bytes: bytes,
         limit: int, ctx: CallContext, policy: WasmPolicy, timeout_secs: float) -> bytes:
    pre_key = frozenset(names | ({"<wasi>"} if wasi else set()))
    pre = compiled.instance_pres.get(pre_key)
    try:
        if pre is None:
            pre = _linker(names, wasi).instantiate_pre(compiled.module)
            compiled.instance_pres[pre_key] = pre
        instance = pre.instantiate(store)
    except wasmtime.Trap as exc:
        raise _classify_trap(exc, store, None, limit, policy, timeout_secs, "start function") from exc
    except wasmtime.WasmtimeError as exc:
        text = str(exc)
        if ("memory" in text or "table" in text) and ("limit" in text or "minimum" in text or "resource" in text):
            raise WasmError(MEMORY_LIMIT, f"failed to instantiate module: {_first_line(exc)}") from exc
        raise WasmError(ABI_ERROR, f"failed to instantiate module: {_first_line(exc)}") from exc
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


def _sig(ty: wasmtime.FuncType, params: list, results: list) -> bool:
    return [str(p) for p in ty.params] == [str(p) for p in params] and \
        [str(r) for r in ty.results] == [str(r) for r in results]


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


# ---------------------------------------------------------------------------------------------------------------
# runtime = "wasm" hooks
# ---------------------------------------------------------------------------------------------------------------

_caps_cache: dict[str, tuple[tuple, tuple[str, ...]]] = {}
_caps_lock = threading.Lock()


def hook_capabilities(plugin_dir: Path) -> tuple[str, ...]:
    """`capabilities` of a wasm plugin: `[wasm] capabilities = [...]` in plugin.toml (re-read when it changes)."""
    path = plugin_dir / "plugin.toml"
    try:
        st = os.stat(path)
    except OSError:
        return ()
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    with _caps_lock:
        hit = _caps_cache.get(str(path))
    if hit and hit[0] == stamp:
        return hit[1]
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        section = raw.get("wasm") or {}
        caps = tuple(str(c) for c in (section.get("capabilities") or [])) if isinstance(section, dict) else ()
    except (OSError, ValueError):
        caps = ()
    with _caps_lock:
        _caps_cache[str(path)] = (stamp, caps)
    return caps


def _home_config_path(call: Any) -> Path | None:
    # data_dir is $LIBREFANG_HOME/plugin_data/<name>; config.toml sits at the home root.
    if call.data_dir is None:
        return None
    return Path(call.data_dir).parent.parent / "config.toml"


_made_dirs: set[str] = set()


def narrowed(policy: WasmPolicy, *, network: bool, filesystem: bool) -> WasmPolicy:
    """The policy minus what the plugin's own `allow_network = false` / `allow_filesystem = false` turn off."""
    drop = set()
    if not network:
        drop |= {"az_http_get", "az::az_http_get"}
    if not filesystem:
        drop |= {"az_read_file", "az::az_read_file"}
    if not drop:
        return policy
    return replace(policy, allowed_host_calls=tuple(c for c in policy.allowed_host_calls if c not in drop),
                   allow_network=policy.allow_network and network,
                   allow_workspace_read=policy.allow_workspace_read and filesystem,
                   allow_workspace_write=policy.allow_workspace_write and filesystem)


def run_wasm_hook(call: Any, on_stderr: Callable[[str], None] | None = None,
                  policy: WasmPolicy | None = None) -> Any:
    """Run one `runtime = "wasm"` hook (an engine.runner.HookCall); an engine.runner.HookResult, never raises."""
    from engine.runner import HookResult, build_env, locate_script

    started = time.monotonic()
    logs: list[str] = []

    def fail(kind: str, message: str) -> HookResult:
        return HookResult(False, failure=Failure(kind, message), stderr="\n".join(logs),
                          elapsed_ms=(time.monotonic() - started) * 1000)

    script = locate_script(call)
    if isinstance(script, Failure):
        return fail(script.kind, script.message)
    if policy is None:
        config_path = _home_config_path(call)
        policy = policy_for(config_path) if config_path else WasmPolicy()
    policy = narrowed(policy, network=getattr(call, "allow_network", True) is not False,
                      filesystem=getattr(call, "allow_filesystem", True) is not False)
    if call.data_dir is not None and str(call.data_dir) not in _made_dirs:
        Path(call.data_dir).mkdir(parents=True, exist_ok=True)
        _made_dirs.add(str(call.data_dir))
    payload = json.dumps(call.request, ensure_ascii=False).encode("utf-8")

    def log(line: str) -> None:
        logs.append(line)
        if on_stderr is not None:
            on_stderr(line)

    try:
        run = execute(script, payload, policy=policy, capabilities=hook_capabilities(call.plugin_dir),
                      timeout_secs=call.timeout_secs, env=lambda: build_env(call),
                      read_root=Path(call.data_dir) if call.data_dir is not None else None,
                      memory_limit_mb=call.max_memory_mb, on_log=log, wasi_dir=call.data_dir)
        text = decode_output(run.output)
    except WasmError as exc:
        return fail(exc.kind, exc.message)
    except Exception as exc:  # anything unexpected from wasmtime is still a classified failure, not a crash
        return fail(TRAP, f"wasm runtime error: {type(exc).__name__}: {_first_line(exc)}")
    elapsed = (time.monotonic() - started) * 1000
    stderr = "\n".join(logs)
    try:
        reply = P.parse_output(text)
    except P.EmptyOutput:
        return HookResult(False, failure=Failure(P.EMPTY_OUTPUT, "wasm hook returned empty output"), stderr=stderr,
                          stdout=text, elapsed_ms=elapsed, returncode=0)
    return HookResult(True, reply=reply, stderr=stderr, stdout=text, elapsed_ms=elapsed, returncode=0)


# ---------------------------------------------------------------------------------------------------------------
# Scaffold: a working wasm plugin from WAT
# ---------------------------------------------------------------------------------------------------------------

# The constant replies of the scaffolded modules (engine/scaffold.py builds the plugin; its assemble and compact
# modules echo the request's messages instead, since an empty list makes every agent call fall back).
SCAFFOLD_REPLIES = {
    "ingest": {"type": "ingest_result", "memories": []},
    "assemble": {"type": "assemble_result", "messages": []},
    "compact": {"type": "compact_result", "messages": []},
    "after_turn": {"type": "ok"},
    "bootstrap": {"type": "ok"},
    "prepare_subagent": {"type": "ok"},
    "merge_subagent": {"type": "ok"},
    "transform_tool_result": {"type": "skip"},
    "on_event": {"type": "ok"},
}


def _wat_string(data: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02x}" for b in data)


def hook_wat(log_line: str, reply: Any) -> str:
    """WAT for an ABI v2 module that logs one line through az_log and returns a fixed JSON reply."""
    out = json.dumps(reply, separators=(",", ":")).encode("utf-8")
    msg = log_line.encode("utf-8")
    out_at, msg_at = 1024, 1024 + len(out) + 16
    heap = (msg_at + len(msg) + 15) // 16 * 16 + 16
    return f""";; ABI v2 hook module (AgentZero-compatible). Build: python -c "import wasmtime,sys;
;; open(sys.argv[2],'wb').write(wasmtime.wat2wasm(open(sys.argv[1]).read()))" hook.wat hook.wasm
;; Input: the hook request JSON at (ptr, len). Output: packed ptr | len << 32 of the reply JSON.
(module
  (import "az" "az_log" (func $az_log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const {heap}))
  (data (i32.const {out_at}) "{_wat_string(out)}")
  (data (i32.const {msg_at}) "{_wat_string(msg)}")
  ;; bump allocator: never frees; the instance is dropped after each call
  (func (export "az_alloc") (param $size i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $size)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (if (i32.lt_s (memory.grow (i32.const 1)) (i32.const 0)) (then unreachable))))
    (local.get $ptr))
  (func (export "az_tool_execute") (param $ptr i32) (param $len i32) (result i64)
    (call $az_log (i32.const 2) (i32.const {msg_at}) (i32.const {len(msg)}))
    (i64.or (i64.const {out_at}) (i64.shl (i64.const {len(out)}) (i64.const 32)))))
"""


# ---------------------------------------------------------------------------------------------------------------
# Optional exports: az_tool_name / az_tool_schema
# ---------------------------------------------------------------------------------------------------------------

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
    _current.ctx = ctx
    try:
        with _ticker:
            instance = _linker(names, wasi).instantiate(store, compiled.module)
            exports = instance.exports(store)
            memory = exports.get("memory")
            for export, key in (("az_tool_name", "name"), ("az_tool_schema", "schema")):
                fn = exports.get(export)
                if not isinstance(fn, wasmtime.Func) or not isinstance(memory, wasmtime.Memory) \
                        or not _sig(fn.type(store), [], [_I64]):
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
        _current.ctx = None
    _describe_cache[compiled.sha256] = info
    return info


# ---------------------------------------------------------------------------------------------------------------
# Static checks for lint/doctor (compiles, never runs module code)
# ---------------------------------------------------------------------------------------------------------------

_KIND_FINDING = {MODULE_INVALID: "wasm.module_invalid", IMPORT_DENIED: "wasm.import_denied",
                 MODULE_TOO_LARGE: "wasm.module_too_large", P.SCRIPT_NOT_FOUND: "wasm.module_missing",
                 P.PATH_TRAVERSAL: "wasm.module_path", P.IO_ERROR: "wasm.module_unreadable"}
_KIND_HINT = {
    "wasm.import_denied": "Declare the host call in [wasm] capabilities (\"host:<name>\") and allow it in "
                          "config.toml [runtime.wasm] allowed_host_calls, or stop importing it.",
    "wasm.abi": "Export memory, az_alloc(i32)->i32 and az_tool_execute(i32,i32)->i64 (AgentZero ABI v2).",
    "wasm.module_invalid": "Rebuild the module (wat2wasm, cargo build --target wasm32-wasip1).",
    "wasm.memory": "Declare less initial memory or raise [runtime.wasm] memory_limit_mb.",
}


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


def check_plugin(plugin_dir: Path, hooks: dict[str, str], policy: WasmPolicy | None = None) -> list[Any]:
    """Findings for a `runtime = "wasm"` plugin's modules (hook -> path): load, ABI exports, imports vs.
    `[wasm] capabilities` and the service policy, initial memory vs. the limit. Compiles; runs no module code."""
    from engine import findings as F
    from engine.runner import resolve_script

    policy = policy or policy_for(plugin_dir.parent.parent / "config.toml")
    caps = hook_capabilities(plugin_dir)
    out = []
    for hook, script in hooks.items():
        try:
            static_check(resolve_script(plugin_dir, script), caps, policy)
        except ValueError as exc:
            out.append(F.error("wasm.module_path", f"{hook}: {exc}", "Keep modules inside the plugin directory."))
        except FileNotFoundError as exc:
            out.append(F.error("wasm.module_missing", f"{hook}: {exc}", "Build the module or fix the path."))
        except WasmError as exc:
            fid = {ABI_ERROR: "wasm.abi", MEMORY_LIMIT: "wasm.memory"}.get(exc.kind) or _KIND_FINDING.get(
                exc.kind, "wasm.invalid")
            out.append(F.error(fid, f"{hook}: {exc.message}", _KIND_HINT.get(fid, "")))
    return out
