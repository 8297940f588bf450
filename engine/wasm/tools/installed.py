"""Installed tools: `$LIBREFANG_HOME/tools/<id>/<version>/{manifest.json,<wasm_file>}`, the state file
`tools/plugin-state.json` (`{"plugins": {id: {version, enabled, installed_at, source}}}`, a missing entry = enabled)
under an exclusive lock `tools/.agentzero-plugins.lock`, discovery, and the view the API and dashboard show."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.home import Home
from engine.wasm.abi import WasmError
from engine.wasm.execution import describe as describe_module
from engine.wasm.execution import static_check
from engine.wasm.policy import WasmPolicy
from engine.wasm.tools.manifest import (
    ID_RE,
    LOCK_FILE,
    STATE_FILE,
    VERSION_RE,
    ToolError,
    ToolManifest,
    parse_manifest,
    sha256_hex,
)


@dataclass
class InstalledTool:
    id: str
    version: str
    dir: Path
    manifest: ToolManifest | None
    problems: list[str] = field(default_factory=list)
    enabled: bool = True
    installed_at: str | None = None
    source: str | None = None

    @property
    def wasm_path(self) -> Path | None:
        return self.dir / self.manifest.wasm_file if self.manifest else None


@contextmanager
def tools_locked(root: Path) -> Iterator[None]:
    """The tools directory's lock held (flock): one change of what is installed at a time, across processes."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_FILE, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def remove(home: Home, tool_id: str, version: str | None = None) -> int:
    """Remove one version (or all); the number of version directories removed."""
    if not tool_id.strip():
        raise ToolError("plugin id cannot be empty")
    if not ID_RE.match(tool_id) or (version is not None and (not VERSION_RE.match(version) or ".." in version)):
        raise ToolError(f"unknown tool {tool_id!r}", code="not_found", status=404)
    root = home.tools_dir
    with tools_locked(root):
        base = root / tool_id
        if not base.is_dir():
            return 0
        dirs = [base / version] if version else [d for d in base.iterdir() if d.is_dir()]
        count = 0
        for d in dirs:
            if d.is_dir():
                shutil.rmtree(d)
                count += 1
        if base.is_dir() and not any(base.iterdir()):
            base.rmdir()
        if not base.exists():
            state = load_state(home)
            state.get("plugins", {}).pop(tool_id, None)
            save_state(home, state)
        return count


def load_state(home: Home) -> dict[str, Any]:
    """The state file; missing or unreadable gives an empty state (everything enabled)."""
    try:
        data = json.loads((home.tools_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {"plugins": {}}
    if not isinstance(data, dict) or not isinstance(data.get("plugins"), dict):
        return {"plugins": {}}
    return data


def save_state(home: Home, state: dict[str, Any]) -> None:
    """The tools' state file replaced whole (written beside it, renamed into place); hold `tools_locked`."""
    path = home.tools_dir / STATE_FILE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    tmp.replace(path)


def set_enabled(home: Home, tool_id: str, enabled: bool) -> InstalledTool:
    tool = get_tool(home, tool_id)
    with tools_locked(home.tools_dir):
        state = load_state(home)
        entry = state.setdefault("plugins", {}).get(tool_id)
        if entry is None:  # installed by copying files: create the entry rather than fail like AgentZero
            entry = {"version": tool.version, "installed_at": None, "source": "manual"}
            state["plugins"][tool_id] = entry
        entry["enabled"] = enabled
        save_state(home, state)
    return get_tool(home, tool_id)


def _version_key(version: str) -> tuple:
    main = version.split("+")[0]
    core, _, pre = main.partition("-")
    parts = core.split(".")
    if all(p.isdigit() for p in parts):
        return (1, tuple(int(p) for p in parts), 0 if pre else 1, pre)
    return (0, (), 0, version)


def _load_dir(tool_id: str, version_dir: Path) -> InstalledTool:
    version = version_dir.name
    try:
        manifest = parse_manifest((version_dir / "manifest.json").read_bytes())
    except OSError as exc:
        return InstalledTool(tool_id, version, version_dir, None, [f"cannot read manifest.json: {exc}"])
    except ToolError as exc:
        return InstalledTool(tool_id, version, version_dir, None, [exc.message])
    problems = []
    if manifest.id != tool_id:
        problems.append(f"manifest id {manifest.id!r} does not match directory {tool_id!r}")
    if not (version_dir / manifest.wasm_file).is_file():
        problems.append(f"wasm file `{manifest.wasm_file}` is missing")
    return InstalledTool(tool_id, manifest.version, version_dir, manifest, problems)


def list_tools(home: Home) -> list[InstalledTool]:
    """Installed tools, the highest version of each (semver), with their state; sorted by id."""
    root = home.tools_dir
    if not root.is_dir():
        return []
    state = load_state(home).get("plugins", {})
    out = []
    for base in sorted(root.iterdir()):
        if not base.is_dir() or base.name.startswith(".") or not ID_RE.match(base.name):
            continue
        if (base / "manifest.json").is_file():  # flat layout (development)
            tool = _load_dir(base.name, base)
        else:
            versions = [d for d in base.iterdir() if d.is_dir() and not d.name.startswith(".")
                        and (d / "manifest.json").is_file()]
            if not versions:
                continue
            tool = _load_dir(base.name, max(versions, key=lambda d: _version_key(d.name)))
        entry = state.get(base.name) or {}
        tool.enabled = bool(entry.get("enabled", True))
        tool.installed_at = entry.get("installed_at")
        tool.source = entry.get("source")
        out.append(tool)
    return out


def get_tool(home: Home, tool_id: str) -> InstalledTool:
    for tool in list_tools(home):
        if tool.id == tool_id:
            return tool
    raise ToolError(f"unknown tool {tool_id!r}", code="not_found", status=404)


INFO_FILE = "tool-info.json"
_sha_cache: dict[tuple, str] = {}


def module_sha256(path: Path) -> str | None:
    """sha256 of a module file (hashing only, no code runs); cached by (path, mtime, size, inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    sha = _sha_cache.get(key)
    if sha is None:
        try:
            sha = _sha_cache[key] = sha256_hex(path.read_bytes())
        except OSError:
            return None
    return sha


def info_path(tool: InstalledTool) -> Path:
    return tool.dir / ".cache" / INFO_FILE


def refresh_info(tool: InstalledTool, policy: WasmPolicy) -> dict[str, Any]:
    """Ask the module for az_tool_name/az_tool_schema (this RUNS module code: workers only) and store the answer
    next to it, keyed by the module's sha256, for readers that must not run plugin code (the web tier)."""
    if tool.manifest is None or tool.wasm_path is None:
        return {}
    try:
        meta = describe_module(tool.wasm_path, policy, tool.manifest.capabilities)
        info = {"sha256": meta["sha256"], "name": meta["name"], "schema": meta["schema"], "error": None}
    except WasmError as exc:
        info = {"sha256": module_sha256(tool.wasm_path), "name": None, "schema": None, "error": exc.message}
    path = info_path(tool)
    try:
        if not path.exists() or json.loads(path.read_text()) != info:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(info))
            tmp.replace(path)
    except (OSError, ValueError):
        pass
    return info


def refresh_if_stale(tool: InstalledTool, sha: str, policy: WasmPolicy) -> None:
    """`refresh_info` unless what is stored describes the module of `sha` already."""
    try:
        stored = json.loads(info_path(tool).read_text())
    except (OSError, ValueError):
        stored = None
    if not isinstance(stored, dict) or stored.get("sha256") != sha:
        refresh_info(tool, policy)


def describe(tool: InstalledTool, policy: WasmPolicy) -> dict[str, Any]:
    """A JSON-able view of a tool for the API and dashboard. Runs no module code: the module's own name and schema
    come from what a worker stored (refresh_info) for the current module bytes."""
    m = tool.manifest
    info: dict[str, Any] = {
        "id": tool.id, "version": tool.version, "enabled": tool.enabled, "installed_at": tool.installed_at,
        "source": tool.source, "description": (m.description if m else None) or "",
        "capabilities": m.capabilities if m else [], "allowed_host_calls": m.allowed_host_calls if m else [],
        "wasm_file": m.wasm_file if m else None, "wasm_sha256": m.wasm_sha256 if m else None,
        "runtime_api": [m.min_runtime_api, m.max_runtime_api] if m else None,
        "module_name": None, "input_schema": None, "problems": list(tool.problems), "hash_ok": None,
    }
    if m is None or tool.problems or tool.wasm_path is None:
        return info
    sha = module_sha256(tool.wasm_path)
    info["hash_ok"] = sha == m.wasm_sha256.lower()
    if not info["hash_ok"]:
        info["problems"].append(f"module sha256 {str(sha)[:12]}… does not match the manifest "
                                f"(module_hash_policy = {policy.module_hash_policy})")
    try:  # compiles (cached), runs nothing: an undeclared or refused import shows here, not only when called
        static_check(tool.wasm_path, m.capabilities, policy)
    except WasmError as exc:
        info["problems"].append(exc.message)
    try:
        stored = json.loads(info_path(tool).read_text())
    except (OSError, ValueError):
        stored = None
    if isinstance(stored, dict) and stored.get("sha256") == sha:
        info["module_name"] = stored.get("name")
        info["input_schema"] = stored.get("schema")
        if stored.get("error") and stored["error"] not in info["problems"]:
            info["problems"].append(stored["error"])
    return info
