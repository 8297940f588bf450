"""The zygote's loop (engine/process/warmstart_zygote.py; in exec mode the spawner's, engine/process/hook_spawner.py):
take calls from the worker on the control socket, keep a spare child ready (in a cgroup of its own, and once a call
has shown the service's sandbox shape, in its namespaces: engine/process/sandbox_spare.py), hand each call to the spare
or fork on demand, and answer with the child's pid, then its exit status (the messages: engine/process/zygote_wire.py).

`ZygoteLoop.run` returns only in a forked child, with what that child is to become (`ForCall`, `PlainSpare`,
`PreparedSpare`: engine/process/zygote_child.py `become`). Stdlib only and loaded outside the engine package, like
engine/process/sandbox.py. Single-threaded on purpose: fork() from a threaded process is unsafe.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import socket
import time
from typing import NamedTuple

from . import native_spare
from .zygote_wire import HEADER, recv_call, recv_exact, send_call, send_line

_SIGKILL = 9
_SPEC_TIMEOUT_SECS = 10.0
_NATIVE_READY_SECS = 2.0  # a native spare made for a waiting call prepares in a few ms; past this, a python child
_NATIVE_GIVE_UP = 3  # native spares failing in a row: this spawner stops starting them
# The next spare is made this long after the call that took the last one has answered, not at once: making it (a
# fork, its namespaces and rehearsal) must not compete for a core with the answer on its way back through the
# worker, Redis and the web tier; the pause stays short, for calls that follow their answer at once.
_SPARE_DELAY_SECS = 0.0015
_MAX_NETNS = 64  # plugins whose network namespace a zygote keeps


class ForCall(NamedTuple):
    """A child forked on demand for a call: it applies the whole sandbox itself (sandbox.enter)."""

    spec: dict  # the call: {"sandbox": SandboxSpec fields, "script" or "argv", ...}
    fds: list  # stdin, stdout, stderr, the keeper's done pipe, then (exec mode) the exec error pipe


class PlainSpare(NamedTuple):
    """A spare forked ahead of its call, in its cgroup only: it waits for the call (spec and fds) on `sock`."""

    sock: socket.socket


class PreparedSpare(NamedTuple):
    """A spare forked ahead of its call that enters the namespaces of `shape` ahead (sandbox.pre_enter) as `plan`
    says, and rehearses the hook's start when `rehearse`; its call comes on `sock`."""

    sock: socket.socket
    shape: tuple  # sandbox.shape_of
    rehearse: bool
    plan: tuple  # sandbox.plan_view(shape)


class Spare(NamedTuple):
    """The child made ahead of the next call: a fork of this process, or the native program (`native`)."""

    pid: int
    sock: socket.socket  # the call goes to it here; EOF drops it
    cgroups: tuple  # the cgroup it joined
    shape: tuple | None  # the sandbox shape it entered ahead, or None (a plain spare)
    limits: tuple  # the cgroup limits written ahead, or ()
    native: bool


class Child:
    """A child running a call, answered once: its pid on the reply socket at once, its status when it is known."""

    __slots__ = ("pid", "reply", "cgroups", "done")

    def __init__(self, pid: int, reply: socket.socket, cgroups: tuple, done: int):
        self.pid = pid
        self.reply = reply  # None once answered
        self.cgroups = cgroups  # removed once the child is reaped
        self.done = done  # the done pipe's read end (the keeper's report), None once read or closed


class _Call:
    """A call being handed over: its reply socket, the descriptors its child gets, its spec, and what is known so
    far of the child that will run it."""

    __slots__ = ("reply", "stdio", "done_r", "passed", "spec", "box", "box_spec", "shape", "limits", "pid",
                 "cgroups", "netns_for", "from_spare")

    def __init__(self, fds):
        self.reply = socket.socket(fileno=fds[0])
        self.stdio = [*fds[1:4], *fds[4:]]  # what a prepared spare gets: stdin, stdout, stderr (, exec error pipe)
        self.done_r, done_w = os.pipe()
        self.passed = [*fds[1:4], done_w, *fds[4:]]  # what a forked child gets: the done pipe too
        self.spec = self.box = self.box_spec = self.shape = None
        self.limits = ()
        self.pid = None
        self.cgroups = ()
        self.netns_for = None  # (plugin, shape): its network namespace to make once the call is answered
        self.from_spare = False

    def close_fds(self) -> None:
        for fd in (*self.passed, self.done_r):
            os.close(fd)


class ZygoteLoop:
    """Fork children on request. A spare child is made ahead of each call, so a call does not wait for fork(): it
    is handed the call's fds and spec. A spare has never run anything but this loop's fork, and it has already
    joined a fresh cgroup (made here, limits written when its call arrives): joining a cgroup v1 hierarchy waits for
    an RCU grace period, which a spare pays while it waits.

    A call is answered with its child's pid, then `{"rc", "oom"}` as soon as the keeper reports the hook's status
    on the done pipe (the namespace is empty by then; its teardown finishes after the answer), or when the child is
    reaped. The call's cgroup is removed after the child is reaped, off the call's path.

    `spare_program` (exec mode, engine/process/native_spare.py): a spare for a known sandbox shape is that program,
    started with posix_spawn, instead of a fork of this process. A zygote (not `exec_mode`) runs every hook with its
    own interpreter: its spares bind the interpreter's installation back ahead (sandbox.shape_of `launcher`); the
    spawner's hooks come with a launcher each, bound back on the call's path."""

    def __init__(self, ctl, sandbox, spare_program=None, exec_mode=False):
        self.ctl = ctl
        self.sandbox = sandbox
        self.spare_program = spare_program
        self.exec_mode = exec_mode
        self.cgroups = sandbox.cgroups if sandbox is not None else None
        self.selector = selectors.DefaultSelector()
        self.selector.register(ctl, selectors.EVENT_READ, None)
        self.children = {}  # pidfd -> Child
        self.spare = None  # Spare
        # The child running the call that took the last spare: the next spare is made once it has answered (and
        # _SPARE_DELAY_SECS later), so that preparing it does not compete with the running hook for the CPU.
        self.waiting = None
        self.spare_after = 0.0
        self.hurry = False  # the next spare is for a call already waiting: no rehearsal
        self.draining = False  # retired: no new spare, exit once the running hooks are done
        self.shape = None  # the last call's (sandbox.shape_of): what the next spare prepares
        self.last_limits = ()  # the last call's cgroup limits: written into the next spare's cgroup ahead of its call
        self.leftover = []  # cgroups still busy when their call was reaped
        self.netns = {}  # plugin directory -> descriptor of its empty network namespace (sandbox.make_netns)
        self.native_failures = 0  # native spares in a row that never said they were ready

    # ---- the loop ----------------------------------------------------------------------------------------------

    def run(self):
        """Serve until the worker is gone (then exit); returns only in a forked child: ForCall, PlainSpare or
        PreparedSpare."""
        while True:
            due = self.spare is None and not self.draining and self.waiting is None
            delay = self.spare_after - time.monotonic() if due else 0.0
            if due and delay <= 0:
                forked = self._make_spare()
                if forked is not None:
                    return forked
            self.hurry = False
            if self.leftover:
                retry, self.leftover = self.leftover, []
                self._remove(retry)
            timeout = 0.5 if self.leftover else None
            if delay > 0:
                timeout = min(timeout or delay, delay)
            events = self.selector.select(timeout)
            if delay > 0 and any(key.data is None for key, _ in events):
                # A call came during the pause: make the spare now, without the rehearsal that only pays ahead of a
                # call, and hand it the call (what is ready stays ready: the selector reports it again).
                self.spare_after, self.hurry = 0.0, True
                continue
            for key, _ in events:
                if key.data is None:
                    forked = self.on_message()
                    if forked is not None:
                        return forked
                elif key.data == "child":
                    self.on_child_exit(key.fd)
                else:
                    self.on_done(key.data)

    # ---- events ------------------------------------------------------------------------------------------------

    def on_message(self):
        """A message on the control socket: a call (ForCall in the child forked for it), a retirement, or EOF."""
        try:
            msg, fds = recv_call(self.ctl)
        except InterruptedError:
            return None
        if not msg:  # the worker is gone: children die with us (PDEATHSIG), the spare on EOF
            self._exit_now()
        if len(fds) in (4, 5):
            return self.on_call(HEADER.unpack(msg)[0], fds)
        for fd in fds:
            os.close(fd)
        if not fds and HEADER.unpack(msg)[0] == 0:
            self.on_retire()
        return None

    def on_retire(self) -> None:
        """Retired: finish the running hooks, then exit."""
        self.draining = True
        if self.spare is not None:
            self._drop_spare()
        if not self.children:
            self._exit_now()

    def on_call(self, length: int, fds):
        """A call: to the spare when it fits, else to a child forked now. ForCall in that child."""
        call = _Call(fds)
        try:
            self._read_spec(call, length)
            if (self.spare is None and self.spare_program is not None and call.shape is not None
                    and not self.draining):
                # Calls overlap (the spare went to the one before): the native program costs far less than the
                # python fork below, made for this call now.
                self.spare = self._native_spare(call.shape, call.limits)
            if self.spare is not None:
                spare, self.spare = self.spare, None
                self._to_spare(call, spare)
            if call.pid is None:
                self.waiting = None  # calls overlap: keep a spare ready again, as soon as this one is forked
                if call.limits and self.cgroups is not None:
                    call.cgroups = self.cgroups.create(*call.limits)
                    call.box["cgroups"] = list(call.cgroups)  # joined by sandbox.enter, on the call's path
                call.pid = os.fork()
            self.shape, self.last_limits = call.shape, call.limits
        except Exception as exc:
            send_line(call.reply, {"error": f"{type(exc).__name__}: {exc}"})
            call.reply.close()
            call.close_fds()
            self._remove(call.cgroups)
            return None
        if call.pid == 0:
            call.reply.detach()
            os.close(call.done_r)
            self._close_inherited()
            return ForCall(call.spec, call.passed)
        self._started(call)
        return None

    def on_child_exit(self, pidfd: int) -> None:
        """A child ended: answer its call if the keeper did not already, remove its cgroup."""
        self.selector.unregister(pidfd)
        child = self.children.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(child.pid, 0)
        self._answer(child, status)
        if child.done is not None:
            self.selector.unregister(child.done)
            os.close(child.done)
            child.done = None
        self._remove(child.cgroups)
        if self.draining and not self.children:
            self._exit_now()

    def on_done(self, child: Child) -> None:
        """The keeper reports the hook's status: the namespace is empty, answer now."""
        if child.done is None:  # reaped in this same round
            return
        try:
            data = os.read(child.done, 4)
        except OSError:
            data = b""
        self.selector.unregister(child.done)
        os.close(child.done)
        child.done = None
        if len(data) == 4:
            self._answer(child, int.from_bytes(data, "little", signed=True))

    # ---- spares ------------------------------------------------------------------------------------------------

    def _make_spare(self):
        """The next spare: the native program for a known shape, else a fork of this process (which returns
        PlainSpare or PreparedSpare in the fork)."""
        if self.spare_program is not None and self.shape is not None:
            self.spare = self._native_spare(self.shape, self.last_limits)
            return None
        # Likely the next call's limits too (same plugin): checked, and rewritten if not, when the call arrives.
        paths, written = self._spare_cgroup(self.last_limits)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        plan = self.sandbox.plan_view(self.shape) if self.shape is not None else None  # here, not in the fork
        try:
            pid = os.fork()
        except OSError:
            pid = None
        if pid == 0:
            ours.close()
            self._close_inherited()
            for path in paths:  # first: everything this process starts is counted
                try:
                    with open(os.path.join(path, "cgroup.procs"), "w") as fh:
                        fh.write("0")
                except OSError:
                    os._exit(0)  # seen as a dead spare: the call is forked on demand
            if self.shape is None:
                return PlainSpare(theirs)
            return PreparedSpare(theirs, self.shape, not self.hurry, plan)
        theirs.close()
        if pid is None:
            ours.close()
            self._remove(paths)
        else:
            self.spare = Spare(pid, ours, paths, self.shape, written, False)
        return None

    def _native_spare(self, shape, limits):
        """A spare that is the native program, for `shape`, its cgroup limited to `limits` ahead; or None."""
        paths, written = self._spare_cgroup(limits)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = native_spare.spawn(self.spare_program, theirs, shape, self.sandbox.plan_view(shape),
                                     self.sandbox.absent_at_call(shape), paths, self.sandbox.seccomp_filter())
        except OSError:
            ours.close()
            self._remove(paths)
            return None
        finally:
            theirs.close()
        return Spare(pid, ours, paths, shape, written, True)

    def _spare_cgroup(self, limits):
        """A fresh cgroup for a spare, with `limits` written ahead when they could be: (paths, limits written)."""
        cgroups = self.cgroups
        paths = cgroups.prepare() if cgroups is not None and cgroups.available() else ()
        return paths, (limits if paths and limits and cgroups.limit(paths, *limits) else ())

    def _drop_spare(self) -> None:
        spare, self.spare = self.spare, None
        spare.sock.close()  # EOF: the spare exits
        os.waitpid(spare.pid, 0)
        self._remove(spare.cgroups)

    # ---- a call ------------------------------------------------------------------------------------------------

    def _read_spec(self, call: _Call, length: int) -> None:
        call.reply.settimeout(_SPEC_TIMEOUT_SECS)
        call.spec = json.loads(recv_exact(call.reply, length))
        call.box = call.spec["sandbox"]
        call.limits = tuple(call.box.get("cgroup_limits") or ())
        call.box_spec = self.sandbox.SandboxSpec.from_dict(call.box)
        call.shape = self.sandbox.shape_of(call.box_spec, launcher=not self.exec_mode)

    def _to_spare(self, call: _Call, spare: Spare) -> None:
        """Hand `call` to `spare`; if it does not fit or fails, the spare is dropped and `call.pid` stays None (the
        call is then forked on demand)."""
        call.pid, call.cgroups = spare.pid, spare.cgroups
        try:
            self._check_spare(call, spare)
            self._send_to_spare(call, spare)
            call.from_spare = True
        except OSError:
            try:
                os.kill(spare.pid, _SIGKILL)
                os.waitpid(spare.pid, 0)
            except OSError:
                pass
            self._remove(spare.cgroups)
            call.pid, call.cgroups = None, ()
            call.spec.pop("kept", None)
        finally:
            spare.sock.close()

    def _check_spare(self, call: _Call, spare: Spare) -> None:
        """OSError unless `spare` can take `call`: same shape, ready, alive, its cgroup's limits the call's."""
        if spare.shape is not None and spare.shape != call.shape:
            raise OSError("the spare entered namespaces of another shape")
        if spare.native:
            if not native_spare.wait_ready(spare.sock, _NATIVE_READY_SECS):
                self.native_failures += 1
                if self.native_failures >= _NATIVE_GIVE_UP:  # python spares from now on
                    self.spare_program = None
                raise OSError("the native spare could not prepare the sandbox")
            self.native_failures = 0
        if os.waitpid(spare.pid, os.WNOHANG)[0]:
            raise OSError("the spare child died")
        if spare.limits and not call.limits:
            raise OSError("the spare's cgroup has limits this call does not")
        if call.limits and call.limits != spare.limits and not self.cgroups.limit(spare.cgroups, *call.limits):
            raise OSError("cannot write the cgroup limits")

    def _send_to_spare(self, call: _Call, spare: Spare) -> None:
        """The call's descriptors and spec to the spare; a prepared one gets the directories it binds back (looked up
        here) and its plugin's network namespace, and reports the hook's status on its socket."""
        to_send = call.passed
        if spare.shape is not None:
            call.spec["kept"] = self.sandbox.kept_dirs(call.box_spec, launcher=not spare.shape.launcher)
            to_send = list(call.stdio)
            if call.box.get("new_net") and (not spare.shape.user_ns or spare.shape.mapped):  # (sandbox.make_netns)
                plugin = call.box["cwd"]
                if plugin in self.netns:
                    self.netns[plugin] = self.netns.pop(plugin)  # newest last
                    call.spec["netns"] = len(to_send)
                    to_send = [*to_send, self.netns[plugin]]
                else:
                    call.netns_for = plugin, spare.shape
        if spare.native:
            raw = native_spare.encode_call(call.spec, call.spec.get("netns"))
        else:
            raw = json.dumps(call.spec).encode()
        send_call(spare.sock, len(raw), to_send)
        spare.sock.sendall(raw)
        if spare.shape is not None:  # its keeper reports the hook's status on this socket
            os.close(call.done_r)  # (done_w is closed with the rest of `passed`)
            call.done_r = spare.sock.detach()

    def _started(self, call: _Call) -> None:
        """In this process, once the call's child runs: its pid answered, its end and its keeper's report awaited."""
        for fd in call.passed:
            os.close(fd)
        pidfd = os.pidfd_open(call.pid)
        child = self.children[pidfd] = Child(call.pid, call.reply, call.cgroups, call.done_r)
        if call.from_spare:
            self.waiting = child
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        self.selector.register(child.done, selectors.EVENT_READ, child)
        send_line(call.reply, {"pid": call.pid})
        if call.netns_for is not None:  # for the plugin's next calls (this one made its own)
            plugin, shape = call.netns_for
            fd = self.sandbox.make_netns(shape)
            if fd is not None:
                self.netns[plugin] = fd
                while len(self.netns) > _MAX_NETNS:
                    os.close(self.netns.pop(next(iter(self.netns))))

    def _answer(self, child: Child, status: int) -> None:
        if child is self.waiting:
            self.waiting = None
            self.spare_after = time.monotonic() + _SPARE_DELAY_SECS
        if child.reply is None:
            return
        try:
            rc = os.waitstatus_to_exitcode(status)
        except ValueError:
            rc = -_SIGKILL
        send_line(child.reply, {"rc": rc, "oom": bool(child.cgroups) and self.cgroups.oom_killed(child.cgroups)})
        child.reply.close()
        child.reply = None

    # ---- this process ------------------------------------------------------------------------------------------

    def _close_inherited(self) -> None:
        """In a fork of this loop: nothing of the loop's stays open (a prepared hook is handed its own plugin's
        network namespace with its call)."""
        self.selector.close()
        self.ctl.close()
        for pidfd, child in self.children.items():
            if child.reply is not None:
                child.reply.close()
            if child.done is not None:
                os.close(child.done)
            os.close(pidfd)
        if self.spare is not None:
            self.spare.sock.close()
        for fd in self.netns.values():
            os.close(fd)

    def _remove(self, paths) -> None:
        for path in paths:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                self.leftover.append(path)

    def _exit_now(self) -> None:
        """The worker is gone (or we retired): end the calls still running, as PDEATHSIG would, and leave no cgroup
        behind (what stays busy is removed by the next process that finds it: engine/process/sandbox_cgroups.py
        `_remove_stale`)."""
        if self.spare is not None:
            self._drop_spare()
        for child in self.children.values():
            try:
                os.kill(child.pid, _SIGKILL)
                os.waitpid(child.pid, 0)
            except OSError:
                pass
            self.leftover.extend(child.cgroups)
        for _ in range(50):
            if not self.leftover:
                break
            retry, self.leftover = self.leftover, []
            self._remove(retry)
            if self.leftover:
                select.select([], [], [], 0.01)
        os._exit(0)
