"""The isolation policy: `[runtime.wasm]` and `[runtime.wasm.security]` in $LIBREFANG_HOME/config.toml."""

from __future__ import annotations

import threading
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.filecache import FileCache


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


def policy_error(config_path: Path) -> str | None:
    """The config.toml problem that keeps the previous policy serving, if any (None before the first read)."""
    with _policy_lock:
        cache = _policy_caches.get(config_path)
    return cache.error if cache is not None else None


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
