"""A zygote's child, from its fork to the hook (engine/process/warmstart_zygote.py): `become` takes what the loop
returned in the child (engine/process/zygote_serve.py), waits for the call if it is a spare, takes a new session and
the call's stdio, applies the sandbox (engine/process/sandbox.py `enter`, or `pre_enter` ahead of the call for a
prepared spare), and in exec mode (the spawner, engine/process/hook_spawner.py) `exec_hook` execs the hook's program.
Stdlib only and loaded outside the engine package, like engine/process/sandbox.py.
"""

import json
import os

from .zygote_serve import PlainSpare, PreparedSpare
from .zygote_wire import HEADER, recv_call, recv_exact


def become(forked, zygote_pid, sandbox, rehearse=None):
    """In a child of the zygote's loop (`forked`: ForCall, PlainSpare or PreparedSpare), the hook's own process once
    its call is here, its stdio taken and its sandbox applied: returns (spec, exec error fd or None). `rehearse`: run
    ahead of the call by a prepared spare that was asked to rehearse."""
    if isinstance(forked, PreparedSpare):
        return prepared_spare(forked.sock, forked.shape, zygote_pid, sandbox, rehearse if forked.rehearse else None,
                              forked.plan)
    spec, fds = await_call(forked.sock) if isinstance(forked, PlainSpare) else (forked.spec, forked.fds)
    return spec, setup_child(spec, fds, zygote_pid, sandbox)


def await_call(sock):
    """In the spare child: wait for the call's fds and spec; exit quietly if the zygote retires or dies first."""
    try:
        msg, fds = recv_call(sock)
        if not msg:
            os._exit(0)
        spec = json.loads(recv_exact(sock, HEADER.unpack(msg)[0]))
    except BaseException:  # noqa: BLE001 - the zygote went away mid-hand-over
        os._exit(0)
    sock.close()
    return spec, list(fds)


def _rehearse_then_await(rehearse, sock):
    """In the prepared hook's process, before its call: `rehearse()` first (see warmstart_zygote.py `_rehearse`)."""
    try:
        rehearse()
    except BaseException:  # noqa: BLE001 - only ever a head start: the call's own steps run anyway
        pass
    return await_call(sock)


def die(message, code):
    """Say `message` on stderr and exit with `code`: the hook never runs."""
    try:
        os.write(2, message.encode("utf-8", "replace"))
    finally:
        os._exit(code)


def setup_child(spec, fds, zygote_pid, sandbox):
    """Popen(start_new_session=True, close_fds=True) and the runner's preexec function (sandbox.enter), in order.
    Returns (after the sandbox) the exec error pipe in exec mode, else None; the rest is the caller's."""
    os.setsid()
    done, exec_error = fds[3], (fds[4] if len(fds) > 4 else None)
    _take_stdio(fds[:3], (done, exec_error, *sandbox.kept_userns_fds()))  # (closed once joined)
    box = sandbox.SandboxSpec.from_dict(spec["sandbox"])
    try:
        sandbox.enter(box, zygote_pid, done)  # returns in the hook's own process
    except Exception as exc:  # noqa: BLE001 - as the runner's preexec function: the hook never starts
        die(f"sandbox setup failed in the child: {exc}\n", sandbox.SETUP_FAILED)
    return exec_error


def _take_stdio(stdio, extra):
    """The call's pipes as fds 0-2, `extra` fds kept (close-on-exec), every other fd closed (close_fds=True)."""
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    keep = sorted(fd for fd in extra if fd is not None)
    for fd in stdio:
        if fd > 2 and fd not in keep:
            os.close(fd)
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    for fd in keep:
        os.set_inheritable(fd, False)


def prepared_spare(sock, shape, zygote_pid, sandbox, rehearse=None, plan=None):
    """A spare child entering its namespaces before its call (sandbox.pre_enter): it becomes the call's keeper, and
    this returns (spec, exec error fd or None) in the hook's own process once the call arrived, its stdio taken and
    its sandbox complete. A spare that cannot prepare exits: the call is then forked on demand."""
    os.setsid()
    try:
        spec, fds = sandbox.pre_enter(shape, zygote_pid, sock, await_call if rehearse is None else
                                      lambda s: _rehearse_then_await(rehearse, s), plan)
    except BaseException:  # noqa: BLE001
        os._exit(0)
    exec_error = fds[3] if "argv" in spec else None
    _take_stdio(fds[:3], (exec_error,))
    try:
        sandbox.enter_hook(spec)
    except Exception as exc:  # noqa: BLE001 - as the runner's preexec function: the hook never starts
        die(f"sandbox setup failed in the child: {exc}\n", sandbox.SETUP_FAILED)
    return spec, exec_error


def forget_inherited_signals():
    """Signals the service was started with ignored (`nohup librefang start` ignores SIGHUP) back to their
    defaults, in the zygote before its first child: what a hook gets never depends on how the service was started,
    and a warm hook gets what a cold one does (native/spare.c resets every signal before its exec). Python's own
    stay as a fresh interpreter sets them: SIGPIPE and SIGXFSZ ignored, SIGINT raising KeyboardInterrupt."""
    import signal

    own = {signal.SIGPIPE, signal.SIGXFSZ}
    for sig in signal.valid_signals():
        try:
            if sig not in own and signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP and the C library's own
            pass


def exec_hook(spec, exec_error):
    """Exec mode: become the hook's own program with every signal at its default, as native/spare.c execs one (so
    SIGPIPE and SIGXFSZ, which Python ignores, too). An exec failure goes back to the worker as an errno on the exec
    error pipe."""
    import signal

    for sig in signal.valid_signals():
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP and the C library's own
            pass
    argv = spec["argv"]
    try:
        os.execve(argv[0], argv, spec["sandbox"]["env"])
    except OSError as exc:
        try:
            os.write(exec_error, str(exc.errno or 0).encode())
        finally:
            os._exit(127)
