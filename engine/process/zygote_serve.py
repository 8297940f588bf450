"""The zygote's loop (engine/process/warmstart_zygote.py; in exec mode the spawner's, engine/process/hook_spawner.py):
take calls from the worker on the control socket, keep a spare child ready (in a cgroup of its own, and once a call
has shown the service's sandbox shape, in its namespaces: engine/process/sandbox_spare.py), hand each call to the spare
or fork on demand, and answer with the child's pid, then its exit status (the messages: engine/process/zygote_wire.py).

Stdlib only and loaded outside the engine package, like engine/process/sandbox.py. Single-threaded on purpose: fork()
from a threaded process is unsafe.
"""

import json
import os
import select
import selectors
import socket
import time

from . import native_spare
from .zygote_wire import HEADER, recv_call, recv_exact, send_call, send_line

_SIGKILL = 9
_SPEC_TIMEOUT_SECS = 10.0
_NATIVE_READY_SECS = 2.0  # a native spare made for a waiting call prepares in a few ms; past this, a python child
_NATIVE_GIVE_UP = 3  # native spares failing in a row: this spawner stops starting them
# After the call that took the spare has answered, wait this long before making the next one: making it at once
# (a fork of this process, then the spare's namespaces and rehearsal, several ms of CPU) competed for a core with the
# answer on its way back through the worker, Redis and the web tier (warm REST p50 -0.31 to -0.59 ms on 2 cores,
# bench/README.md). Longer pauses cost calls that follow their answer at once (4 ms: +1.2 ms back to back).
_SPARE_DELAY_SECS = 0.0015
_MAX_NETNS = 64  # plugins whose network namespace a zygote keeps


def _serve(ctl, sandbox, spare_program=None, exec_mode=False):
    """Fork children on request. Returns only inside a forked child: (spec, fds) for a child forked for a call,
    or (None, (socket, shape, rehearse, plan)) for the spare child, which then waits on that socket for its call
    (having entered namespaces of `shape` ahead when it is not None, as `plan` says, and rehearsed the hook's start
    when `rehearse`; see warmstart_zygote.py). `fds` are the call's stdin, stdout, stderr, then the keeper's done pipe, then (exec mode)
    the exec error pipe.

    One spare child is forked ahead of time, so a call does not wait for fork(): it is handed the call's fds and
    spec. A spare has never run anything but this loop's fork, and it has already joined a fresh cgroup (made
    here, limits written when its call arrives): joining a cgroup v1 hierarchy waits for an RCU grace period,
    ~1 ms back to back but ~12 ms once the machine has idled, and a spare pays it while it waits.

    A call is answered with its child's pid, then `{"rc", "oom"}` as soon as the keeper reports the hook's status
    on the done pipe (the namespace is empty by then; its teardown finishes after the answer), or when the child
    is reaped. The call's cgroup is removed after the child is reaped, off the call's path.

    `spare_program` (exec mode, engine/process/native_spare.py): a spare for a known sandbox shape is that program,
    started with posix_spawn, instead of a fork of this process.

    A zygote (not `exec_mode`) runs every hook with its own interpreter: its spares bind the interpreter's
    installation back ahead (sandbox.shape_of `launcher`); the spawner's hooks come with a launcher each, bound back
    on the call's path.
    """
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, None)
    children = {}  # pidfd -> [pid, reply socket or None once answered, cgroups, done pipe read end or None]
    draining = False
    # (pid, socket to it, its cgroups, the sandbox shape it entered ahead or None, limits written, native program)
    spare = None
    # The child running the call that took the last spare: the next spare is made once it has answered (and
    # _SPARE_DELAY_SECS later), so that preparing it (fork, cgroup join, namespaces) does not compete with the
    # running hook for the CPU.
    waiting = None
    spare_after = 0.0
    hurry = False  # the next spare is for a call already waiting
    shape = None  # the last call's (sandbox.shape_of): what the next spare prepares
    last_limits = ()  # the last call's cgroup limits: written into the next spare's cgroup ahead of its call
    leftover = []  # cgroups still busy when their call was reaped
    netns = {}  # plugin directory -> descriptor of its empty network namespace (sandbox.make_netns), newest last
    cgroups = sandbox.cgroups if sandbox is not None else None
    native_failures = 0  # native spares in a row that never said they were ready

    def in_child():
        sel.close()
        ctl.close()
        for pidfd, (_pid, other, _cg, done_r) in children.items():
            if other is not None:
                other.close()
            if done_r is not None:
                os.close(done_r)
            os.close(pidfd)
        if spare is not None:
            spare[1].close()
        for fd in netns.values():  # a prepared hook is handed its own plugin's
            os.close(fd)

    def remove(paths):
        for path in paths:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                leftover.append(path)

    def drop_spare():
        pid, sock, paths, _shape, _limits, _native = spare
        sock.close()  # EOF: the spare exits
        os.waitpid(pid, 0)
        remove(paths)

    def answer(child, status):
        nonlocal waiting, spare_after
        if child is waiting:
            waiting = None
            spare_after = time.monotonic() + _SPARE_DELAY_SECS
        pid, reply, paths, _done = child
        if reply is None:
            return
        try:
            rc = os.waitstatus_to_exitcode(status)
        except ValueError:
            rc = -_SIGKILL
        send_line(reply, {"rc": rc, "oom": bool(paths) and sandbox._oom_killed(tuple(paths))})
        reply.close()
        child[1] = None

    def exit_now():
        """The worker is gone (or we retired): end the calls still running, as PDEATHSIG would, and leave no cgroup
        behind (what stays busy is removed by the next process that finds it: engine/process/sandbox_cgroups.py
        _remove_stale)."""
        if spare is not None:
            drop_spare()
        for pid, _reply, paths, _done in children.values():
            try:
                os.kill(pid, _SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            leftover.extend(paths)
        for _ in range(50):
            if not leftover:
                break
            retry, leftover[:] = list(leftover), []
            remove(retry)
            if leftover:
                select.select([], [], [], 0.01)
        os._exit(0)

    def spare_cgroup(limits):
        """A fresh cgroup for a spare, with `limits` written ahead when they could be: (paths, limits written)."""
        paths = cgroups.prepare() if cgroups is not None and cgroups.available() else ()
        return paths, (limits if paths and limits and cgroups.limit(paths, *limits) else ())

    def native_spare_for(the_shape, limits):
        """A spare that is the native program, for `the_shape`, its cgroup limited to `limits` ahead; or None."""
        paths, written = spare_cgroup(limits)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = native_spare.spawn(spare_program, theirs, the_shape, paths, sandbox.seccomp_filter())
        except OSError:
            ours.close()
            remove(paths)
            return None
        finally:
            theirs.close()
        return pid, ours, paths, the_shape, written, True

    while True:
        due = spare is None and not draining and waiting is None  # a spare to make, now or after the pause
        delay = spare_after - time.monotonic() if due else 0.0
        if not due or delay > 0:
            pass  # (the select below wakes up when the pause is over)
        elif spare_program is not None and shape is not None:
            spare = native_spare_for(shape, last_limits)
        else:
            # Likely the next call's limits too (same plugin): checked, and rewritten if not, when the call arrives.
            paths, written = spare_cgroup(last_limits)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            plan = sandbox.plan_view(shape) if shape is not None else None  # looked up here, not in the fresh fork
            try:
                pid = os.fork()
            except OSError:
                pid = None
            if pid == 0:
                ours.close()
                in_child()
                for path in paths:  # first: everything this process starts is counted
                    try:
                        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
                            fh.write("0")
                    except OSError:
                        os._exit(0)  # seen as a dead spare: the call is forked on demand
                return None, (theirs, shape, not hurry, plan)
            theirs.close()
            if pid is None:
                ours.close()
                remove(paths)
            else:
                spare = (pid, ours, paths, shape, written, False)
        hurry = False
        if leftover:
            retry, leftover[:] = list(leftover), []
            remove(retry)
        timeout = 0.5 if leftover else None
        if delay > 0:
            timeout = min(timeout or delay, delay)
        events = sel.select(timeout)
        if delay > 0 and any(key.data is None for key, _ in events):
            # A call came during the pause: make the spare now, without the rehearsal that only pays ahead of a call,
            # and hand it the call (what is ready stays ready: the selector reports it again).
            spare_after, hurry = 0.0, True
            continue
        for key, _ in events:
            if key.data is None:
                try:
                    msg, fds = recv_call(ctl)
                except InterruptedError:
                    continue
                if not msg:  # the worker is gone: children die with us (PDEATHSIG), the spare on EOF
                    exit_now()
                if len(fds) not in (4, 5):
                    for fd in fds:
                        os.close(fd)
                    if not fds and HEADER.unpack(msg)[0] == 0:  # retired: finish the running hooks, then exit
                        draining = True
                        if spare is not None:
                            drop_spare()
                            spare = None
                        if not children:
                            exit_now()
                    continue
                reply = socket.socket(fileno=fds[0])
                done_r, done_w = os.pipe()
                passed = [*fds[1:4], done_w, *fds[4:]]  # a prepared spare's hook gets them without done_w
                pid, paths, make_netns_for, from_spare = None, (), None, False
                try:
                    reply.settimeout(_SPEC_TIMEOUT_SECS)
                    spec = json.loads(recv_exact(reply, HEADER.unpack(msg)[0]))
                    box = spec["sandbox"]
                    limits = tuple(box.get("cgroup_limits") or ())
                    box_spec = sandbox.SandboxSpec.from_dict(box)
                    call_shape = sandbox.shape_of(box_spec, launcher=not exec_mode)
                    if spare is None and spare_program is not None and call_shape is not None and not draining:
                        # Calls overlap (the spare went to the one before): the native program costs far less
                        # than the python fork below, made for this call now.
                        spare = native_spare_for(call_shape, limits)
                    if spare is not None:
                        pid, sock, paths, spare_shape, spare_limits, spare_native = spare
                        spare = None
                        try:
                            if spare_shape is not None and spare_shape != call_shape:
                                raise OSError("the spare entered namespaces of another shape")
                            if spare_native:
                                if not native_spare.wait_ready(sock, _NATIVE_READY_SECS):
                                    native_failures += 1
                                    if native_failures >= _NATIVE_GIVE_UP:  # python spares from now on
                                        spare_program = None
                                    raise OSError("the native spare could not prepare the sandbox")
                                native_failures = 0
                            if os.waitpid(pid, os.WNOHANG)[0]:
                                raise OSError("the spare child died")
                            if spare_limits and not limits:
                                raise OSError("the spare's cgroup has limits this call does not")
                            if limits and limits != spare_limits and not cgroups.limit(paths, *limits):
                                raise OSError("cannot write the cgroup limits")
                            to_send = passed
                            if spare_shape is not None:
                                spec["kept"] = sandbox.kept_dirs(box_spec, launcher=not spare_shape.launcher)  # seen here
                                to_send = [*fds[1:4], *fds[4:]]
                                if box.get("new_net") and (not spare_shape.user_ns or spare_shape.mapped):  # no user
                                    plugin = box["cwd"]  # namespace of its own (sandbox.make_netns)
                                    if plugin in netns:
                                        netns[plugin] = netns.pop(plugin)
                                        spec["netns"] = len(to_send)
                                        to_send = [*to_send, netns[plugin]]
                                    else:
                                        make_netns_for = plugin, spare_shape
                            if spare_native:
                                raw = native_spare.encode_call(spec, spec.get("netns"))
                            else:
                                raw = json.dumps(spec).encode()
                            send_call(sock, len(raw), to_send)
                            sock.sendall(raw)
                            if spare_shape is not None:  # its keeper reports the hook's status on this socket
                                os.close(done_r)  # (done_w is closed with the rest of `passed`)
                                done_r = sock.detach()
                            from_spare = True
                        except OSError:  # fork on demand instead
                            try:
                                os.kill(pid, _SIGKILL)
                                os.waitpid(pid, 0)
                            except OSError:
                                pass
                            remove(paths)
                            pid, paths = None, ()
                            spec.pop("kept", None)
                        finally:
                            sock.close()
                    if pid is None:
                        waiting = None  # calls overlap: keep a spare ready again, as soon as this one is forked
                        if limits and cgroups is not None:
                            paths = cgroups.create(*limits)
                            box["cgroups"] = list(paths)  # joined by sandbox.enter, on the call's path
                        pid = os.fork()
                    shape, last_limits = call_shape, limits
                except Exception as exc:
                    send_line(reply, {"error": f"{type(exc).__name__}: {exc}"})
                    reply.close()
                    for fd in (*passed, done_r):
                        os.close(fd)
                    remove(paths)
                    continue
                if pid == 0:
                    reply.detach()
                    os.close(done_r)
                    in_child()
                    return spec, passed
                for fd in passed:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = child = [pid, reply, paths, done_r]
                if from_spare:
                    waiting = child
                sel.register(pidfd, selectors.EVENT_READ, "child")
                sel.register(done_r, selectors.EVENT_READ, child)
                send_line(reply, {"pid": pid})
                if make_netns_for is not None:  # for the plugin's next calls (this one made its own)
                    fd = sandbox.make_netns(make_netns_for[1])
                    if fd is not None:
                        netns[make_netns_for[0]] = fd
                        while len(netns) > _MAX_NETNS:
                            os.close(netns.pop(next(iter(netns))))
            elif key.data == "child":
                pidfd = key.fd
                sel.unregister(pidfd)
                child = children.pop(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(child[0], 0)
                answer(child, status)
                if child[3] is not None:
                    sel.unregister(child[3])
                    os.close(child[3])
                    child[3] = None
                remove(child[2])
                if draining and not children:
                    exit_now()
            else:  # the keeper reports the hook's status: the namespace is empty, answer now
                child = key.data
                if child[3] is None:  # reaped in this same round
                    continue
                try:
                    data = os.read(child[3], 4)
                except OSError:
                    data = b""
                sel.unregister(child[3])
                os.close(child[3])
                child[3] = None
                if len(data) == 4:
                    answer(child, int.from_bytes(data, "little", signed=True))
