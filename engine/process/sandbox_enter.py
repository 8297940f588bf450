"""The hook's sandbox, described once (`SandboxSpec`), and the one function that applies it in a freshly forked child
(`enter`): cgroup, namespaces, the view of the filesystem, the keeper/init/hook tree, rlimits, the hook's own
unprivileged identity, capabilities, the seccomp filter, cwd. engine/process/sandbox.py says what a hook gets and who
calls this; engine/process/sandbox_spare.py applies the same in two steps. Stdlib only, like engine/process/sandbox.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
from dataclasses import asdict, dataclass, field

from . import sandbox_seccomp, sandbox_userns
from .sandbox_libc import (
    CLONE_NEWNET,
    CLONE_NEWUSER,
    PR_CAPBSET_DROP,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    SetupError,
    check,
    libc,
)
from .sandbox_mounts import bind_kept, prepare_view
from .sandbox_plan import NAMESPACES, kept_dirs, view_plan
from .sandbox_tree import open_native_init, split

_CAP_VERSION_3 = 0x20080522


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a hook gets besides its argv. JSON-serialisable (the zygote receives it over a socket)."""

    cwd: str
    env: dict = field(default_factory=dict)
    rlimits: tuple = ()  # ((name, soft, hard), ...) with name an attribute of `resource`, e.g. "RLIMIT_AS"
    isolate: bool = False  # own PID + mount namespace, fresh /proc, home hidden, no capabilities
    user_ns: bool = False  # create a user namespace first (the service is not root)
    mapped: tuple = ()  # ... or join the kept one of its subordinate ids (engine/process/sandbox_userns.py)
    new_net: bool = False  # empty network namespace (allow_network = false)
    hide: str | None = None  # $LIBREFANG_HOME (real path): covered by an empty tmpfs ...
    keep: tuple = ()  # ... except these, bound back at the same paths (plugin dir, data dir), read-only ...
    read_only: bool = False  # allow_filesystem = false (what it conceals more is in `conceal`)
    writable: tuple = ()  # ... but these (the data dir)
    launcher: tuple = ()  # the launcher's installation under a cover, bound back read-only (real paths)
    cgroups: tuple = ()  # cgroup directories to join (made by `Cgroups.create`)
    cgroup_limits: tuple = ()  # (memory bytes, pids) of the call's cgroup, for a spawner that prepares it itself
    uid: int = 0  # the service's uid/gid, mapped to themselves in a user namespace
    gid: int = 0
    hook_uid: int = -1  # the unprivileged host identity the hook drops to (engine/process/identity.py); -1: none
    hook_gid: int = -1
    conceal: tuple = ()  # directories and files covered (engine/process/sandbox_mounts.py), beyond the home
    tmp_mb: int = 0  # size of the private /tmp and /dev/shm (0: none)
    seccomp: bool = False  # load the seccomp filter (engine/process/sandbox_seccomp.py) last
    # The plugins' data disks as mounted for this call (engine/process/data_disks.py `epoch`): a spare whose mount
    # namespace was copied before a data disk was mounted has not got it, and must not serve the call.
    disks_epoch: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> SandboxSpec:
        tuples = {"rlimits", "keep", "writable", "launcher", "cgroups", "cgroup_limits", "conceal", "mapped"}
        return cls(**{k: (tuple(tuple(x) if isinstance(x, list) else x for x in v) if k in tuples else v)
                      for k, v in data.items()})


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
        kept = kept_dirs(spec)  # resolved while everything is visible
        init_fd = None if spec.user_ns else open_native_init()  # (a warm zygote's) before the covers hide it
        flags = NAMESPACES | (CLONE_NEWNET if spec.new_net else 0)
        unshare(lib, flags, spec.user_ns, spec.mapped, spec.uid, spec.gid)
        view = prepare_view(lib, view_plan(spec.hide, spec.conceal, spec.tmp_mb))
        bind_kept(lib, view, kept)
        split(lib, init_fd, done_fd)  # returns in the hook only
    elif spec.new_net:
        if lib is None:
            raise SetupError("no libc")
        check(lib.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")  # never run a network-denied hook with network
    if done_fd is not None and not spec.isolate:
        os.close(done_fd)  # the hook must not be able to report a status of its own (closed above when isolated)
    enter_last(lib, spec)


def enter_last(lib, spec: SandboxSpec, capable: bool | None = None, prepared=None) -> None:
    """What the hook's own process applies last, whichever way it got its namespaces: rlimits, its own host identity
    (before anything it runs), no capabilities, no_new_privs, the seccomp filter, its cwd. `capable`: what
    `empty_bounding_set` said in this process ahead of its call (None: not done); `prepared`: the filter built ahead
    (sandbox_seccomp.Prepared)."""
    for name, soft, hard in spec.rlimits:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if lib is not None and capable is None:
        capable = empty_bounding_set(lib)  # while this process may still (CAP_SETPCAP)
    if spec.hook_uid >= 0:
        become(spec.hook_uid, spec.hook_gid)
    if lib is not None:
        _drop_privileges(lib, capable)
        if spec.seccomp:
            _load_seccomp(lib, prepared)
    os.chdir(spec.cwd)  # after the mounts: a cwd taken before would still reach the hidden home through ".."


def become(uid: int, gid: int) -> None:
    """Drop to `uid`/`gid` for good (real, effective and saved, no supplementary groups): the capabilities of a root
    process go with it. Raises OSError (the hook must not run then)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise SetupError(f"could not drop to uid {uid}")


def _load_seccomp(lib, prepared=None) -> None:
    if prepared is None:
        prepared, why = sandbox_seccomp.compiled()
        if prepared is None:
            raise SetupError(f"no seccomp filter: {why}")
    check(sandbox_seccomp.load(lib, prepared), "seccomp")


def unshare(lib, flags: int, user_ns: bool, mapped: tuple, uid: int, gid: int) -> None:
    """The namespaces of `flags`, in a user namespace when `user_ns` (the service is not root): the service's kept
    one when `mapped` (its subordinate ids: the hook drops to its plugin's), else a new one mapping its own ids."""
    if mapped:
        sandbox_userns.enter(lib, mapped, uid, gid)
        check(lib.unshare(flags), "unshare")
        return
    check(lib.unshare(flags | (CLONE_NEWUSER if user_ns else 0)), "unshare")
    if user_ns:
        _map_ids(uid, gid)


def _map_ids(uid: int, gid: int) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)


def _drop_privileges(lib, capable: bool | None = None) -> None:
    """No capabilities now or after exec (bounding set emptied), and no setuid gains. With `capable` (from
    `empty_bounding_set`, ahead of the call) the bounding set is empty already."""
    lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if capable is None:
        capable = empty_bounding_set(lib)
    if not capable:
        return
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    check(lib.capset(header, data), "capset")


def empty_bounding_set(lib) -> bool:
    """Whether this process has capabilities; if so, its bounding set emptied (what any exec may gain: the
    capabilities it has now stay until `_drop_privileges`). A prepared hook does this before its call, off its
    path."""
    if not _has_capabilities():
        return False
    for cap in range(64):
        if lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last cap
            break
    return True


def _has_capabilities() -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16) != 0
    except OSError:
        pass
    return os.geteuid() == 0

