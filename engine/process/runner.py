"""Run one hook script as a fresh, sandboxed process speaking the JSON stdin/stdout protocol: `PROCESS`, the runtime
(the `Runtime` protocol of engine/process/hook_call.py) of every hook that is not a WebAssembly module.

`ProcessRuntime.run` reads top-down: the script located and its command built (once), the hook's identity and
directories made ready, its environment and sandbox described, then the process started, by the first of: a fork
of the warm zygote of its interpreter (python hooks, engine/process/warmstart.py), an exec by the spawner (every
other hook, and a python hook no zygote can fork now: engine/process/hook_spawner.py, the zygote's loop in exec
mode), or, when neither helper is available (or with LIBREFANG_SPAWNER=0), a spawn by the worker itself with the
sandbox entered as its preexec function (a full fork() of the worker instead of CPython's vfork). The helpers keep a
spare child that has already joined the call's cgroup (joining one is slow on cgroup v1). engine/process/hook_io.py
then talks to the process: one session per call (killed whole on timeout), 1 MiB cap per stream, stderr streamed
line by line to a callback as it arrives.

What the hook gets is described once per call by `sandbox_spec` (an engine.process.sandbox.SandboxSpec, the policy
of docs/security.md) and applied in the child by engine.process.sandbox.enter, whichever way it starts. Where the OS
allows namespaces that is: its own PID namespace and /proc (every process it starts dies with it), a private view of
the filesystem ($LIBREFANG_HOME hidden except the plugin's own directory and data directory; read-only with
allow_filesystem = false), an empty network namespace with allow_network = false, no capabilities, rlimits and a
per-call cgroup with memory and process-count limits (defaults below). PR_SET_PDEATHSIG(SIGKILL) ties the hook to
the thread that spawned it (the engine spawns from long-lived pool threads). Where namespaces are refused, every
call's result carries the `sandbox.degraded` warning (sandbox.degraded_reasons()).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from engine import protocol as P
from engine.filecache import confine, real_path
from engine.home import Home
from engine.process import data_disks, hook_dirs, hook_view, identity, sandbox, warmstart
from engine.process.hook_call import HookCall, HookResult, StderrCallback
from engine.process.hook_io import communicate
from engine.process.runtimes import LauncherNotFound, build_command
from engine.protocol import Failure


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
    if call.data_dir is not None:
        # The service's own home is concealed from hooks (and not theirs to write): theirs is their data directory,
        # where `~` state of registry plugins and launchers' caches (go, deno) land and persist.
        env["HOME"] = str(call.data_dir)
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
# can create one. An explicit max_memory_mb is also an RLIMIT_AS, as before. max_disk_mb sizes the private /tmp and
# /dev/shm (each) and the data directory's own filesystem (engine/process/data_disks.py), and is an RLIMIT_FSIZE
# (the largest file a hook may write anywhere).
DEFAULT_MAX_MEMORY_MB = 1024
DEFAULT_MAX_PROCESSES = 128
DEFAULT_MAX_DISK_MB = 1024
# The keeper (outside) and init (pid 1) of the hook's PID namespace count against the pids cgroup too.
_SANDBOX_OWN_PROCESSES = 2


def filesystem_isolation_available() -> bool:
    """Whether hooks get their own mount namespace (hidden home, read-only view). Probed once per process."""
    return sandbox.mode() is not None


def sandbox_spec(call: HookCall, env: dict[str, str], cgroup_dirs: tuple[str, ...] = (), argv: list[str] | None = None,
                 ids: tuple[int, int] | None = None) -> sandbox.SandboxSpec:
    """The one description of what this call's hook gets (engine/process/sandbox.py applies it; the policy is
    docs/security.md). The call's cgroup is described by its limits (`cgroup_limits`: the zygote or spawner prepares
    it); `cgroup_dirs` is one the worker made itself, for a hook it spawns. `argv`: the command (its launcher is
    bound back when a cover hides it); `ids`: the host identity the hook drops to (`hook_identity`)."""
    mode = sandbox.mode()
    isolate = mode is not None
    home = real_path(call.home_dir or Home.from_env().root)
    own_dirs = [d for d in (call.plugin_dir, call.data_dir, call.venv_dir) if d is not None]
    disk = (call.max_disk_mb or DEFAULT_MAX_DISK_MB) * 1024 * 1024
    rlimits: list[tuple[str, int, int]] = [("RLIMIT_FSIZE", disk, disk)]
    if call.max_memory_mb:
        mem = call.max_memory_mb * 1024 * 1024
        rlimits.append(("RLIMIT_AS", mem, mem))
    if call.max_cpu_secs:
        rlimits.append(("RLIMIT_CPU", call.max_cpu_secs, call.max_cpu_secs + 1))
    if mode in ("userns", "subids"):
        # Inside a user namespace RLIMIT_NPROC counts the hook's own processes (Linux >= 5.14), init included: the
        # process cap holds even where the call's pids cgroup could not be made. In the namespace a service with
        # subordinate ids keeps ("subids"), it counts the plugin's processes of all its calls at once.
        n = (call.max_processes or DEFAULT_MAX_PROCESSES) + 1
        rlimits.append(("RLIMIT_NPROC", n, n))
    covers = hook_view.covers(call.allow_filesystem) if isolate else ()
    new_net = not call.allow_network and sandbox.network_isolation_available()
    launcher = hook_view.launcher_dirs(argv[0] if argv else None, covers) if isolate else []
    resolver = hook_view.resolver_files(covers, not new_net) if isolate else []
    return sandbox.SandboxSpec(
        cwd=str(call.plugin_dir),
        env=env,
        rlimits=tuple(rlimits),
        isolate=isolate,
        user_ns=mode in ("userns", "subids"),
        mapped=sandbox.mapped_ids() if isolate else (),
        new_net=new_net,
        hide=home if home != "/" else None,
        keep=tuple(_path_in_home(d) for d in own_dirs) + tuple(resolver),
        launcher=tuple(launcher),
        read_only=not call.allow_filesystem and isolate,
        writable=tuple(_path_in_home(call.data_dir) for _ in [0] if call.data_dir is not None),
        cgroups=cgroup_dirs,
        cgroup_limits=_cgroup_limits(call) if sandbox.cgroups.available() else (),
        uid=os.getuid(),
        gid=os.getgid(),
        hook_uid=ids[0] if ids and isolate else -1,
        hook_gid=ids[1] if ids and isolate else -1,
        conceal=covers,
        tmp_mb=disk // (1024 * 1024) if isolate else 0,
        seccomp=isolate and sandbox.seccomp_filter() is not None,
        disks_epoch=data_disks.epoch(call.data_dir) if isolate else 0,
    )


def hook_identity(call: HookCall) -> tuple[int, int] | None:
    """The host (uid, gid) this call's hook drops to, or None where it cannot drop (the service is not root and has
    no subordinate ids, or no namespaces: sandbox.degraded says so). Raises ValueError for a `[sandbox]` range over
    the service's uid."""
    if not sandbox.uid_drop():
        return None
    if call.uid is None:
        return identity.hook_ids(call.home_dir, call.plugin_dir.name)
    ids = (call.uid, call.gid if call.gid is not None else call.uid)
    if {0, os.getuid(), os.getgid()} & set(ids):
        raise ValueError(f"a hook may not run as uid/gid {ids}: root's or the service's own")
    return ids


def _path_in_home(path: Path) -> str:
    """The directory's path with its parents resolved but not itself: a plugin dir that is a symlink (a linked dev
    plugin) is bound back where the hook expects it."""
    return os.path.join(real_path(os.path.dirname(os.path.abspath(path))), os.path.basename(path))


def _cgroup_limits(call: HookCall) -> tuple[int, int]:
    """(memory bytes, pids) of the call's cgroup."""
    extra = _SANDBOX_OWN_PROCESSES if sandbox.mode() is not None else 0
    return ((call.max_memory_mb or DEFAULT_MAX_MEMORY_MB) * 1024 * 1024,
            (call.max_processes or DEFAULT_MAX_PROCESSES) + extra)


def _prepare_dirs(call: HookCall, script: Path, ids: tuple[int, int] | None) -> str | None:
    """The hook's directories made ready for its identity (engine/process/hook_dirs.py); what went wrong, or None.
    A service that is not root shares its data directory with the identity's group instead of handing it over."""
    as_owner = sandbox.as_owner if ids is not None and sandbox.mode() == "subids" else None
    private_tmp = not call.allow_filesystem
    if call.data_dir is not None:
        try:
            if as_owner is not None:
                hook_dirs.prepare_shared_data_dir(call.data_dir, ids[1], as_owner, private_tmp=private_tmp)
            else:
                hook_dirs.prepare_data_dir(call.data_dir, ids, private_tmp=private_tmp,
                                           disk_mb=call.max_disk_mb or DEFAULT_MAX_DISK_MB)
        except OSError as exc:
            return f"cannot prepare the plugin's data directory {call.data_dir}: {exc}"
    if ids is not None:
        try:
            hook_dirs.make_readable(call.plugin_dir, script, ids[1], as_owner)
        except OSError as exc:
            return f"cannot make the plugin's directory {call.plugin_dir} readable to its hooks: {exc}"
    return None


class EnterSandbox:
    """The preexec function of a spawned hook: engine/process/sandbox_enter.py `enter`, or exit 126 with the reason on stderr."""

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


class ProcessRuntime:
    """A hook in a fresh process of its own: forked from its zygote, exec'd by the spawner, or spawned by the worker
    (the module's docstring)."""

    name = "process"

    def run(self, call: HookCall, on_stderr: StderrCallback | None = None) -> HookResult:
        """Run the hook once. Never raises for anything the hook does; every failure is classified."""
        started = time.monotonic()

        def fail(kind: str, message: str) -> HookResult:
            return HookResult(False, failure=Failure(kind, message), elapsed_ms=(time.monotonic() - started) * 1000)

        script = locate_script(call)
        if isinstance(script, Failure):
            return fail(script.kind, script.message)
        try:
            argv = hook_argv(call, script)
        except LauncherNotFound as exc:
            return fail(P.LAUNCHER_NOT_FOUND, str(exc))
        try:
            ids = hook_identity(call)
        except ValueError as exc:
            return fail(P.SPAWN_FAILED, str(exc))
        problem = _prepare_dirs(call, script, ids)
        if problem is not None:
            return fail(P.SPAWN_FAILED, problem)
        try:
            payload = (json.dumps(call.request, ensure_ascii=False) + "\n").encode("utf-8")
        except (TypeError, ValueError) as exc:
            return fail(P.INVALID_INPUT, f"request is not JSON-serialisable: {exc}")
        spec = sandbox_spec(call, build_env(call), argv=argv, ids=ids)
        result, oom_killed = self._start(call, argv, spec, payload, started, on_stderr)
        if oom_killed and result.failure is not None:
            result.failure.message = (f"memory limit exceeded ({call.max_memory_mb or DEFAULT_MAX_MEMORY_MB} MB, "
                                      f"the hook's cgroup); {result.failure.message}")
        _label_limits(result, call)
        reasons = sandbox.degraded_reasons()
        if reasons:
            result.warnings.append("sandbox.degraded: " + "; ".join(reasons))
        disk_note = data_disks.note(call.data_dir)
        if disk_note:
            result.warnings.append("data_disk: " + disk_note)
        return result

    def _start(self, call: HookCall, argv: list[str], spec: sandbox.SandboxSpec, payload: bytes, started: float,
               on_stderr: StderrCallback | None) -> tuple[HookResult, bool]:
        """The hook's result, and whether its cgroup's memory limit killed something."""
        def fail(kind: str, message: str) -> tuple[HookResult, bool]:
            return (HookResult(False, failure=Failure(kind, message), elapsed_ms=(time.monotonic() - started) * 1000),
                    False)

        if warmstart.applies(call, argv):
            warm = warmstart.spawn(argv, spec, payload)  # None: no zygote can fork it right now
            if warm is not None:
                rest = payload[warm.stdin_written:]
                return communicate(warm, rest, call.timeout_secs, started, on_stderr), warm.oom_killed  # type: ignore[arg-type]
        problem = _check_executable(argv[0])
        if problem is not None:
            return fail(*problem)
        program = _resolve_program(argv[0], spec)
        if program is not None:
            try:
                proc = warmstart.spawn_exec([program, *argv[1:]], spec, payload)
            except OSError as exc:
                return fail(*_exec_failure(argv[0], exc))
            if proc is not None:
                rest = payload[proc.stdin_written:]
                return communicate(proc, rest, call.timeout_secs, started, on_stderr), proc.oom_killed  # type: ignore[arg-type]
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
                    preexec_fn=EnterSandbox(dataclasses.replace(spec, cgroups=cgroup_dirs)),
                )
            except subprocess.SubprocessError as exc:
                return fail(P.SPAWN_FAILED, f"sandbox setup failed in the child: {exc}")
            except OSError as exc:
                return fail(*_exec_failure(argv[0], exc))
            result = communicate(popen, payload, call.timeout_secs, started, on_stderr)
            return result, bool(cgroup_dirs) and result.failure is not None and sandbox.cgroups.oom_killed(cgroup_dirs)
        finally:
            sandbox.cgroups.release(cgroup_dirs)


PROCESS = ProcessRuntime()


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


def hook_argv(call: HookCall, script: Path) -> list[str]:
    """The command that runs `script`: the runtime's launcher, or the plugin's own venv python when it has one
    (engine/prewarm.py resolves the same command to warm its zygote). Raises LauncherNotFound."""
    argv = build_command(call.runtime, str(script))
    venv_python = _venv_python(call)
    if venv_python is not None:
        argv[0] = venv_python
    return argv


def _venv_python(call: HookCall) -> str | None:
    if call.venv_dir is None or call.runtime.runtime.tag != "python" or call.runtime.custom_launcher:
        return None
    exe = call.venv_dir / "bin" / "python"
    return str(exe) if exe.exists() else None
