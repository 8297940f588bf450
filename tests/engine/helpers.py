"""Small helpers for the engine conformance tests: write a hook script and run it through the real runner."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from engine.plugins.loader import manifest_sha256
from engine.plugins.permissions import MemoryApprovals
from engine.process.runner import PROCESS, HookCall, HookResult
from engine.process.runtimes import resolve_tag


def write_hook(plugin_dir: Path, source: str, name: str = "hooks/hook.py", mode: int | None = None) -> str:
    path = plugin_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip())
    if mode is not None:
        os.chmod(path, mode)
    return name


def run(plugin_dir: Path, source: str, request=None, *, runtime: str = "python", timeout: float = 20,
        name: str = "hooks/hook.py", on_stderr=None, **kw) -> HookResult:
    script = write_hook(plugin_dir, source, name) if source is not None else name
    call = HookCall(plugin_dir=plugin_dir, script=script, runtime=resolve_tag(runtime),
                    request=request if request is not None else {"type": "ingest", "message": "hi", "agent_id": "a1"},
                    timeout_secs=timeout, data_dir=plugin_dir.parent / "data", **kw)
    return PROCESS.run(call, on_stderr=on_stderr)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def approve(approvals: MemoryApprovals, plugin_dir: Path) -> None:
    """Approve the plugin.toml now on disk, as `librefang plugin approve` does (the `approvals` fixture)."""
    approvals.approve(plugin_dir.name, manifest_sha256((plugin_dir / "plugin.toml").read_text()))
