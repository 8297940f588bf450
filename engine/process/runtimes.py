"""One entry per runtime tag of a manifest (`runtime = "node"`): how to launch a script and which environment
variables pass through. How a call then runs (a subprocess, forked warm from a zygote, or wasm in the worker) is the
`Runtime` protocol of engine/process/hook_call.py.

Launchers are resolved to absolute paths once per process (never through shell shims on each call).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RuntimeSpec:
    """What a runtime tag means: its launcher and what the hook's environment keeps."""

    tag: str
    launcher: str | None  # the binary looked up on PATH; None: the script is executed itself (or wasm)
    args_before_script: tuple[str, ...] = ()
    passthrough: tuple[str, ...] = ()
    extension: str = ""
    version_args: tuple[str, ...] = ("--version",)
    install_hint: str = ""
    aliases: tuple[str, ...] = ()
    needs_exec_bit: bool = False
    alternatives: tuple[str, ...] = field(default=())

    @property
    def is_wasm(self) -> bool:
        """WebAssembly modules run inside the worker (engine/wasm/), never as a command."""
        return self.tag == WASM


WASM = "wasm"

RUNTIMES: dict[str, RuntimeSpec] = {
    r.tag: r
    for r in (
        RuntimeSpec(
            "python", "python3", passthrough=("PYTHONPATH", "VIRTUAL_ENV", "PYTHONIOENCODING"), extension="py",
            aliases=("", "python3", "py"), alternatives=("python", "py"),
            install_hint="Install Python 3 from python.org or your OS package manager (apt install python3).",
        ),
        RuntimeSpec(
            "native", None, extension="", aliases=("binary", "exec"), needs_exec_bit=True,
            install_hint="No launcher: make sure the hook file is executable (chmod +x) and has a valid shebang or is a binary.",
        ),
        RuntimeSpec(
            "v", "v", args_before_script=("-no-retry-compilation", "run"), passthrough=("VMODULES",), extension="v",
            aliases=("vlang",), install_hint="Install V from vlang.io and put `v` on PATH.",
        ),
        RuntimeSpec(
            "node", "node", passthrough=("NODE_PATH",), extension="js", aliases=("nodejs", "js"),
            install_hint="Install Node.js from nodejs.org or your OS package manager (apt install nodejs).",
        ),
        RuntimeSpec(
            "deno", "deno", args_before_script=("run", "--allow-read", "--allow-env"), passthrough=("DENO_DIR",),
            extension="ts", aliases=("ts", "typescript"), install_hint="Install Deno from deno.com and put `deno` on PATH.",
        ),
        RuntimeSpec(
            "go", "go", args_before_script=("run",), passthrough=("GOPATH", "GOMODCACHE", "GOCACHE"), extension="go",
            aliases=("golang",), version_args=("version",),
            install_hint="Install Go from go.dev/dl or your OS package manager (apt install golang-go).",
        ),
        RuntimeSpec(
            "ruby", "ruby", passthrough=("RUBYLIB", "RUBYOPT", "GEM_HOME", "GEM_PATH"), extension="rb", aliases=("rb",),
            install_hint="Install Ruby from ruby-lang.org or your OS package manager (apt install ruby).",
        ),
        RuntimeSpec(
            "bash", "bash", extension="sh", aliases=("sh", "shell"),
            install_hint="Install bash with your OS package manager; it is preinstalled on most Unix systems.",
        ),
        RuntimeSpec(
            "bun", "bun", args_before_script=("run",), passthrough=("BUN_INSTALL",), extension="ts",
            install_hint="Install Bun from bun.sh and put `bun` on PATH.",
        ),
        RuntimeSpec(
            "php", "php", passthrough=("PHP_INI_SCAN_DIR",), extension="php",
            install_hint="Install PHP from php.net or your OS package manager (apt install php-cli).",
        ),
        RuntimeSpec(
            "lua", "lua", passthrough=("LUA_PATH", "LUA_CPATH"), extension="lua", version_args=("-v",),
            alternatives=("lua5.4", "lua5.3"),
            install_hint="Install Lua from lua.org or your OS package manager (apt install lua5.4).",
        ),
        RuntimeSpec(
            WASM, None, extension="wasm", aliases=("webassembly",),
            install_hint="Built in (wasmtime); nothing to install.",
        ),
    )
}

_ALIASES = {alias: r.tag for r in RUNTIMES.values() for alias in (r.tag, *r.aliases)}

WINDOWS_PASSTHROUGH = ("USERPROFILE", "SYSTEMROOT", "APPDATA", "LOCALAPPDATA", "COMSPEC")


@dataclass(frozen=True)
class ResolvedRuntime:
    """What a manifest's `runtime` tag means: a known runtime, or a custom launcher path."""

    runtime: RuntimeSpec
    custom_launcher: str | None = None
    warning: str | None = None

    @property
    def label(self) -> str:
        return self.custom_launcher or self.runtime.tag


def resolve_tag(tag: str | None) -> ResolvedRuntime:
    """Map a manifest tag to a runtime. Unknown tags resolve to python with a `warning` (LibreFang's rule); the
    manifest turns that warning into an error (engine/plugins/manifest.py), so such a plugin never serves."""
    raw = (tag or "").strip()
    if "/" in raw or "\\" in raw:
        return ResolvedRuntime(RuntimeSpec("custom", None, install_hint="Check the launcher path and its exec bit."), raw)
    key = raw.lower()
    if key in _ALIASES:
        return ResolvedRuntime(RUNTIMES[_ALIASES[key]])
    valid = ", ".join(sorted(RUNTIMES))
    return ResolvedRuntime(RUNTIMES["python"], warning=f"unknown runtime {raw!r}; falling back to python (valid: {valid})")


@functools.lru_cache(maxsize=64)
def find_launcher(runtime_tag: str) -> str | None:
    """The absolute, symlink-resolved path of a runtime's launcher, or None. Cached for the process."""
    runtime = RUNTIMES[runtime_tag]
    if runtime.launcher is None:
        return None
    for name in (runtime.launcher, *runtime.alternatives):
        found = shutil.which(name)
        if not found:
            continue
        real = os.path.realpath(found)
        if _is_shim(real):
            # pyenv/asdf shims re-exec through a shell script on every call; ask the shim for the real binary.
            resolved = _resolve_through_shim(found, runtime)
            if resolved:
                return resolved
        return real
    return None


def _is_shim(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
    except OSError:
        return False
    return head == b"#!" and ("shims" in path or "/.asdf/" in path)


def _resolve_through_shim(shim: str, runtime: RuntimeSpec) -> str | None:
    if runtime.tag != "python":
        return None
    try:
        out = subprocess.run(
            [shim, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    exe = out.stdout.strip()
    return os.path.realpath(exe) if out.returncode == 0 and exe else None


def build_command(resolved: ResolvedRuntime, script: str) -> list[str]:
    """argv for running `script` (an absolute path) under the runtime; raises LauncherNotFound."""
    if resolved.custom_launcher:
        return [resolved.custom_launcher, script]
    runtime = resolved.runtime
    if runtime.is_wasm:
        raise LauncherNotFound(WASM, runtime.install_hint,
                               f"runtime {resolved.label!r} runs in-process, not as a subprocess")
    if runtime.launcher is None:
        return [script]
    launcher = find_launcher(runtime.tag)
    if launcher is None:
        raise LauncherNotFound(runtime.launcher, runtime.install_hint)
    return [launcher, *runtime.args_before_script, script]


class LauncherNotFound(Exception):
    def __init__(self, launcher: str, hint: str, message: str | None = None):
        super().__init__(message or f"launcher {launcher!r} not found on PATH. {hint}")
        self.launcher = launcher
        self.hint = hint
