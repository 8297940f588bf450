"""Run one hook script as a fresh, sandboxed subprocess speaking the JSON stdin/stdout protocol.

One session per call (killed whole on timeout), cleared environment, cwd = plugin dir, 1 MiB cap per stream,
stderr streamed line by line to a callback as it arrives.

What the hook gets is described once per call by `sandbox_spec` (an engine.sandbox.SandboxSpec) and applied by
engine.sandbox.enter in the child, whichever way it starts: spawned here (`enter` runs as the preexec function,
before exec) or forked from a warm-start zygote (engine/process/warmstart.py, python hooks). Where the OS allows namespaces
that is: its own PID namespace and /proc (every process it starts dies with it), a private view of the filesystem
($LIBREFANG_HOME hidden except the plugin's own directory and data directory; read-only with
allow_filesystem = false), an empty network namespace with allow_network = false, no capabilities, rlimits and a
per-call cgroup with memory and process-count limits (defaults below). PR_SET_PDEATHSIG(SIGKILL) ties the hook to
the thread that spawned it (the engine spawns from long-lived pool threads). Where namespaces are refused, every
call's result carries the `sandbox.degraded` warning (engine.sandbox.degraded_reasons()).

Neither path forks the worker: python hooks fork from their zygote, every other hook is exec'd by the spawner
(engine/process/hook_spawner.py, the zygote's loop in exec mode), and both keep a spare child that has already joined the
call's cgroup (joining one is slow on cgroup v1, see bench/README.md). Only when neither is available (or with
LIBREFANG_SPAWNER=0) does the worker spawn the hook itself, with `enter` as a preexec function: a full fork() of the
worker instead of CPython's vfork.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import protocol as P
from engine.filecache import confine
from engine.home import Home
from engine.process import sandbox, warmstart
from engine.process.runtimes import LauncherNotFound, ResolvedRuntime, build_command
from engine.protocol import Failure

StderrCallback = Callable[[str], None]

# After the hook itself exits, how long we keep reading pipes that a grandchild may still hold open.
GRANDCHILD_GRACE_SECS = 0.2
READ_CHUNK = 65536


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


def resolve_script(plugin_dir: Path, script: str) -> Path:
    """The script's real path, refusing `..` components and symlinks that escape the plugin dir.

    Raises ValueError (traversal) or FileNotFoundError. Runs on every call, not only at load.
    """
    target = confine(plugin_dir, script, "hook path", "the plugin directory")
    if not target.is_file():
        raise FileNotFoundError(f"hook script {script!r} not found in {plugin_dir}")
    return target


def locate_script(call: HookCall) -> Path | Failure:
    """The hook's script, or the classified failure (path_traversal / script_not_found) every runtime reports."""
    try:
        return resolve_script(call.plugin_dir, call.script)
    except ValueError as exc:
        return Failure(P.PATH_TRAVERSAL, str(exc))
    except FileNotFoundError as exc:
        return Failure(P.SCRIPT_NOT_FOUND, str(exc))


def build_env(call: HookCall, parent_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The hook's environment, in the order docs/compatibility.md gives; later entries win."""
    parent = os.environ if parent_env is None else parent_env
    request = call.request if isinstance(call.request, dict) else {}
    env: dict[str, str] = {
        "LIBREFANG_AGENT_ID": str(request.get("agent_id") or ""),
        "LIBREFANG_MESSAGE": _cap_utf8(str(request.get("message") or ""), P.MESSAGE_ENV_CAP_BYTES),
        "LIBREFANG_RUNTIME": call.runtime.label,
        "LIBREFANG_PLUGIN_DIR": str(call.plugin_dir),
    }
    if call.data_dir is not None:
        env["LIBREFANG_PLUGIN_DATA_DIR"] = str(call.data_dir)
    for key in ("PATH", "HOME", "LANG", "LC_ALL", "TZ"):
        if key in parent:
            env[key] = parent[key]
    for key in call.runtime.runtime.passthrough:
        if key in parent:
            env[key] = parent[key]
    if call.venv_dir is not None and call.runtime.runtime.tag == "python" and not call.runtime.custom_launcher:
        env["VIRTUAL_ENV"] = str(call.venv_dir)
        env["PATH"] = str(call.venv_dir / "bin") + os.pathsep + env.get("PATH", os.defpath)
    if call.max_memory_mb:
        env["LIBREFANG_MAX_MEMORY_MB"] = str(call.max_memory_mb)
    env.update(call.extra_env)
    env.update(call.plugin_env)
    for key in call.allowed_env_vars:
        if key in parent and key not in BLOCKED_ENV_VARS:
            env[key] = parent[key]
    if not call.allow_network:
        # LibreFang's soft network sandbox, applied on top of the namespace where that is available.
        env.update({"no_proxy": "*", "NO_PROXY": "*", "http_proxy": "", "https_proxy": "", "HTTP_PROXY": "",
                    "HTTPS_PROXY": "", "LIBREFANG_SANDBOX": "1"})
    if not call.allow_filesystem:
        # LibreFang's markers for allow_filesystem = false: HOME points nowhere (it overrides [env] HOME too). The
        # filesystem is really read-only (mount namespace) except the plugin's data dir, which also holds TMPDIR.
        env["LIBREFANG_READONLY_FS"] = "1"
        env["HOME"] = "/dev/null"
        if call.data_dir is not None:
            env["TMPDIR"] = str(call.data_dir / "tmp")
    return env


# Never handed to a hook, even when an operator lists them in allowed_env_vars (service secrets).
BLOCKED_ENV_VARS = frozenset({"LIBREFANG_VAULT_KEY", "DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL",
                              "LIBREFANG_LLM_API_KEY"})

# Defaults when a plugin sets no limit (docs/compatibility.md): enforced through the hook's cgroup where the service
# can create one. An explicit max_memory_mb is also an RLIMIT_AS, as before.
DEFAULT_MAX_MEMORY_MB = 1024
DEFAULT_MAX_PROCESSES = 128
# The keeper (outside) and init (pid 1) of the hook's PID namespace count against the pids cgroup too.
_SANDBOX_OWN_PROCESSES = 2


def network_isolation_available() -> bool:
    """Whether this process may give hooks an empty network namespace. Probed once per process."""
    return sandbox.network_isolation_available()


def filesystem_isolation_available() -> bool:
    """Whether hooks get their own mount namespace (hidden home, read-only view). Probed once per process."""
    return sandbox.mode() is not None


def sandbox_spec(call: HookCall, env: dict[str, str], cgroup_dirs: tuple[str, ...] = ()) -> sandbox.SandboxSpec:
    """The one description of what this call's hook gets (engine/process/sandbox.py applies it). The call's cgroup is
    described by its limits (`cgroup_limits`: the zygote or spawner prepares it); `cgroup_dirs` is one the worker
    made itself, for a hook it spawns."""
    mode = sandbox.mode()
    home = os.path.realpath(call.home_dir or Home.from_env().root)
    own_dirs = [d for d in (call.plugin_dir, call.data_dir) if d is not None]
    rlimits: list[tuple[str, int, int]] = []
    if call.max_memory_mb:
        mem = call.max_memory_mb * 1024 * 1024
        rlimits.append(("RLIMIT_AS", mem, mem))
    if call.max_cpu_secs:
        rlimits.append(("RLIMIT_CPU", call.max_cpu_secs, call.max_cpu_secs + 1))
    if mode == "userns":
        # Inside a user namespace RLIMIT_NPROC counts the hook's own processes (Linux >= 5.14), init included: the
        # process cap holds even where the call's pids cgroup could not be made.
        n = (call.max_processes or DEFAULT_MAX_PROCESSES) + 1
        rlimits.append(("RLIMIT_NPROC", n, n))
    return sandbox.SandboxSpec(
        cwd=str(call.plugin_dir),
        env=env,
        rlimits=tuple(rlimits),
        isolate=mode is not None,
        user_ns=mode == "userns",
        new_net=not call.allow_network and network_isolation_available(),
        hide=home if home != "/" else None,
        keep=tuple(_path_in_home(d) for d in own_dirs),
        read_only=not call.allow_filesystem and mode is not None,
        writable=tuple(_path_in_home(call.data_dir) for _ in [0] if call.data_dir is not None),
        cgroups=cgroup_dirs,
        cgroup_limits=_cgroup_limits(call) if sandbox.cgroups.available() else (),
        uid=os.getuid(),
        gid=os.getgid(),
    )


def _path_in_home(path: Path) -> str:
    """The directory's path with its parents resolved but not itself: a plugin dir that is a symlink (a linked dev
    plugin) is bound back where the hook expects it."""
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))


def _cgroup_limits(call: HookCall) -> tuple[int, int]:
    """(memory bytes, pids) of the call's cgroup."""
    extra = _SANDBOX_OWN_PROCESSES if sandbox.mode() is not None else 0
    return ((call.max_memory_mb or DEFAULT_MAX_MEMORY_MB) * 1024 * 1024,
            (call.max_processes or DEFAULT_MAX_PROCESSES) + extra)


class _EnterSandbox:
    """The preexec function of a spawned hook: engine.sandbox.enter, or exit 126 with the reason on stderr."""

    __slots__ = ("spec", "parent")

    def __init__(self, spec: sandbox.SandboxSpec):
        self.spec = spec
        self.parent = os.getpid()

    def __call__(self) -> None:
        try:
            sandbox.enter(self.spec, self.parent)
        except BaseException as exc:  # noqa: BLE001 - the hook must not run without its sandbox
            os.write(2, f"sandbox setup failed in the child: {exc}\n".encode("utf-8", "replace"))
            os._exit(sandbox.SETUP_FAILED)



def _cap_utf8(text: str, cap: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= cap:
        return text
    return data[:cap].decode("utf-8", errors="ignore")


def run_hook(call: HookCall, on_stderr: StderrCallback | None = None) -> HookResult:
    """Run the hook once. Never raises for anything the hook does; every failure is classified."""
    started = time.monotonic()

    def fail(kind: str, message: str, **kw: Any) -> HookResult:
        return HookResult(False, failure=Failure(kind, message, kw.pop("exit_code", None), kw.pop("signal", None)),
                          elapsed_ms=(time.monotonic() - started) * 1000, **kw)

    script = locate_script(call)
    if isinstance(script, Failure):
        return fail(script.kind, script.message)
    if call.runtime.runtime.in_process and not call.runtime.custom_launcher:
        return fail(P.LAUNCHER_NOT_FOUND, f"runtime {call.runtime.label!r} runs in-process, not as a subprocess")
    try:
        argv = build_command(call.runtime, str(script))
    except LauncherNotFound as exc:
        return fail(P.LAUNCHER_NOT_FOUND, str(exc))
    venv_python = _venv_python(call)
    if venv_python is not None:
        argv[0] = venv_python
    if call.data_dir is not None:
        try:
            call.data_dir.mkdir(parents=True, exist_ok=True)
            if not call.allow_filesystem:
                (call.data_dir / "tmp").mkdir(exist_ok=True)
        except OSError as exc:
            return fail(P.SPAWN_FAILED, f"cannot create the plugin's data directory {call.data_dir}: {exc}")
    try:
        payload = (json.dumps(call.request, ensure_ascii=False) + "\n").encode("utf-8")
    except (TypeError, ValueError) as exc:
        return fail(P.INVALID_INPUT, f"request is not JSON-serialisable: {exc}")
    spec = sandbox_spec(call, build_env(call))
    result, oom_killed = _spawn_and_talk(call, argv, spec, payload, started, on_stderr)
    if oom_killed and result.failure is not None:
        result.failure.message = (f"memory limit exceeded ({call.max_memory_mb or DEFAULT_MAX_MEMORY_MB} MB, "
                                  f"the hook's cgroup); {result.failure.message}")
    _label_limits(result, call)
    reasons = sandbox.degraded_reasons()
    if reasons:
        result.warnings.append("sandbox.degraded: " + "; ".join(reasons))
    return result


def _spawn_and_talk(call: HookCall, argv: list[str], spec: sandbox.SandboxSpec, payload: bytes, started: float,
                    on_stderr: StderrCallback | None) -> tuple[HookResult, bool]:
    """The hook's result, and whether its cgroup's memory limit killed something."""
    def fail(kind: str, message: str) -> tuple[HookResult, bool]:
        return HookResult(False, failure=Failure(kind, message), elapsed_ms=(time.monotonic() - started) * 1000), False

    if warmstart.applies(call, argv):
        warm = warmstart.spawn(argv, spec)
        if warm is not None:  # None: no zygote for this interpreter right now; spawn normally below
            return _communicate(warm, payload, call.timeout_secs, started, on_stderr), warm.oom_killed  # type: ignore[arg-type]
    problem = _check_executable(argv[0])
    if problem is not None:
        return fail(*problem)
    program = _resolve_program(argv[0], spec)
    if program is not None:
        try:
            proc = warmstart.spawn_exec([program, *argv[1:]], spec)
        except OSError as exc:
            return fail(*_exec_failure(argv[0], exc))
        if proc is not None:
            return _communicate(proc, payload, call.timeout_secs, started, on_stderr), proc.oom_killed  # type: ignore[arg-type]
    cgroup_dirs = sandbox.cgroups.create(*spec.cgroup_limits) if spec.cgroup_limits else ()
    try:
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=spec.cwd,
                env=spec.env,
                start_new_session=True,  # own process group: a timeout kills the keeper, and so the namespace
                close_fds=True,
                preexec_fn=_EnterSandbox(dataclasses.replace(spec, cgroups=cgroup_dirs)),
            )
        except subprocess.SubprocessError as exc:
            return fail(P.SPAWN_FAILED, f"sandbox setup failed in the child: {exc}")
        except OSError as exc:
            return fail(*_exec_failure(argv[0], exc))
        result = _communicate(popen, payload, call.timeout_secs, started, on_stderr)
        return result, bool(cgroup_dirs) and result.failure is not None and sandbox.cgroups.oom_killed(cgroup_dirs)
    finally:
        sandbox.cgroups.release(cgroup_dirs)


def _resolve_program(program: str, spec: sandbox.SandboxSpec) -> str | None:
    """The absolute path exec will run (as subprocess looks it up: PATH of the hook's environment, or relative to
    its cwd), for the spawner; None when there is none, and the worker's own spawn reports why."""
    if os.path.isabs(program):
        return program
    if os.sep in program:
        found = os.path.join(spec.cwd, program)
        return found if os.path.isfile(found) and os.access(found, os.X_OK) else None
    found = shutil.which(program, path=spec.env.get("PATH", os.defpath))
    return os.path.abspath(found) if found else None


def _exec_failure(program: str, exc: OSError) -> tuple[str, str]:
    if isinstance(exc, FileNotFoundError):
        return P.LAUNCHER_NOT_FOUND, f"cannot execute {program!r}: {exc.strerror}"
    if isinstance(exc, PermissionError):
        return P.SPAWN_FAILED, f"cannot execute {program!r}: {exc.strerror} (is the exec bit set?)"
    return P.SPAWN_FAILED, f"cannot start hook: {exc}"


_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "out of memory", "Out of memory", "bad_alloc",
                "Allowed memory size", "failed to reserve", "not enough memory")


def _label_limits(result: HookResult, call: HookCall) -> None:
    """Say so when a failure was caused by the plugin's own resource limits."""
    f = result.failure
    if f is None or f.kind != P.SCRIPT_ERROR:
        return
    if call.max_cpu_secs and f.signal in (signal.SIGXCPU, signal.SIGKILL) and f.signal is not None:
        f.message = f"CPU time limit exceeded (max_cpu_secs={call.max_cpu_secs}); {f.message}"
    elif call.max_memory_mb and (f.signal in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGTRAP)
                                 or any(m in result.stderr for m in _OOM_MARKERS)):
        f.message = f"memory limit exceeded (max_memory_mb={call.max_memory_mb}); {f.message}"


def _check_executable(path: str) -> tuple[str, str] | None:
    """The launcher (or native script) must exist and be executable; said before spawning, so that wrapped and
    unwrapped spawns fail the same way."""
    if not os.path.isabs(path):
        return None  # looked up on PATH by exec
    if not os.path.exists(path):
        return P.LAUNCHER_NOT_FOUND, f"cannot execute {path!r}: No such file or directory"
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        return P.SPAWN_FAILED, f"cannot execute {path!r}: Permission denied (is the exec bit set?)"
    return None


def _venv_python(call: HookCall) -> str | None:
    if call.venv_dir is None or call.runtime.runtime.tag != "python" or call.runtime.custom_launcher:
        return None
    exe = call.venv_dir / "bin" / "python"
    return str(exe) if exe.exists() else None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


class _LineSplitter:
    """Turns stderr chunks into lines for the callback, as they arrive."""

    def __init__(self, callback: StderrCallback | None):
        self.callback = callback
        self.partial = b""

    def feed(self, chunk: bytes) -> None:
        if self.callback is None:
            return
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        for line in lines:
            self._emit(line)

    def flush(self) -> None:
        if self.partial:
            self._emit(self.partial)
            self.partial = b""

    def _emit(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if text.strip() and self.callback is not None:
            try:
                self.callback(text)
            except Exception:  # a broken sink must never break the hook call
                pass


def _communicate(proc: subprocess.Popen, payload: bytes, timeout: float, started: float,
                 on_stderr: StderrCallback | None) -> HookResult:
    deadline = started + timeout
    out = bytearray()
    err = bytearray()
    splitter = _LineSplitter(on_stderr)
    sel = selectors.DefaultSelector()
    assert proc.stdin and proc.stdout and proc.stderr
    for f in (proc.stdin, proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    if payload:
        sel.register(proc.stdin, selectors.EVENT_WRITE, "in")
    else:
        proc.stdin.close()
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    except (AttributeError, OSError):
        pidfd = None
    written = 0
    failure: Failure | None = None
    exited_at: float | None = None
    open_readers = 2
    try:
        while open_readers:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > GRANDCHILD_GRACE_SECS:
                _kill_group(proc)  # a grandchild still holds our pipes; the hook itself is done
                break
            if now >= deadline:
                _kill_group(proc)
                failure = Failure(P.TIMEOUT, f"hook did not finish within {timeout:g}s; its process group was killed")
                break
            wait = deadline - now
            if exited_at is not None:
                wait = min(wait, GRANDCHILD_GRACE_SECS)
            elif pidfd is None:
                wait = min(wait, 0.05)
            for key, _ in sel.select(wait):
                tag = key.data
                if tag == "exit":
                    sel.unregister(key.fileobj)
                    exited_at = exited_at or time.monotonic()
                elif tag == "in":
                    try:
                        written += os.write(proc.stdin.fileno(), payload[written:written + READ_CHUNK])
                    except (BrokenPipeError, OSError) as exc:  # hook ignored or closed stdin: that's fine
                        if isinstance(exc, OSError) and exc.errno not in (errno.EPIPE, errno.EBADF, errno.EAGAIN):
                            failure = Failure(P.IO_ERROR, f"writing the request failed: {exc}")
                        written = len(payload)
                    if written >= len(payload):
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                else:
                    stream = out if tag == "out" else err
                    try:
                        chunk = os.read(key.fileobj.fileno(), READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_readers -= 1
                        continue
                    stream += chunk
                    if tag == "err":
                        splitter.feed(chunk)
                    if len(stream) > P.STREAM_CAP_BYTES:
                        _kill_group(proc)
                        name = "stdout" if tag == "out" else "stderr"
                        failure = Failure(P.OUTPUT_OVERFLOW,
                                          f"hook wrote more than {P.STREAM_CAP_BYTES} bytes on {name}; child killed")
                        open_readers = 0
                        break
            if failure is not None:
                break
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
    splitter.flush()
    returncode = _reap(proc, deadline)
    elapsed = (time.monotonic() - started) * 1000
    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    if failure is None and returncode is None:
        failure = Failure(P.TIMEOUT, f"hook did not exit within {timeout:g}s; its process group was killed")
    if failure is not None:
        return HookResult(False, failure=failure, stderr=stderr, stdout=stdout, elapsed_ms=elapsed, returncode=returncode)
    if returncode != 0:
        label, code, sig = P.classify_exit(returncode)
        tail = stderr.strip()[-500:]
        message = f"{label}" + (f": {tail}" if tail else "")
        return HookResult(False, failure=Failure(P.SCRIPT_ERROR, message, code, sig), stderr=stderr, stdout=stdout,
                          elapsed_ms=elapsed, returncode=returncode)
    try:
        reply = P.parse_output(stdout)
    except P.EmptyOutput as exc:
        return HookResult(False, failure=Failure(P.EMPTY_OUTPUT, str(exc)), stderr=stderr, stdout=stdout,
                          elapsed_ms=elapsed, returncode=0)
    return HookResult(True, reply=reply, stderr=stderr, stdout=stdout, elapsed_ms=elapsed, returncode=0)


def _reap(proc: subprocess.Popen, deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.05, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        return None
