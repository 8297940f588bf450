"""The sandbox applied in two steps by a zygote's spare child (engine/process/warmstart_zygote.py): `pre_enter` ahead
of its call (namespaces, the view's covers, init, the hook's process waiting), the call's part when the call arrives, and
`enter_hook` last. Same namespaces, same view, same limits as engine/process/sandbox_enter.py `enter`, less on the
call's path. Also the per-plugin empty network namespace a zygote keeps (`make_netns`). Stdlib only, like
engine/process/sandbox.py.
"""

from __future__ import annotations

import os
import signal
from typing import NamedTuple

from . import sandbox_seccomp, sandbox_userns
from .sandbox_enter import SandboxSpec, empty_bounding_set, enter_last, unshare
from .sandbox_libc import CLONE_NEWNET, CLONE_NEWUSER, PR_SET_PDEATHSIG, SetupError, check, libc
from .sandbox_mounts import bind_kept, prepare_view, rehearse_binds
from .sandbox_plan import NAMESPACES, view_plan
from .sandbox_tree import SETUP_FAILED, fork_child, open_native_init, split, wait_for


class SpareShape(NamedTuple):
    """What a spare prepares ahead of its call (`shape_of`): a spare fits a call of an equal shape."""

    user_ns: bool  # a user namespace of its own (a service that is not root) ...
    uid: int  # ... mapping the service's uid and gid
    gid: int
    hide: str | None  # $LIBREFANG_HOME, covered
    home_exists: bool
    conceal: tuple  # what else the view covers (engine/process/hook_view.py)
    tmp_mb: int  # the private /tmp and /dev/shm
    launcher: tuple  # the launcher's installation bound back ahead (a warm zygote's), else ()
    mapped: tuple  # a service with subordinate ids: its kept user namespace's maps (engine/process/sandbox_userns.py)
    disks_epoch: int  # the data disks' mounts this spare's view copied (engine/process/data_disks.py)


def shape_of(spec: SandboxSpec, launcher: bool = False) -> SpareShape | None:
    """What `pre_enter` prepares ahead of a call: the same for every call of one service (and one kind of filesystem
    view), so a spare child prepared for the last call fits the next one. With `launcher` (a warm zygote: every call
    has its interpreter), the launcher's installation is bound back ahead too. A service that is not root with
    subordinate ids (`mapped`) has its kept user namespace made here, in the zygote or spawner, so that the spares it
    forks or spawns inherit it. None: nothing to prepare (no namespaces)."""
    if not spec.isolate:
        return None
    if spec.mapped:
        sandbox_userns.kept(spec.mapped, spec.uid, spec.gid)
    return SpareShape(spec.user_ns, spec.uid, spec.gid, spec.hide, bool(spec.hide) and os.path.isdir(spec.hide),
                      tuple(spec.conceal), spec.tmp_mb, tuple(spec.launcher) if launcher else (), spec.mapped,
                      spec.disks_epoch)


def plan_view(shape: SpareShape) -> tuple:
    """The steps of the view a spare prepares for `shape` (engine/process/sandbox_plan.py), looked up by the zygote or
    spawner right before it makes the spare: the same lookups in a fresh fork would cost it a copy of every page of
    the zygote they touch, and the native spare only carries out the steps it is given."""
    return view_plan(shape.hide if shape.home_exists else None, shape.conceal, shape.tmp_mb, shape.launcher)


def absent_at_call(shape: SpareShape) -> str | None:
    """A home that did not exist when the spare covered its view (so it is not covered): a spare whose call finds it
    there must not run the hook."""
    return None if shape.home_exists else shape.hide


def pre_enter(shape: SpareShape, parent_pid: int, sock, await_call, plan: tuple | None = None) -> tuple:
    """In a spare child (already in its own session and cgroup), before its call: everything of `enter` that does
    not depend on the call — the user, mount, PID, IPC and UTS namespaces, the view's call-independent part
    (engine/process/sandbox_mounts.py `prepare_view`), init forked with a fresh /proc, and the hook's own process
    (pid 2) forked too. The spare becomes the keeper at once, init waits for the hook, and the hook waits for its
    call on `sock` (`await_call(sock)` -> (call, fds), the spare's socket to its zygote): then it binds its own
    directories back and enters its network namespace, and this function returns (call, fds) in it (the rest is
    `enter_hook`). On the call's path: no fork, no unshare but the network's, a few mounts.

    The keeper reports the hook's status on `sock` (`done_fd` of `enter`), which the hook closes before any plugin
    code runs. `plan`: `plan_view(shape)`, when the zygote looked it up. Raises SetupError in the spare only
    (nothing forked yet)."""
    lib = libc()
    if lib is None:
        raise SetupError("no libc")
    lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(137)
    unshare(lib, NAMESPACES, shape.user_ns, shape.mapped, shape.uid, shape.gid)
    init_fd = None if shape.user_ns else open_native_init()  # (before the covers hide it; see use_native_init)
    view = prepare_view(lib, plan if plan is not None else plan_view(shape))
    split(lib, init_fd, sock.fileno(), sock.fileno())  # returns in the hook, which keeps the socket for its call
    _capable.append(empty_bounding_set(lib))  # off the call's path (enter_hook), as is building the filter
    program = sandbox_seccomp.compiled()[0]
    _filter.append(sandbox_seccomp.Prepared(program) if program is not None else None)
    _view.append(view)
    call, fds = await_call(sock)  # exits quietly if the spare is dropped first
    try:  # the call's part of the view
        spec = _spec[0] = SandboxSpec.from_dict(call["sandbox"])
        absent = absent_at_call(shape)
        if absent and os.path.isdir(absent):
            raise SetupError(f"{absent} appeared after this sandbox was prepared: not covered")
        bind_kept(lib, view, call.pop("kept", []))
        if spec.new_net:
            if call.get("netns") is not None:  # the plugin's own empty network namespace, kept by the zygote
                netns = fds.pop(call["netns"])
                check(lib.setns(netns, CLONE_NEWNET), "setns(CLONE_NEWNET)")
                os.close(netns)
            else:
                check(lib.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    except Exception as exc:  # noqa: BLE001 - the keeper mirrors the exit status: the hook never ran
        _report_setup_failure(fds, str(exc))
        os._exit(SETUP_FAILED)
    return call, fds


def make_netns(shape: SpareShape | None = None) -> int | None:
    """A descriptor on a new, empty network namespace (loopback down), or None. Made once per plugin by a zygote
    and entered by that plugin's hooks (`pre_enter`) instead of one namespace made and torn down per call: the
    kernel's network namespace cleanup is costly and serialised. Never shared across plugins (abstract unix
    sockets, for one, are per network namespace); a hook has no capability left to change it. A service that is
    not root makes it in its kept user namespace (`shape`'s, engine/process/sandbox_userns.py), where its hooks'
    spares may enter it."""
    lib = libc()
    if lib is None:
        return None
    mapped = shape.mapped if shape is not None and shape.user_ns else ()
    userns = sandbox_userns.kept(mapped, shape.uid, shape.gid) if mapped else None
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = fork_child()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(hold_w)
            joined = userns is None or lib.setns(userns, CLONE_NEWUSER) == 0
            os.write(ready_w, b"1" if joined and lib.unshare(CLONE_NEWNET) == 0 else b"0")
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
        wait_for(pid)
    return fd


def _report_setup_failure(fds: list, message: str) -> None:
    if len(fds) > 2:
        try:
            os.write(fds[2], f"sandbox setup failed in the child: {message}\n".encode("utf-8", "replace"))
        except OSError:
            pass


_capable: list = []  # in a prepared hook's process: whether it has capabilities, its bounding set emptied ahead
_filter: list = []  # ... and its seccomp filter, built ahead (sandbox_seccomp.Prepared)
_view: list = []  # ... and its view (`rehearse`)
_spec: list = [None]  # ... and its call's SandboxSpec, read once


def rehearse() -> None:
    """In a prepared hook's process, ahead of its call: the call's part of the sandbox once, to no effect (the
    zygote's rehearsal of a hook's start, engine/process/warmstart_zygote.py `_rehearse`): the binds' steps, the
    identity calls."""
    lib = libc()
    if lib is None or not _view:
        return
    rehearse_binds(lib, _view[-1])
    os.setresgid(-1, -1, -1)
    os.setresuid(-1, -1, -1)
    os.getresuid()
    os.getresgid()


def enter_hook(call: dict) -> None:
    """In the hook prepared by `pre_enter`, its call arrived: the last part of `enter`."""
    enter_last(libc(), _spec[0] or SandboxSpec.from_dict(call["sandbox"]), _capable[-1] if _capable else None,
                _filter[-1] if _filter else None)

