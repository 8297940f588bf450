"""One hook call as a runtime takes it (`HookCall`), what came of it (`HookResult`), and the `Runtime` protocol that
runs it. The two runtimes: engine/process/runner.py `PROCESS` (a fresh process: forked from a warm zygote for a
python hook, else exec'd by the spawner) and engine/wasm/hooks.py `WASM` (in the worker); engine/invoke.py
`runtime_for` picks one per call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.process.runtimes import ResolvedRuntime
from engine.protocol import Failure

StderrCallback = Callable[[str], None]


@dataclass
class HookCall:
    """Everything needed to run one hook once."""

    plugin_dir: Path
    script: str  # as declared in plugin.toml, relative to plugin_dir
    runtime: ResolvedRuntime
    request: Any
    timeout_secs: float
    plugin_env: Mapping[str, str] = field(default_factory=dict)  # [env], already expanded
    allowed_env_vars: tuple[str, ...] = ()
    data_dir: Path | None = None
    max_memory_mb: int | None = None
    max_cpu_secs: int | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)  # e.g. LIBREFANG_PLUGIN_CONFIG
    allow_network: bool = True
    allow_filesystem: bool = True
    venv_dir: Path | None = None  # per-plugin virtualenv (requirements): python hooks run with its interpreter
    warm_start: bool = True  # [hooks] warm_start: python hooks may be forked from a zygote (engine/process/warmstart.py)
    max_processes: int | None = None  # [hooks] max_processes (DEFAULT_MAX_PROCESSES when None)
    home_dir: Path | None = None  # $LIBREFANG_HOME, hidden from the hook but for its own dirs (Home.from_env() if None)
    # `[wasm] capabilities` of the plugin (engine/invoke.py sets it from the manifest it already holds); None: the
    # wasm runtime reads the manifest itself (engine/wasm/hooks.py).
    wasm_capabilities: tuple[str, ...] | None = None
    # The sandbox (docs/security.md). max_disk_mb: size of the private /tmp and /dev/shm and the largest file
    # (DEFAULT_MAX_DISK_MB when None). uid/gid: the host identity the hook drops to (where it drops to one); None: the
    # plugin's own (engine/process/identity.py), never root nor the service's user either way.
    max_disk_mb: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass
class HookResult:
    ok: bool
    reply: Any = None
    failure: Failure | None = None
    stderr: str = ""
    stdout: str = ""
    elapsed_ms: float = 0.0
    returncode: int | None = None
    warnings: list[str] = field(default_factory=list)  # for the trace, e.g. sandbox.degraded

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "reply": self.reply,
            "error": self.failure.to_dict() if self.failure else None,
            "stderr": self.stderr,
            "elapsed_ms": round(self.elapsed_ms, 3),
        }


class Runtime(Protocol):
    """Runs one hook call; never raises for anything the hook does, every failure is classified."""

    name: str  # "process" or "wasm"

    def run(self, call: HookCall, on_stderr: StderrCallback | None = None) -> HookResult: ...
