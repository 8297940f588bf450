"""Run one hook script as a fresh, sandboxed subprocess speaking the JSON stdin/stdout protocol.

One process group per call (killed whole on timeout), cleared environment, cwd = plugin dir, 1 MiB cap per stream,
stderr streamed line by line to a callback as it arrives.

Sandbox, applied between spawn and the hook's exec:
- PR_SET_PDEATHSIG(SIGKILL): if the worker dies (even SIGKILL), the kernel kills the hook too. Without it hooks,
  being session leaders, would outlive a crashed worker with no timeout. Caveat: the signal follows the *thread*
  that spawned the child; the engine spawns from long-lived pool threads, never from short-lived ones.
- RLIMIT_AS (`max_memory_mb`) and RLIMIT_CPU (`max_cpu_secs`), set before the hook's exec.
- `allow_network = false`: a fresh, empty network namespace (loopback down, nothing reachable) when the OS allows it;
  probed once per process. Proxy variables are blanked either way (LibreFang).
- `allow_filesystem = false`: a private mount namespace with "/" re-bound read-only and only the plugin's data dir
  (which holds TMPDIR) writable; probed once per process. /proc, /sys and /dev keep their modes.

How: by default with util-linux exec wrappers resolved once (`setpriv --pdeathsig KILL -- [prlimit --as= --cpu= --]
[unshare --net --] <hook>`): each execs the next in the same process, so pid, process group and exit status are the
hook's, and CPython keeps spawning with vfork. A preexec function would force a full fork(), whose cost grows with the
worker's memory: measured here with a 150 MB parent, 2.5 ms (vfork) vs 14.4 ms (preexec fork) vs 3.5 ms (setpriv) vs
5.9 ms (setpriv+prlimit+unshare) per bash hook (min of 150). The preexec function (`_Preexec`, same syscalls via
ctypes) is the fallback when a wrapper is missing, and is always used for allow_filesystem = false (mounts).
Python hooks may instead be forked from a warm zygote (engine/warmstart.py), which applies the same sandbox.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import protocol as P
from engine import warmstart
from engine.filecache import confine
from engine.protocol import Failure
from engine.runtimes import LauncherNotFound, ResolvedRuntime, build_command

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
    warm_start: bool = True  # [hooks] warm_start: python hooks may be forked from a zygote (engine/warmstart.py)


@dataclass
class HookResult:
    ok: bool
    reply: Any = None
    failure: Failure | None = None
    stderr: str = ""
    stdout: str = ""
    elapsed_ms: float = 0.0
    returncode: int | None = None

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
    """The hook's environment, in DESIGN.md §4 order; later entries win."""
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

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    return libc


class _Preexec:
    """Runs in the forked child right before exec. Does only the syscalls listed in the module docstring."""

    __slots__ = ("ppid", "mem", "cpu", "newnet", "libc", "writable", "submounts")

    def __init__(self, mem_bytes: int | None, cpu_secs: int | None, newnet: bool,
                 writable: tuple[bytes, ...] | None = None):
        self.ppid = os.getpid()
        self.mem = mem_bytes
        self.cpu = cpu_secs
        self.newnet = newnet
        self.libc = _libc()
        self.writable = writable  # not None: read-only filesystem except these directories
        self.submounts = _submounts_to_protect(writable) if writable is not None else ()

    def __call__(self) -> None:
        if self.libc is not None:
            self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != self.ppid:  # the worker died between fork and prctl
                os._exit(137)
        if self.mem:
            resource.setrlimit(resource.RLIMIT_AS, (self.mem, self.mem))
        if self.cpu:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu, self.cpu + 1))
        if self.newnet and self.libc is not None and self.libc.unshare(_CLONE_NEWNET) != 0:
            os._exit(126)  # never run a network-denied hook with the network
        if self.writable is not None and self.libc is not None:
            # allow_filesystem = false: a private mount namespace whose root is a read-only bind of "/", with the
            # writable directories bound (read-write) underneath it first.
            mount = self.libc.mount
            if self.libc.unshare(_CLONE_NEWNS) != 0 or mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
                os._exit(126)
            for path in self.writable:
                if mount(path, path, None, _MS_BIND | _MS_REC, None) != 0:
                    os._exit(126)
            if mount(b"/", b"/", None, _MS_BIND | _MS_REC, None) != 0 or \
                    mount(None, b"/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None) != 0:
                os._exit(126)
            for path in self.submounts:  # e.g. a tmpfs /tmp: read-only too (best effort: it may be gone)
                mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None)


_netns_lock = threading.Lock()
_netns_state: list[bool] = []


def network_isolation_available() -> bool:
    """Whether this process may give hooks an empty network namespace. Probed once per process."""
    if _netns_state:
        return _netns_state[0]
    with _netns_lock:
        if not _netns_state:
            _netns_state.append(_probe_netns())
    return _netns_state[0]


_fsns_state: list[bool] = []


def filesystem_isolation_available() -> bool:
    """Whether hooks can get a read-only view of the filesystem (a private mount namespace). Probed once."""
    if _fsns_state:
        return _fsns_state[0]
    with _netns_lock:
        if not _fsns_state:
            ok = False
            if sys.platform.startswith("linux") and _libc() is not None:
                try:
                    proc = subprocess.run(["/bin/sh", "-c", "exit 0"], close_fds=True, timeout=10,
                                          capture_output=True, preexec_fn=_Preexec(None, None, False, ()))
                    ok = proc.returncode == 0
                except (OSError, subprocess.SubprocessError):
                    ok = False
            _fsns_state.append(ok)
    return _fsns_state[0]


_KEEP_MODE_UNDER = (b"/proc", b"/sys", b"/dev")


def _submounts_to_protect(writable: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """Mount points (other than "/") to make read-only too: everything but /proc, /sys, /dev and the writable dirs.
    Read in the parent, before fork."""
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return ()
    out = []
    for line in lines:
        fields = line.split(b" ")
        if len(fields) < 5:
            continue
        mp = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
        if mp == b"/" or any(mp == k or mp.startswith(k + b"/") for k in _KEEP_MODE_UNDER):
            continue
        if any(mp == w or mp.startswith(w + b"/") for w in writable):
            continue
        out.append(mp)
    return tuple(dict.fromkeys(out))


def _writable_dirs(call: HookCall) -> tuple[bytes, ...] | None:
    if call.allow_filesystem or not filesystem_isolation_available():
        return None
    dirs = []
    if call.data_dir is not None:
        dirs.append(os.fsencode(os.path.realpath(call.data_dir)))
    return tuple(dirs)


def _probe_netns() -> bool:
    if not sys.platform.startswith("linux") or _libc() is None:
        return False
    try:
        proc = subprocess.run(["/bin/sh", "-c", "exit 0"], preexec_fn=_Preexec(None, None, True),
                              close_fds=True, timeout=10, capture_output=True)
        return proc.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


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
    newnet = not call.allow_network and network_isolation_available()
    mem = call.max_memory_mb * 1024 * 1024 if call.max_memory_mb else None
    # ---- warm start (engine/warmstart.py, owned by the speed work): python hooks forked from a zygote ----------
    writable = _writable_dirs(call)
    if writable is None and warmstart.applies(call, argv):  # (read-only filesystem hooks always spawn cold)
        warm = warmstart.spawn(argv, str(call.plugin_dir), build_env(call), mem, call.max_cpu_secs, newnet)
        if warm is not None:  # None: no zygote for this interpreter right now; spawn normally below
            result = _communicate(warm, payload, call.timeout_secs, started, on_stderr)  # type: ignore[arg-type]
            _label_limits(result, call)
            return result
    # ---- end of warm start -------------------------------------------------------------------------------------
    try:
        problem = _check_executable(argv[0])
        if problem is not None:
            return fail(*problem)
        wrapped = _wrap(argv, mem, call.max_cpu_secs, newnet) if writable is None else None
        proc = subprocess.Popen(
            wrapped or argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(call.plugin_dir),
            env=build_env(call),
            start_new_session=True,  # own process group: a timeout kills grandchildren too
            close_fds=True,
            # exec wrappers keep CPython on vfork; a preexec function forces a full fork (see the module docstring)
            preexec_fn=None if wrapped else _Preexec(mem, call.max_cpu_secs, newnet, writable),
        )
    except subprocess.SubprocessError as exc:
        return fail(P.SPAWN_FAILED, f"sandbox setup failed in the child: {exc}")
    except FileNotFoundError as exc:
        return fail(P.LAUNCHER_NOT_FOUND, f"cannot execute {argv[0]!r}: {exc.strerror}")
    except PermissionError as exc:
        return fail(P.SPAWN_FAILED, f"cannot execute {argv[0]!r}: {exc.strerror} (is the exec bit set?)")
    except OSError as exc:
        return fail(P.SPAWN_FAILED, f"cannot start hook: {exc}")
    result = _communicate(proc, payload, call.timeout_secs, started, on_stderr)
    _label_limits(result, call)
    return result


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


@functools.lru_cache(maxsize=1)
def _wrapper_tools() -> dict[str, str] | None:
    """util-linux's setpriv (PDEATHSIG), prlimit (rlimits) and unshare (network namespace), resolved once, each
    proven to work here. None: spawn with the preexec function instead."""
    if not sys.platform.startswith("linux") or os.environ.get("LIBREFANG_SANDBOX_WRAPPERS") == "0":
        return None
    found = {name: shutil.which(name) for name in ("setpriv", "prlimit", "unshare")}
    if not found["setpriv"] or not _runs([found["setpriv"], "--pdeathsig", "KILL", "--", "/bin/sh", "-c", "exit 0"]):
        return None
    tools = {"setpriv": os.path.realpath(found["setpriv"])}
    if found["prlimit"] and _runs([found["prlimit"], "--cpu=3600:3601", "--", "/bin/sh", "-c", "exit 0"]):
        tools["prlimit"] = os.path.realpath(found["prlimit"])
    if found["unshare"] and _runs([found["unshare"], "--net", "--", "/bin/sh", "-c", "exit 0"]):
        tools["unshare"] = os.path.realpath(found["unshare"])
    return tools


def _runs(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10, close_fds=True).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _wrap(argv: list[str], mem: int | None, cpu: int | None, newnet: bool) -> list[str] | None:
    """argv behind exec wrappers that set PDEATHSIG, the rlimits and the network namespace, then exec the hook
    (same pid, same exit status). None when a needed tool is missing: the caller uses the preexec function."""
    tools = _wrapper_tools()
    if tools is None or ((mem or cpu) and "prlimit" not in tools) or (newnet and "unshare" not in tools):
        return None
    out = [tools["setpriv"], "--pdeathsig", "KILL", "--"]
    if mem or cpu:
        out += [tools["prlimit"], *([f"--as={mem}"] if mem else []), *([f"--cpu={cpu}:{cpu + 1}"] if cpu else []),
                "--"]
    if newnet:
        out += [tools["unshare"], "--net", "--"]
    return out + argv


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
