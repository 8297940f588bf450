"""The keeper/init/hook process tree of a sandboxed call (engine/process/sandbox.py `enter` builds it): the keeper
outside the hook's PID namespace waits for init and exits the way the hook did; init (pid 1 inside) reaps everything
and ends with the hook. Stdlib only and loaded by path in the zygote and the spawner, like engine/process/sandbox.py.
"""

import os
import resource
import signal
import warnings


def _fork() -> int:
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
    status = _wait_for(init_pid)
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


def _init(hook_pid: int, status_w: int, report_fd: int | None = None) -> None:
    """pid 1 of the hook's namespace: reaps everything, ends with the hook. Never returns.

    With `report_fd` (the keeper's report channel to its zygote), init empties the namespace itself once the hook
    has ended (SIGKILL to every process of it, all reaped) and reports the hook's status there at once, a wake-up
    sooner than the keeper can; the keeper still reports after init's exit (the zygote takes the first)."""
    _close_all_but(status_w, report_fd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(0)
        if pid == hook_pid:
            report = status.to_bytes(4, "little", signed=True)
            if report_fd is not None:
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


def _wait_for(pid: int) -> int:
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
