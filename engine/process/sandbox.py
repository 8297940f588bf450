"""What a hook gets, described once (`SandboxSpec`), and the one function that applies it in the child (`enter`).

Every spawn path applies the same description: the warm-start zygote calls `enter` in its forked child right before
running the script, the cold-hook spawner right before exec'ing the hook (engine/process/warmstart_zygote.py and
engine/process/hook_spawner.py receive the spec as JSON and load this file by path), and the worker itself, as a preexec
function, when neither is available (engine/process/runner.py). So this module is stdlib only, imports nothing from the
engine and runs on any CPython >= 3.9.

Where the OS allows namespaces (root, or an unprivileged user namespace), `enter` gives every hook:
- its own PID namespace with a fresh /proc: it sees no service process. The child that called `enter` stays outside
  as a *keeper* the caller waits on; inside, a tiny init (pid 1) runs the hook (pid 2) and reaps orphans. When the
  hook ends, init ends with its exit status, and the kernel kills everything left in the namespace: detached,
  double-forked or pipe-holding descendants cannot outlive the call. When the keeper is killed (timeout), init gets
  PDEATHSIG and the namespace dies the same way. The keeper mirrors the hook's exit status (signal included).
- a private mount namespace: `$LIBREFANG_HOME` is covered by an empty read-only tmpfs, and only the plugin's own
  directory and its data directory are bound back at the same paths; /sys and /proc/sys are read-only (the hook's
  cgroup limits stay where they are); with `allow_filesystem = false` every other mount is read-only too, except
  the writable directories (the data dir).
- an empty network namespace when `allow_network = false`.
- no capabilities and no_new_privs (root hooks cannot undo the mounts; a user namespace's powers end at exec anyway).
- rlimits (RLIMIT_AS, RLIMIT_CPU, and RLIMIT_NPROC inside a user namespace, where it counts only the hook's own
  processes) and, where a writable cgroup is available, a per-call cgroup with memory and pids limits (the caller
  creates it with `Cgroups.create`; `enter` moves the hook in before anything else), or one the zygote's spare
  child joined ahead of its call (`Cgroups.prepare`, then `Cgroups.limit` when the call arrives).

A zygote's spare child may also apply it in two steps, `pre_enter` ahead of its call and the rest when the call
arrives (then the hook may enter its plugin's kept network namespace, `make_netns`, instead of a new one): same
namespaces, same view, same limits, less on the call's path.

Where namespaces are refused, `probe()` says why once per process (`degraded_reasons()`); hooks still run with
rlimits, PDEATHSIG and their own process group, and every affected call is labelled by the caller.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import sys
import threading
from dataclasses import asdict, dataclass, field


def _sibling(name: str):
    """A sibling module: imported from the engine.process package, or loaded by path like this file when this file
    was (the zygote and the spawner import nothing from the engine package)."""
    if __package__:
        import importlib

        return importlib.import_module(f"{__package__}.{name}")
    key = f"librefang_{name}"
    if key not in sys.modules:
        from importlib.util import module_from_spec, spec_from_file_location

        found = spec_from_file_location(key, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        module = module_from_spec(found)
        sys.modules[key] = module
        found.loader.exec_module(module)
    return sys.modules[key]


_tree = _sibling("sandbox_tree")  # the keeper/init/hook processes
_cgroups = _sibling("sandbox_cgroups")
_fork, _keep, _init, _wait_for = _tree._fork, _tree._keep, _tree._init, _tree._wait_for
Cgroups, cgroups, _oom_killed = _cgroups.Cgroups, _cgroups.cgroups, _cgroups._oom_killed
_unescape = _cgroups.unescape_mountinfo

# linux/sched.h, linux/mount.h, linux/prctl.h, linux/capability.h
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
_CAP_VERSION_3 = 0x20080522
_LOCKED_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                   "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
# Exit status of a child whose sandbox could not be applied (as a failing preexec function: the hook never ran).
SETUP_FAILED = 126


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a hook gets besides its argv. JSON-serialisable (the zygote receives it over a socket)."""

    cwd: str
    env: dict = field(default_factory=dict)
    rlimits: tuple = ()  # ((name, soft, hard), ...) with name an attribute of `resource`, e.g. "RLIMIT_AS"
    isolate: bool = False  # own PID + mount namespace, fresh /proc, home hidden, no capabilities
    user_ns: bool = False  # create a user namespace first (the service is not root)
    new_net: bool = False  # empty network namespace (allow_network = false)
    hide: str | None = None  # $LIBREFANG_HOME (real path): covered by an empty tmpfs ...
    keep: tuple = ()  # ... except these directories, bound back at the same paths (plugin dir, data dir)
    read_only: bool = False  # allow_filesystem = false: every mount read-only ...
    writable: tuple = ()  # ... except these directories
    cgroups: tuple = ()  # cgroup directories to join (made by `Cgroups.create`)
    cgroup_limits: tuple = ()  # (memory bytes, pids) of the call's cgroup, for a spawner that prepares it itself
    uid: int = 0  # the service's uid/gid, mapped to themselves in a user namespace
    gid: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> SandboxSpec:
        tuples = {"rlimits", "keep", "writable", "cgroups", "cgroup_limits"}
        return cls(**{k: (tuple(tuple(x) if isinstance(x, list) else x for x in v) if k in tuples else v)
                      for k, v in data.items()})


class SetupError(Exception):
    pass


_libc_handle: list = []


def libc():
    if not _libc_handle:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
            lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        except (OSError, AttributeError):
            lib = None
        _libc_handle.append(lib)
    return _libc_handle[0]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(lib, source, target, fstype, flags, data=None) -> None:
    def enc(value):
        return None if value is None else os.fsencode(value)

    _check(lib.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


# ---- in the child ---------------------------------------------------------------------------------------------

def enter(spec: SandboxSpec, parent_pid: int, done_fd: int | None = None) -> None:
    """Apply `spec` in a freshly forked child whose parent is `parent_pid`. Returns in the process that must become
    the hook (exec it, or run the script); never returns in the keeper or init. Raises SetupError when something
    cannot be applied: the caller must then exit without running the hook.

    `done_fd` (a pipe to the spawner): the keeper writes the hook's 4-byte wait status there as soon as the namespace
    is empty, before its own exit tears the namespaces down, so the spawner can answer early. The hook never holds
    it."""
    lib = libc()
    if lib is not None:
        lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died between fork and prctl
            os._exit(137)
    for path in spec.cgroups:  # first, so that every process of the call is counted
        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
            fh.write("0")
    if spec.isolate:
        if lib is None:
            raise SetupError("no libc")
        flags = CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWNET if spec.new_net else 0)
        _check(lib.unshare(flags | (CLONE_NEWUSER if spec.user_ns else 0)), "unshare")
        if spec.user_ns:
            _map_ids(spec.uid, spec.gid)
        _build_view(lib, spec)
        _split_keeper_init_hook(lib, done_fd)  # returns in the hook only
    elif spec.new_net:
        if lib is None:
            raise SetupError("no libc")
        _check(lib.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")  # never run a network-denied hook with network
    if done_fd is not None and not spec.isolate:
        os.close(done_fd)  # the hook must not be able to report a status of its own (closed above when isolated)
    _enter_last(lib, spec)


def _enter_last(lib, spec: SandboxSpec) -> None:
    """What the hook's own process applies last, whichever way it got its namespaces."""
    for name, soft, hard in spec.rlimits:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if lib is not None:
        _drop_privileges(lib)
    os.chdir(spec.cwd)  # after the mounts: a cwd taken before would still reach the hidden home through ".."


# ---- the same, in two steps: a spare child enters the namespaces before its call ---------------------------------

def shape_of(spec: SandboxSpec) -> tuple | None:
    """What `pre_enter` prepares ahead of a call: the same for every call of one service, so a spare child prepared
    for the last call fits the next one. None: nothing to prepare (no namespaces)."""
    if not spec.isolate:
        return None
    return spec.user_ns, spec.uid, spec.gid, spec.hide, bool(spec.hide) and os.path.isdir(spec.hide)


def pre_enter(shape: tuple, parent_pid: int, sock, await_call) -> tuple:
    """In a spare child (already in its own session and cgroup), before its call: everything of `enter` that does
    not depend on the call — the user, mount and PID namespaces, the home covered by an empty tmpfs, /sys
    read-only, init forked with a fresh /proc, and the hook's own process (pid 2) forked too. The spare becomes the
    keeper at once, init waits for the hook, and the hook waits for its call on `sock` (`await_call(sock)` ->
    (call, fds), the spare's socket to its zygote): then it binds its own directories back, makes the view read-only
    if asked and enters an empty network namespace, and this function returns (call, fds) in it (the rest is
    `enter_hook`). On the call's path: no fork, no unshare but the network's, a few mounts.

    The keeper reports the hook's status on `sock` (`done_fd` of `enter`), which the hook closes before any plugin
    code runs. Raises SetupError in the spare only (nothing forked yet)."""
    user_ns, uid, gid, hide, home_exists = shape
    lib = libc()
    if lib is None:
        raise SetupError("no libc")
    lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(137)
    _check(lib.unshare(CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWUSER if user_ns else 0)), "unshare")
    if user_ns:
        _map_ids(uid, gid)
    _mount(lib, None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here reaches the service's mounts
    home_fd = None
    if home_exists:
        # The home as it is under the tmpfs, in this mount namespace: the call's directories are bound from here
        # (a bind's source must be a mount of the caller's own namespace, so not a descriptor opened outside).
        home_fd = os.open(hide, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        _mount(lib, "tmpfs", hide, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
    _read_only_mounts(lib, False, (), sys_only=True)
    status_r, status_w = os.pipe()
    lib.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # see _split_keeper_init_hook
    init_pid = _fork()
    if init_pid:
        os.close(status_w)
        _keep(init_pid, status_r, sock.fileno())
    os.close(status_r)
    try:
        _become_init(lib, status_w)
    except BaseException:  # noqa: BLE001 - no hook: the keeper reports init's failure when the call comes
        os._exit(SETUP_FAILED)
    hook_pid = _fork()
    if hook_pid:
        _init(hook_pid, status_w, sock.fileno())
    os.close(status_w)
    call, fds = await_call(sock)  # exits quietly if the spare is dropped first
    try:  # the call's part of the view
        spec = SandboxSpec.from_dict(call["sandbox"])
        if home_fd is None and spec.hide and os.path.isdir(spec.hide):
            raise SetupError(f"{spec.hide} appeared after this sandbox was prepared: not covered")
        if home_fd is not None:
            kept = []
            for path, real in call.pop("kept", []):
                if _under(real, hide):  # reached through the covered home, as `enter` opens it before covering
                    fd = os.open(os.path.relpath(real, hide), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC,
                                 dir_fd=home_fd)
                else:  # a linked plugin directory outside the home
                    fd = os.open(real, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                kept.append((path, fd))
            os.close(home_fd)
            _bind_back(lib, hide, kept)
        if spec.read_only:  # (/sys is read-only already)
            _read_only_mounts(lib, spec.read_only, spec.writable, sys_only=False)
        if spec.new_net:
            if call.get("netns") is not None:  # the plugin's own empty network namespace, kept by the zygote
                netns = fds.pop(call["netns"])
                _check(lib.setns(netns, CLONE_NEWNET), "setns(CLONE_NEWNET)")
                os.close(netns)
            else:
                _check(lib.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    except Exception as exc:  # noqa: BLE001 - the keeper mirrors the exit status: the hook never ran
        _report_setup_failure(fds, str(exc))
        os._exit(SETUP_FAILED)
    lib.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    return call, fds


def make_netns() -> int | None:
    """A descriptor on a new, empty network namespace (loopback down), or None. Made once per plugin by a zygote
    and entered by that plugin's hooks (`pre_enter`) instead of one namespace made and torn down per call: the
    kernel's network namespace cleanup is costly and serialised. Never shared across plugins (abstract unix
    sockets, for one, are per network namespace); a hook has no capability left to change it."""
    lib = libc()
    if lib is None:
        return None
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = _fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(hold_w)
            os.write(ready_w, b"1" if lib.unshare(CLONE_NEWNET) == 0 else b"0")
            os.read(hold_r, 1)  # until the parent has opened it (or died)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    fd = None
    try:
        if os.read(ready_r, 1) == b"1":
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        fd = None
    finally:
        os.close(ready_r)
        os.close(hold_w)
        _wait_for(pid)
    return fd


def _report_setup_failure(fds: list, message: str) -> None:
    if len(fds) > 2:
        try:
            os.write(fds[2], f"sandbox setup failed in the child: {message}\n".encode("utf-8", "replace"))
        except OSError:
            pass


def kept_dirs(spec: SandboxSpec) -> list:
    """[path, real path] of the directories a prepared init binds back into the covered home: what `open_kept`
    would open, resolved where the home is still visible."""
    if not (spec.hide and os.path.isdir(spec.hide)):
        return []
    return [[path, os.path.realpath(path)] for path in spec.keep if _under(path, spec.hide) and os.path.isdir(path)]


def enter_hook(call: dict) -> None:
    """In the hook prepared by `pre_enter`, its call arrived: the last part of `enter`."""
    _enter_last(libc(), SandboxSpec.from_dict(call["sandbox"]))


def _map_ids(uid: int, gid: int) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)


def open_kept(spec: SandboxSpec) -> list:
    """(path, O_PATH descriptor) of the directories bound back into the covered home, opened while the home is
    still visible."""
    if not (spec.hide and os.path.isdir(spec.hide)):
        return []
    return [(path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            for path in spec.keep if _under(path, spec.hide) and os.path.isdir(path)]


def _build_view(lib, spec: SandboxSpec) -> None:
    _mount(lib, None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here reaches the service's mounts
    if spec.hide and os.path.isdir(spec.hide):
        kept = open_kept(spec)  # held open across the tmpfs, then bound back from the descriptor
        _mount(lib, "tmpfs", spec.hide, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        _bind_back(lib, spec.hide, kept)
    _read_only_mounts(lib, spec.read_only, spec.writable, sys_only=False)


def _bind_back(lib, hide: str, kept: list) -> None:
    """Bind the kept directories into the tmpfs covering `hide`, then make that tmpfs read-only."""
    for path, fd in kept:
        os.makedirs(path, exist_ok=True)
        _mount(lib, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    _mount(lib, None, hide, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _read_only_mounts(lib, read_only: bool, writable: tuple, sys_only: bool) -> None:
    """/sys read-only; with `read_only` every other mount too, except the `writable` directories."""
    if read_only and not sys_only:
        for path in writable:  # own mounts, so that they stay writable when everything else is not
            if os.path.isdir(path):
                _mount(lib, path, path, None, MS_BIND | MS_REC)
    for mountpoint, options in _mounts():
        if _under(mountpoint, "/proc") or _under(mountpoint, "/dev"):
            continue
        if not _under(mountpoint, "/sys"):
            if sys_only or not read_only or any(_under(mountpoint, w) for w in writable):
                continue
        if "ro" in options:
            continue
        locked = sum(flag for name, flag in _LOCKED_OPTIONS.items() if name in options)
        # Best effort per mount (one may be gone or refuse); "/" and /sys themselves must succeed.
        rc = lib.mount(None, os.fsencode(mountpoint), None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked, None)
        if rc != 0 and mountpoint in ("/", "/sys"):
            _check(rc, f"read-only {mountpoint}")


def _split_keeper_init_hook(lib, done_fd: int | None) -> None:
    """keeper (this process, outside) -> init (pid 1 of the new PID namespace) -> hook (pid 2). Returns in the hook."""
    status_r, status_w = os.pipe()
    # Keeper and init are forks of the service (or zygote) and keep its environment in memory: not dumpable, so the
    # hook (same uid, no capabilities) cannot read /proc/1/environ or attach to them.
    lib.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    init_pid = _fork()
    if init_pid:
        os.close(status_w)
        _keep(init_pid, status_r, done_fd)
    os.close(status_r)
    _become_init(lib, status_w)
    hook_pid = _fork()
    if hook_pid:
        _init(hook_pid, status_w)
    os.close(status_w)
    if done_fd is not None:
        os.close(done_fd)
    lib.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the hook itself is an ordinary process (exec resets it anyway)


def _become_init(lib, status_w: int) -> None:
    """In init, before it forks the hook: tied to the keeper, and a fresh /proc of its namespace."""
    lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    poller = select.poll()
    poller.register(status_w, select.POLLOUT)
    if any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0)):
        os._exit(137)  # the keeper died before PDEATHSIG was set: no reader left on the status pipe
    try:
        _mount(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SetupError:
        # A kernel may refuse a new proc inside a user namespace (masked /proc in containers): then no /proc at
        # all rather than the service's.
        _mount(lib, "tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k")
    else:
        _mount(lib, "/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
        lib.mount(None, b"/proc/sys", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  None)


def _drop_privileges(lib) -> None:
    """No capabilities now or after exec (bounding set emptied), and no setuid gains."""
    lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if not _has_capabilities():
        return
    for cap in range(64):
        if lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last cap
            break
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(lib.capset(header, data), "capset")


def _has_capabilities() -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16) != 0
    except OSError:
        pass
    return os.geteuid() == 0


def _mounts() -> list:
    with open("/proc/self/mountinfo", "rb") as fh:
        lines = fh.read().splitlines()
    out = []
    for line in lines:
        fields = line.split(b" ")
        if len(fields) < 6:
            continue
        point = _unescape(fields[4]).decode("utf-8", "surrogateescape")
        out.append((point, set(fields[5].decode().split(","))))
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


# ---- in the service: what this OS allows, probed once -----------------------------------------------------------

_probe_lock = threading.Lock()
_probed: list = []  # [(mode, reasons)]: mode "root", "userns" or None (degraded)


def probe() -> tuple:
    """("root" | "userns" | None, reasons): how hooks are isolated here. Runs a real child once per process."""
    if _probed:
        return _probed[0]
    with _probe_lock:
        if not _probed:
            _probed.append(_probe())
    return _probed[0]


def _probe() -> tuple:
    if not sys.platform.startswith("linux"):
        return None, [f"no namespaces on {sys.platform}: hooks can see the service's files and processes"]
    if os.environ.get("LIBREFANG_SANDBOX_NAMESPACES", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, ["namespaces disabled by LIBREFANG_SANDBOX_NAMESPACES=0: hooks can see the service's files "
                      "and processes, and processes they detach outlive them"]
    if libc() is None:
        return None, ["libc cannot be loaded: no namespaces"]
    problems = []
    attempts = [("root", False)] if os.geteuid() == 0 else []
    attempts.append(("userns", True))
    for mode, user_ns in attempts:
        error = _try(SandboxSpec(cwd="/", isolate=True, user_ns=user_ns, uid=os.getuid(), gid=os.getgid()))
        if error is None:
            return mode, []
        problems.append(f"{'user namespace' if user_ns else 'namespaces'}: {error}")
    return None, ["this OS refuses namespaces to the service (" + "; ".join(problems) + "): hooks can see the "
                  "service's files and processes, and processes they detach outlive them"]


def _try(spec: SandboxSpec) -> str | None:
    """Run `/bin/sh -c 'exit 7'` inside `spec`; None if it ran there, else why not."""
    import subprocess

    parent = os.getpid()

    def child() -> None:
        try:
            enter(spec, parent)
        except BaseException as exc:  # noqa: BLE001 - reported through the exit status and stderr
            os.write(2, str(exc).encode())
            os._exit(SETUP_FAILED)

    try:
        proc = subprocess.run(["/bin/sh", "-c", "exit 7"], preexec_fn=child, capture_output=True, timeout=10,
                              close_fds=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if proc.returncode == 7:
        return None
    return proc.stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"


def forget_probe() -> None:
    """Probe again on next use (tests that switch LIBREFANG_SANDBOX_NAMESPACES)."""
    with _probe_lock:
        _probed.clear()
        _net_state.clear()


def mode() -> str | None:
    return probe()[0]


def degraded_reasons() -> list:
    """Why hooks run without namespaces here ([] when they are isolated). For the doctor and a dashboard banner."""
    return list(probe()[1])


def network_isolation_available() -> bool:
    """Whether hooks can get an empty network namespace (within their own namespaces, or alone)."""
    if mode() is not None:
        return True
    return _net_only()


_net_state: list = []


def _net_only() -> bool:
    if not _net_state:
        with _probe_lock:
            if not _net_state:
                _net_state.append(sys.platform.startswith("linux") and libc() is not None
                                  and _try(SandboxSpec(cwd="/", new_net=True)) is None)
    return _net_state[0]
