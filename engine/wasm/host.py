"""Host calls (`az::*`): which a module may import (declared by the plugin AND allowed by the policy), their
implementations, and the linkers that provide them. Anything else is refused before instantiation."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wasmtime

from engine.filecache import confine as _confine
from engine.wasm.abi import (
    HOST_CALLS,
    HOST_MODULE,
    HTTP_BODY_CAP_BYTES,
    I32,
    I64,
    IMPORT_DENIED,
    LOG_LEVELS,
    LOG_LINE_CAP,
    MAX_LOG_LINES,
    READ_FILE_CAP_BYTES,
    WASI_MODULE,
    WasmError,
    pack,
)
from engine.wasm.compile_cache import CompiledModule, get_engine
from engine.wasm.policy import WasmPolicy


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


_SIGS = {
    "az_log": wasmtime.FuncType([I32, I32, I32], []),
    "az_env_get": wasmtime.FuncType([I32, I32], [I64]),
    "az_read_file": wasmtime.FuncType([I32, I32], [I64]),
    "az_http_get": wasmtime.FuncType([I32, I32], [I64]),
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


current = threading.local()


def _ctx() -> CallContext:
    return current.ctx


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


def log(ctx: CallContext, line: str) -> None:
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
            log(ctx, f"[{LOG_LEVELS.get(level, 'TRACE')}] {part}")


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
        log(ctx, f"[WARN] az_read_file refused: {exc}")
        return 0
    if len(data) > READ_FILE_CAP_BYTES:
        log(ctx, f"[WARN] az_read_file refused: file larger than {READ_FILE_CAP_BYTES} bytes")
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
        log(ctx, f"[WARN] az_http_get refused: {exc}")
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


def linker(names: frozenset, wasi: bool) -> wasmtime.Linker:
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
