"""The keeper/init/hook process tree of a sandboxed call (`split`: engine/process/sandbox_enter.py `enter` builds it,
engine/process/sandbox_spare.py `pre_enter` ahead of a call): the keeper outside the hook's
PID namespace waits for init and exits the way the hook did; init (pid 1 inside, a fresh /proc) reaps everything and
ends with the hook. Stdlib only and loaded outside the engine package in the zygote and the spawner, like
engine/process/sandbox.py.

Two shapes. A fork of the helper as init, the hook forked by init: keeper -> init -> hook (cold hooks, and warm ones
where the native program is missing). In a warm zygote with the native program (engine/process/native/spare.c, its
init mode), init is that program, started without a fork of the zygote's memory, and the keeper forks the hook
beside it: keeper -> init, keeper -> hook (`split_beside`), so that a warm call forks the zygote twice rather than
three times (a fork of a zygote costs its page tables, the pages it writes and, at its exit, the unmapping of all of
it).
"""

from __future__ import annotations

import os
import resource
import select
import signal
import warnings

from .sandbox_libc import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    SetupError,
    mount,
)

# Exit status of a child whose sandbox could not be applied (as a failing preexec function: the hook never ran).
SETUP_FAILED = 126


def fork_child() -> int:
    """os.fork() from a fresh single-threaded child of the helper, without the warning a threaded parent earns."""
    with warnings.catch_warnings():  # 3.12+ warns about fork() with threads; the caller is a fresh child
        warnings.simplefilter("ignore")
        return os.fork()


def _close_all_but(*keep: int | None) -> None:
    low = 0
    for fd in sorted(k for k in keep if k is not None):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _keep(init_pid: int, status_r: int, done_fd: int | None) -> None:
    """The keeper: holds no pipe of the hook, waits for init, then exits the way the hook did. Never returns."""
    _close_all_but(status_r, done_fd)
    status = wait_for(init_pid)
    os.set_blocking(status_r, False)
    try:
        data = os.read(status_r, 16)
    except OSError:
        data = b""
    if len(data) >= 4:
        status = int.from_bytes(data[:4], "little", signed=True)  # the hook's own wait status, reported by init
    if done_fd is not None:  # init is gone, and with it every process of the namespace: the call is over
        try:
            os.write(done_fd, status.to_bytes(4, "little", signed=True))
        except OSError:
            pass
    _exit_like(status)


# Sent by a python hook forked warm to its init (pid 1) once it is done and has closed its stdio, just before its
# _exit: "exited 0" (engine/process/warmstart_zygote.py `_finalize`). Any other status goes the usual way. SIGCONT,
# because the kernel lets any process send it within its own session whatever the uids: the hook (its plugin's
# uid) to its init, which keeps the identity it was forked with (reaping and emptying the namespace need it).
HOOK_DONE = signal.SIGCONT
# What init waits for. Blocked before the hook is forked: a hook that says it is done before init has blocked
# HOOK_DONE would otherwise lose the signal (pid 1 drops a signal it has no handler for) and run to its timeout.
INIT_WAITS = frozenset({signal.SIGCHLD, HOOK_DONE})


def fork_hook() -> int:
    """Fork the hook's process from init, with init's signals already blocked; the hook gets its mask back."""
    signal.pthread_sigmask(signal.SIG_BLOCK, INIT_WAITS)
    pid = fork_child()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, INIT_WAITS)
    return pid


def _init(hook_pid: int, status_w: int, report_fd: int | None = None) -> None:
    """pid 1 of the hook's namespace: reaps everything, ends with the hook. Never returns.

    With `report_fd` (the keeper's report channel to its zygote), init empties the namespace itself once the hook
    has ended (SIGKILL to every process of it, all reaped) and reports the hook's status there at once, a wake-up
    sooner than the keeper can; the keeper still reports after init's exit (the zygote takes the first).

    Init also takes the hook's word that it is done (HOOK_DONE, from the hook's own pid only): it kills every
    process of the namespace at once, the hook included, and when the hook was the only one left (its /proc),
    reports exit 0 without waiting for the kernel to free the hook's memory (a fork of the zygote has much of it).
    The hook cannot run again, and nothing else is left; a hook could as well have exited 0 itself."""
    _close_all_but(status_w, report_fd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    waited = INIT_WAITS
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)  # (already blocked by fork_hook) queued, not lost
    while True:
        while True:  # every child that has ended (SIGCHLDs merge), the hook's first
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(0)
            if pid == hook_pid:
                _report(status, status_w, report_fd)
            if pid == 0:
                break
        info = signal.sigwaitinfo(waited)
        if info.si_signo == HOOK_DONE and info.si_pid == hook_pid:
            try:
                os.kill(-1, signal.SIGKILL)  # the hook too: it was about to _exit, now it cannot do anything else
            except ProcessLookupError:
                pass
            if _only_init_and(hook_pid):
                _report(0, status_w, report_fd, emptied=True)
            _report(0, status_w, report_fd)  # (someone else was left: killed, reaped, then reported)


def _only_init_and(pid: int) -> bool:
    """Whether this namespace's /proc lists no process but init and `pid` (a /proc that is not ours: no)."""
    try:
        pids = {entry for entry in os.listdir("/proc") if entry.isdigit()}
    except OSError:
        return False
    return "1" in pids and pids <= {"1", str(pid)}


def _report(status: int, status_w: int, report_fd: int | None, emptied: bool = False) -> None:
    """The hook's wait status to the zygote (the namespace emptied first) and to the keeper; then exits."""
    report = status.to_bytes(4, "little", signed=True)
    if report_fd is not None:
        if not emptied:
            _empty_namespace()
        try:
            os.write(report_fd, report)
        except OSError:
            pass
    try:
        os.write(status_w, report)
    except OSError:
        pass
    os._exit(0)  # the kernel now kills whatever the hook left in the namespace


def _empty_namespace() -> None:
    """In init: kill every other process of the namespace (kill(-1) reaches no process outside it) and reap them,
    again until none is left (one forked meanwhile dies on the next round; orphans are reparented to init)."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return


def wait_for(pid: int) -> int:
    """`pid`'s wait status once it has ended (0 when it is not our child)."""
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0


def _exit_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # mirror a SIGSEGV without dumping the keeper's core
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _exit_if_keeper_gone(status_w: int) -> None:
    """The keeper died before PDEATHSIG was set: no reader left on the status pipe."""
    poller = select.poll()
    poller.register(status_w, select.POLLOUT)
    if any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0)):
        os._exit(137)


# In a warm zygote: the path of the native program whose init mode is its hooks' init (`use_native_init`).
_native_init: list = []
INIT_WIRE = "lfinit/1"  # native/spare.c init_main: report fd (-1: none), status fd


def use_native_init(path: str | None) -> None:
    """In a warm zygote, before its first child: hooks' init is `path` (native/spare.c's init mode) from now on,
    forked beside the hook rather than as its parent (`split_beside`), if that build has an init mode (asked once);
    None: a fork of the zygote, as for cold hooks. Not inside a user namespace (a service that is not root): there
    the exec would cost init the capabilities it needs to mount its /proc (the mapped uid is not 0), so init stays a
    fork."""
    _native_init[:] = [path] if path and _has_init_mode(path) else []


def _has_init_mode(path: str) -> bool:
    try:
        pid = os.posix_spawn(path, [path, INIT_WIRE], {})
    except OSError:
        return False
    status = wait_for(pid)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def open_native_init() -> int | None:
    """A descriptor on the native init, opened before the view covers the service's code tree (None: none)."""
    if not _native_init:
        return None
    try:
        return os.open(_native_init[0], os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def split_beside(lib, init_fd: int, done_fd: int | None, report_fd: int | None = None) -> None:
    """keeper (this process, outside) -> init (the native program on `init_fd`, pid 1 of the new PID namespace)
    and, beside it, keeper -> hook (pid 2). Returns in the hook. `report_fd`: where init reports a hook that said it
    is done (the zygote, a wake-up sooner than the keeper); the keeper reports every end on `done_fd` after init."""
    status_r, status_w = os.pipe()
    lib.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the keeper is a fork of the zygote (see `split`)
    try:
        init_pid = _start_native_init(init_fd, status_r, status_w, report_fd)
    finally:
        os.close(init_fd)
    hook_pid = fork_hook()
    if hook_pid:
        _keep_beside(init_pid, hook_pid, status_r, done_fd)
    os.close(status_r)
    if done_fd is not None and done_fd != report_fd:
        os.close(done_fd)
    lib.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _start_native_init(fd: int, status_r: int, status_w: int, report_fd: int | None) -> int:
    """The native init, spawned without copying this process (posix_spawn: vfork and exec of `fd`, opened before
    the covers); its pid once it has mounted its /proc. Raises SetupError."""
    path = _native_init[0]
    given = [status_w] + ([report_fd] if report_fd is not None else [])
    for each in given:
        os.set_inheritable(each, True)
    try:
        pid = os.posix_spawn(f"/proc/self/fd/{fd}", [path, INIT_WIRE, str(-1 if report_fd is None else report_fd),
                                                     str(status_w)], {})
    except OSError as exc:
        raise SetupError(f"cannot start init: {exc}") from None
    finally:
        for each in given:
            os.set_inheritable(each, False)
        os.close(status_w)
    if os.read(status_r, 1) != b"R":
        wait_for(pid)
        raise SetupError("init could not mount its /proc")
    return pid


def _keep_beside(init_pid: int, hook_pid: int, status_r: int, done_fd: int | None) -> None:
    """The keeper of a hook forked beside its init: waits for the hook, then ends the namespace (init killed: the
    kernel kills every process left in it and returns init only once they are all gone), then exits the way the hook
    did. A hook that said it is done: init said "D" before killing it, and the keeper lets init empty the namespace
    and say exit 0. Never returns."""
    _close_all_but(status_r, done_fd)
    os.set_blocking(status_r, False)
    status = wait_for(hook_pid)
    said = _read_all(status_r)
    if not said.startswith(b"D"):
        try:
            os.kill(init_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(init_pid)
    said = (said + _read_all(status_r))[1:]
    if len(said) >= 4:
        status = int.from_bytes(said[:4], "little", signed=True)  # init's word: the hook said it was done
    if done_fd is not None:
        try:
            os.write(done_fd, status.to_bytes(4, "little", signed=True))
        except OSError:
            pass
    _exit_like(status)


def _read_all(fd: int) -> bytes:
    """What a non-blocking pipe holds now."""
    try:
        return os.read(fd, 16)
    except OSError:
        return b""


def split(lib, init_fd: int | None, done_fd: int | None, report_fd: int | None = None) -> None:
    """keeper (this process, outside) -> init (pid 1 of the new PID namespace) -> hook (pid 2); with `init_fd` (a
    warm zygote's native init, `open_native_init`) init beside the hook instead (`split_beside`). Returns in the hook.

    `done_fd`: where the keeper reports the hook's wait status once the namespace is empty; the hook never holds it
    unless it is also `report_fd`. `report_fd` (a spare prepared ahead of its call: its socket to the zygote, on
    which the hook's call will come): init reports there too, as soon as it has emptied the namespace."""
    if init_fd is not None:
        split_beside(lib, init_fd, done_fd, report_fd)
        return
    status_r, status_w = os.pipe()
    # Keeper and init are forks of the service (or zygote) and keep its environment in memory: not dumpable, so the
    # hook (same uid, no capabilities) cannot read /proc/1/environ or attach to them.
    lib.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    init_pid = fork_child()
    if init_pid:
        os.close(status_w)
        _keep(init_pid, status_r, done_fd)
    os.close(status_r)
    try:
        _become_init(lib, status_w)
    except BaseException:
        if report_fd is None:
            raise  # the caller says why on the hook's stderr
        os._exit(SETUP_FAILED)  # ahead of the call there is no stderr yet: the keeper reports the status
    hook_pid = fork_hook()
    if hook_pid:
        _init(hook_pid, status_w, report_fd)
    os.close(status_w)
    if done_fd is not None and done_fd != report_fd:
        os.close(done_fd)
    lib.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the hook itself is an ordinary process (exec resets it anyway)


def _become_init(lib, status_w: int) -> None:
    """In init, before it forks the hook: tied to the keeper, and a fresh /proc of its namespace."""
    lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _exit_if_keeper_gone(status_w)
    try:
        mount(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SetupError:
        # A kernel may refuse a new proc inside a user namespace (masked /proc in containers): then no /proc at
        # all rather than the service's.
        mount(lib, "tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k")
    else:
        mount(lib, "/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
        lib.mount(None, b"/proc/sys", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  None)
