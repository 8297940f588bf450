"""The warm-start zygote: run as a *script* by the resolved python launcher (never imported by the worker).

It starts once per interpreter (and per set of start-up environment variables), preloads a few stdlib modules and
engine/process/sandbox.py (argv[2]: stdlib only, loaded with its siblings as a package of their own, `_PACKAGE`, outside
the engine package), then waits on a SOCK_SEQPACKET control socket. Each request
carries, as SCM_RIGHTS, a reply socket and the hook's stdin/stdout/stderr pipe ends; the JSON spec (script and the
runner's SandboxSpec) follows on the reply socket. The zygote forks; the child takes a new session and its stdio,
applies the sandbox with the same function as a spawned hook (sandbox.enter: PDEATHSIG, cgroup, namespaces, mounts,
rlimits, capabilities, cwd; the hook itself ends up forked below the namespace's init), sets the cleared
environment, sys.argv, sys.path[0] and a fresh `__main__`, and runs the script. The zygote reports the child's pid,
then its exit status (the hook's, mirrored), on the reply socket. Single-threaded on purpose: fork() from a threaded
process is unsafe.

A spare child is forked ahead of each call, already in a cgroup of its own; once a call has shown the service's
sandbox shape, the next spare also enters it ahead (sandbox.pre_enter: namespaces, covered home, init, the hook's
process waiting for its call), so the call's path has no fork left. Run by engine/process/hook_spawner.py, the same loop
execs any hook's program instead of running a python script (exec mode, cold hooks).

No imports from the engine package (engine/process/sandbox.py is loaded as `_PACKAGE`.sandbox), compatible with any CPython >= 3.9 on
Linux.
"""

import sys

_BASELINE = frozenset(sys.modules)  # what a fresh interpreter of this launcher has loaded before any script runs

import array  # noqa: E402
import builtins  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402  (preloaded for hooks: the one module nearly every python hook imports)
import json.decoder  # noqa: E402,F401
import json.encoder  # noqa: E402,F401
import os  # noqa: E402
import select  # noqa: E402
import selectors  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import sysconfig  # noqa: E402
import types  # noqa: E402
from importlib.machinery import PathFinder, SourceFileLoader  # noqa: E402

_SIGKILL = 9
_SIGINT = 2
_PACKAGE = "librefang_process"  # engine/process/ as the zygote loads it (`_load_sandbox`), not the engine package
_HEADER = struct.Struct("!I")
_SPEC_TIMEOUT_SECS = 10.0
_MAX_NETNS = 64  # plugins whose network namespace a zygote keeps


def _stdlib_dirs():
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}
    return tuple(d + os.sep for d in dirs)


def _pop_sandbox_modules():
    """Take engine/process/sandbox.py and the siblings it imported (the `_PACKAGE` modules) out of sys.modules (a
    fresh interpreter would not have them), and the importer cached for its directory; returns them."""
    popped = {name: sys.modules.pop(name) for name in list(sys.modules)
              if name == _PACKAGE or name.startswith(_PACKAGE + ".")}
    for directory in getattr(popped.get(_PACKAGE), "__path__", ()):
        sys.path_importer_cache.pop(directory, None)
    return popped


def _check_preloaded():
    """Every module this zygote loaded beyond the baseline must be the interpreter's own stdlib (not a file a
    PYTHONPATH entry shadows it with): otherwise children would see a module a fresh interpreter would not load."""
    stdlib = _stdlib_dirs()
    for name in set(sys.modules) - _BASELINE:
        path = getattr(sys.modules[name], "__file__", None)
        if path and not os.path.realpath(path).startswith(stdlib):
            return f"module {name} loaded from {path}, outside the stdlib"
    return None


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("reply socket closed before the spec arrived")
        buf += chunk
    return bytes(buf)


def _send(sock, obj):
    try:
        sock.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass  # the worker gave up on this call; the child is reaped anyway


def _serve(ctl, sandbox):
    """Fork children on request. Returns only inside a forked child: (spec, fds) for a child forked for a call,
    or (None, socket) for the spare child, which then waits on that socket for its call. `fds` are the call's
    stdin, stdout, stderr, then the keeper's done pipe, then (exec mode) the exec error pipe.

    One spare child is forked ahead of time, so a call does not wait for fork(): it is handed the call's fds and
    spec. A spare has never run anything but this loop's fork, and it has already joined a fresh cgroup (made
    here, limits written when its call arrives): joining a cgroup v1 hierarchy waits for an RCU grace period,
    ~1 ms back to back but ~12 ms once the machine has idled, and a spare pays it while it waits.

    A call is answered with its child's pid, then `{"rc", "oom"}` as soon as the keeper reports the hook's status
    on the done pipe (the namespace is empty by then; its teardown finishes after the answer), or when the child
    is reaped. The call's cgroup is removed after the child is reaped, off the call's path.
    """
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, None)
    children = {}  # pidfd -> [pid, reply socket or None once answered, cgroups, done pipe read end or None]
    draining = False
    spare = None  # (pid, socket to it, its cgroups, the sandbox shape it entered ahead or None, limits written)
    # The child running the call that took the last spare: the next spare is made once it has answered, so that
    # preparing it (fork, cgroup join, namespaces) does not compete with the running hook for the CPU.
    waiting = None
    shape = None  # the last call's (sandbox.shape_of): what the next spare prepares
    last_limits = ()  # the last call's cgroup limits: written into the next spare's cgroup ahead of its call
    leftover = []  # cgroups still busy when their call was reaped
    netns = {}  # plugin directory -> descriptor of its empty network namespace (sandbox.make_netns), newest last
    cgroups = sandbox.cgroups if sandbox is not None else None

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
        pid, sock, paths, _shape, _limits = spare
        sock.close()  # EOF: the spare exits
        os.waitpid(pid, 0)
        remove(paths)

    def answer(child, status):
        nonlocal waiting
        if child is waiting:
            waiting = None
        pid, reply, paths, _done = child
        if reply is None:
            return
        try:
            rc = os.waitstatus_to_exitcode(status)
        except ValueError:
            rc = -_SIGKILL
        _send(reply, {"rc": rc, "oom": bool(paths) and sandbox._oom_killed(tuple(paths))})
        reply.close()
        child[1] = None

    def exit_now():
        """The worker is gone (or we retired): end the calls still running, as PDEATHSIG would, and leave no cgroup
        behind (what stays busy is removed by the next process that finds it, engine/process/sandbox.py _remove_stale)."""
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

    while True:
        if spare is None and not draining and waiting is None:
            paths = cgroups.prepare() if cgroups is not None and cgroups.available() else ()
            # Likely the next call's too (same plugin): checked, and rewritten if not, when the call arrives.
            written = last_limits if paths and last_limits and cgroups.limit(paths, *last_limits) else ()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
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
                return None, (theirs, shape)
            theirs.close()
            if pid is None:
                ours.close()
                remove(paths)
            else:
                spare = (pid, ours, paths, shape, written)
        if leftover:
            retry, leftover[:] = list(leftover), []
            remove(retry)
        for key, _ in sel.select(0.5 if leftover else None):
            if key.data is None:
                try:
                    msg, anc, _flags, _addr = ctl.recvmsg(_HEADER.size, socket.CMSG_SPACE(8 * 4))
                except InterruptedError:
                    continue
                if not msg:  # the worker is gone: children die with us (PDEATHSIG), the spare on EOF
                    exit_now()
                fds = array.array("i")
                for level, kind, data in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
                if len(fds) not in (4, 5):
                    for fd in fds:
                        os.close(fd)
                    if not fds and _HEADER.unpack(msg)[0] == 0:  # retired: finish the running hooks, then exit
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
                    spec = json.loads(_recv_exact(reply, _HEADER.unpack(msg)[0]))
                    box = spec["sandbox"]
                    limits = tuple(box.get("cgroup_limits") or ())
                    call_shape = sandbox.shape_of(sandbox.SandboxSpec.from_dict(box))
                    if spare is not None:
                        pid, sock, paths, spare_shape, spare_limits = spare
                        spare = None
                        try:
                            if os.waitpid(pid, os.WNOHANG)[0]:
                                raise OSError("the spare child died")
                            if spare_shape is not None and spare_shape != call_shape:
                                raise OSError("the spare entered namespaces of another shape")
                            if spare_limits and not limits:
                                raise OSError("the spare's cgroup has limits this call does not")
                            if limits and limits != spare_limits and not cgroups.limit(paths, *limits):
                                raise OSError("cannot write the cgroup limits")
                            to_send = passed
                            if spare_shape is not None:
                                spec["kept"] = sandbox.kept_dirs(sandbox.SandboxSpec.from_dict(box))  # seen here
                                to_send = [*fds[1:4], *fds[4:]]
                                if box.get("new_net") and not spare_shape[0]:  # not in a user namespace: see
                                    plugin = box["cwd"]                       # sandbox.make_netns
                                    if plugin in netns:
                                        netns[plugin] = netns.pop(plugin)
                                        spec["netns"] = len(to_send)
                                        to_send = [*to_send, netns[plugin]]
                                    else:
                                        make_netns_for = plugin
                            raw = json.dumps(spec).encode()
                            sock.sendmsg([_HEADER.pack(len(raw))],
                                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", to_send))])
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
                    _send(reply, {"error": f"{type(exc).__name__}: {exc}"})
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
                _send(reply, {"pid": pid})
                if make_netns_for is not None:  # for the plugin's next calls (this one made its own)
                    fd = sandbox.make_netns()
                    if fd is not None:
                        netns[make_netns_for] = fd
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


def _await_call(sock):
    """In the spare child: wait for the call's fds and spec; exit quietly if the zygote retires or dies first."""
    try:
        msg, anc, _flags, _addr = sock.recvmsg(_HEADER.size, socket.CMSG_SPACE(8 * 4))
        if not msg:
            os._exit(0)
        fds = array.array("i")
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
        spec = json.loads(_recv_exact(sock, _HEADER.unpack(msg)[0]))
    except BaseException:  # noqa: BLE001 - the zygote went away mid-hand-over
        os._exit(0)
    sock.close()
    return spec, list(fds)


def _die(message, code):
    try:
        os.write(2, message.encode("utf-8", "replace"))
    finally:
        os._exit(code)


def _setup_child(spec, fds, zygote_pid, sandbox, extras_top):
    """Popen(start_new_session=True, close_fds=True) and the runner's preexec function (sandbox.enter), in order.
    In exec mode, returns (after the sandbox) the exec error pipe, and the rest is the caller's."""
    os.setsid()
    done, exec_error = fds[3], (fds[4] if len(fds) > 4 else None)
    _take_stdio(fds[:3], (done, exec_error))
    box = sandbox.SandboxSpec.from_dict(spec["sandbox"])
    try:
        sandbox.enter(box, zygote_pid, done)  # returns in the hook's own process
    except Exception as exc:  # noqa: BLE001 - as the runner's preexec function: the hook never starts
        _die(f"sandbox setup failed in the child: {exc}\n", sandbox.SETUP_FAILED)
    if "argv" in spec:
        return exec_error
    _as_python_main(spec, box, extras_top)
    return None


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


def _prepared_spare(sock, shape, zygote_pid, sandbox):
    """A spare child entering its namespaces before its call (sandbox.pre_enter): it becomes the call's keeper, and
    this returns (spec, exec error fd or None) in the hook's own process once the call arrived, its stdio taken and
    its sandbox complete. A spare that cannot prepare exits: the call is then forked on demand."""
    os.setsid()
    try:
        spec, fds = sandbox.pre_enter(shape, zygote_pid, sock, _await_call)
    except BaseException:  # noqa: BLE001
        os._exit(0)
    exec_error = fds[3] if "argv" in spec else None
    _take_stdio(fds[:3], (exec_error,))
    try:
        sandbox.enter_hook(spec)
    except Exception as exc:  # noqa: BLE001 - as the runner's preexec function: the hook never starts
        _die(f"sandbox setup failed in the child: {exc}\n", sandbox.SETUP_FAILED)
    return spec, exec_error


def _as_python_main(spec, box, extras_top):
    """The rest of a python hook's start: environment, sys.argv, sys.path[0], preloaded modules it shadows."""
    _pop_sandbox_modules()
    spec["env"] = box.env
    os.environ.clear()
    os.environ.update(spec["env"])
    if hasattr(sys.modules.get("time"), "tzset"):
        sys.modules["time"].tzset()

    script = spec["script"]
    old0 = sys.path[0] if sys.path else None
    if not getattr(sys.flags, "safe_path", False):
        script_dir = os.path.dirname(os.path.realpath(script))
        if sys.path:
            sys.path[0] = script_dir
        else:
            sys.path.insert(0, script_dir)
        sys.path_importer_cache.pop(old0, None)
        # A module the zygote preloaded but the script's own directory shadows (a local json.py): a fresh interpreter
        # would import the local file, so forget every preloaded module and let imports run as they would.
        if _shadows_preloaded(script_dir, extras_top):
            for name in list(sys.modules):
                if name not in _BASELINE and name != "__main__":
                    del sys.modules[name]
    sys.argv = [script]
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = [spec["launcher"], script]


def _shadows_preloaded(directory, names):
    """Whether `directory` holds a module or package named like one of `names` (one listdir, then exact checks)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return False
    return any(entry.partition(".")[0] in names and _shadowed(entry.partition(".")[0], directory)
               for entry in entries)


def _shadowed(name, directory):
    try:
        found = PathFinder.find_spec(name, [directory])
    except (ImportError, ValueError, OSError):
        return False
    return found is not None and found.origin is not None and found.loader is not None


def _run_main(spec):
    """Run the script as __main__ the way the interpreter's pymain does for `python script.py`; never returns."""
    script = spec["script"]
    try:
        with open(script, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        _die(f"{spec['launcher']}: can't open file {script!r}: [Errno {exc.errno}] {exc.strerror}\n", 2)
    main = types.ModuleType("__main__")
    main.__dict__.update({
        "__loader__": SourceFileLoader("__main__", script), "__spec__": None, "__annotations__": {},
        "__builtins__": builtins, "__file__": script, "__cached__": None,
    })
    sys.modules["__main__"] = main
    forked_modules = set(sys.modules)
    interrupted = False
    try:
        code = compile(source, script, "exec", dont_inherit=True)
        del source
        exec(code, main.__dict__)
        status = 0
    except SystemExit as exc:
        status = _system_exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - printed and exit status set like an uncaught exception
        tb = exc.__traceback__.tb_next if not isinstance(exc, SyntaxError) else None
        exc.__traceback__ = tb  # the script's frames only, as the interpreter prints them
        try:
            sys.excepthook(type(exc), exc, tb)
        except BaseException:  # noqa: BLE001
            pass
        interrupted = isinstance(exc, KeyboardInterrupt)
        status = 1
        del exc, tb
    _finalize(status, main, forked_modules, interrupted)


def _system_exit_status(exc):
    """What the interpreter makes of an uncaught SystemExit (Python/pythonrun.c handle_system_exit)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code  # the kernel keeps the low 8 bits, as for the interpreter's exit()
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _clear_module(module):
    """CPython's _PyModule_ClearDict: names starting with one underscore first, then the rest, __builtins__ last."""
    d = getattr(module, "__dict__", None)
    if not isinstance(d, dict):
        return
    for names in ([k for k in d if isinstance(k, str) and k.startswith("_") and not k.startswith("__")],
                  [k for k in d if not (isinstance(k, str) and k == "__builtins__")]):
        for k in names:
            try:
                d[k] = None
            except Exception:  # noqa: BLE001
                pass


def _flush_std(status):
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None:
            continue
        try:
            stream.flush()
        except Exception as exc:  # noqa: BLE001 - reported like the interpreter does, exit status 120
            try:
                os.write(2, f"Exception ignored in: {stream!r}\n{type(exc).__name__}: {exc}\n".encode())
            except OSError:
                pass
            if name == "stdout" and status == 0:
                status = 120
    return status


def _finalize(status, main, forked_modules, interrupted):
    """Py_FinalizeEx for what the script created, then _exit.

    The interpreter's own finalization would tear down every module the zygote preloaded too, writing to (and so
    copying) every shared page: ~6 ms per call. Objects that existed at fork time are frozen (gc.freeze) and
    belong to no script, so only the script's own are finalized, in the interpreter's order: non-daemon threads
    joined, atexit callbacks, std streams flushed, the script's modules cleared (destructors run, files it left
    open are flushed and closed), cycles collected, std streams flushed again.
    """
    threading = sys.modules.get("threading")
    if threading is not None and hasattr(threading, "_shutdown"):
        try:
            threading._shutdown()
        except BaseException:  # noqa: BLE001
            pass
    import atexit
    atexit._run_exitfuncs()
    status = _flush_std(status)
    new = [m for name, m in list(sys.modules.items()) if name not in forked_modules]
    sys.modules["__main__"] = None
    _clear_module(main)
    del main
    for module in reversed(new):
        _clear_module(module)
    del new
    gc.collect()
    status = _flush_std(status)
    if interrupted:
        import signal
        signal.signal(_SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), _SIGINT)
    os._exit(status)


def _load_sandbox(path):
    """engine/process/sandbox.py as `_PACKAGE`.sandbox: its directory becomes a bare package of its own (no engine
    package, no __init__ run), so that it and its stdlib-only siblings import each other relatively."""
    import importlib
    from importlib.machinery import ModuleSpec
    from importlib.util import module_from_spec

    found = ModuleSpec(_PACKAGE, None, is_package=True)
    found.submodule_search_locations = [os.path.dirname(os.path.abspath(path))]
    sys.modules[_PACKAGE] = module_from_spec(found)
    return importlib.import_module(f"{_PACKAGE}.{os.path.splitext(os.path.basename(path))[0]}")


def _exec(spec, exec_error):
    """Exec mode: become the hook's own program, as subprocess.Popen's child does (signals Python ignores back to
    their defaults). An exec failure goes back to the worker as an errno on the exec error pipe."""
    import signal

    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    argv = spec["argv"]
    try:
        os.execve(argv[0], argv, spec["sandbox"]["env"])
    except OSError as exc:
        try:
            os.write(exec_error, str(exc.errno or 0).encode())
        finally:
            os._exit(127)


def _main(exec_mode=False):
    """Serve python hooks (the zygote) or, with `exec_mode`, exec any hook's program (engine/process/hook_spawner.py: the
    worker never forks itself for a cold hook). Returns in a child, with its spec."""
    ctl = socket.socket(fileno=int(sys.argv[1]))
    problem = None if exec_mode else _check_preloaded()
    sandbox = None
    if not problem:
        try:
            sandbox = _load_sandbox(sys.argv[2])
        except Exception as exc:  # noqa: BLE001 - reported in the handshake: hooks then spawn normally
            problem = f"cannot load the sandbox module: {type(exc).__name__}: {exc}"
    if not problem and not exec_mode:  # what the sandbox module imported must be this interpreter's stdlib too
        loaded = _pop_sandbox_modules()
        problem = _check_preloaded()
        sys.modules.update(loaded)
    if problem or not hasattr(os, "pidfd_open") or not hasattr(os, "waitstatus_to_exitcode"):
        ctl.send(json.dumps({"ready": False, "why": problem or "python too old for warm start"}).encode())
        os._exit(3)
    extras_top = frozenset(n.partition(".")[0] for n in set(sys.modules) - _BASELINE
                           if getattr(sys.modules[n], "__file__", None))
    zygote_pid = os.getpid()
    sandbox.cgroups.available()  # found (and stale leftovers removed) once, before the first child
    gc.collect()
    if hasattr(gc, "freeze"):
        gc.freeze()  # keep the collector from touching (and un-sharing) the zygote's pages in every child
    ctl.send(json.dumps({"ready": True, "pid": zygote_pid}).encode())
    spec, fds = _serve(ctl, sandbox)
    exec_error = None
    try:
        if spec is not None:  # forked on demand for a call
            exec_error = _setup_child(spec, fds, zygote_pid, sandbox, extras_top)
        elif fds[1] is None:  # a plain spare child
            spec, fds = _await_call(fds[0])
            exec_error = _setup_child(spec, fds, zygote_pid, sandbox, extras_top)
        else:  # a spare that entered its namespaces ahead of its call
            spec, exec_error = _prepared_spare(fds[0], fds[1], zygote_pid, sandbox)
            if "argv" not in spec:
                _as_python_main(spec, sandbox.SandboxSpec.from_dict(spec["sandbox"]), extras_top)
    except BaseException as exc:  # noqa: BLE001 - like a failing preexec: the hook never starts
        _die(f"warm start: sandbox setup failed in the child: {type(exc).__name__}: {exc}\n", 126)
    if exec_mode:
        _exec(spec, exec_error)
    return spec


if __name__ == "__main__":
    _spec = _main()
    del _main, _serve, _setup_child
    _run_main(_spec)
