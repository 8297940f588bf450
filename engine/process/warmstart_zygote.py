"""The warm-start zygote: run as a *script* by the resolved python launcher (never imported by the worker).

It starts once per interpreter (and per set of start-up environment variables), preloads a few stdlib modules and
engine/process/sandbox.py (argv[2]: stdlib only, loaded with its siblings as a package of their own, `_PACKAGE`,
outside the engine package), then waits on a SOCK_SEQPACKET control socket (engine/process/zygote_serve.py). Each
request carries, as SCM_RIGHTS, a reply socket and the hook's stdin/stdout/stderr pipe ends; the JSON spec (script
and the runner's SandboxSpec) follows on the reply socket (engine/process/zygote_wire.py). The zygote forks; the
child (engine/process/zygote_child.py) takes a new session and its stdio, applies the sandbox with the same function
as a spawned hook (sandbox.enter: PDEATHSIG, cgroup, namespaces, mounts, rlimits, capabilities, cwd; the hook itself
ends up forked below the namespace's init), sets the cleared environment, sys.argv, sys.path[0] and a fresh
`__main__`, and runs the script (here: `_run_main`). The zygote reports the child's pid, then its exit status (the
hook's, mirrored), on the reply socket. Single-threaded on purpose: fork() from a threaded process is unsafe.

A spare child is forked ahead of each call, already in a cgroup of its own; once a call has shown the service's
sandbox shape, the next spare also enters it ahead (sandbox.pre_enter: namespaces, covered home, init, the hook's
process waiting for its call), so the call's path has no fork left. Run by engine/process/hook_spawner.py, the same
loop execs any hook's program instead of running a python script (exec mode, cold hooks).

No imports from the engine package (engine/process/sandbox.py and the zygote's own modules are loaded as `_PACKAGE`
modules), compatible with any CPython >= 3.9 on Linux.
"""

import sys

_BASELINE = frozenset(sys.modules)  # what a fresh interpreter of this launcher has loaded before any script runs

import builtins  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402  (preloaded for hooks: the one module nearly every python hook imports)
import json.decoder  # noqa: E402,F401
import json.encoder  # noqa: E402,F401
import os  # noqa: E402
import socket  # noqa: E402
import sysconfig  # noqa: E402
import types  # noqa: E402
from importlib.machinery import PathFinder, SourceFileLoader  # noqa: E402

_SIGINT = 2
_PACKAGE = "librefang_process"  # engine/process/ as the zygote loads it (`_load`), not the engine package


def _stdlib_dirs():
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}
    return tuple(d + os.sep for d in dirs)


# The `_PACKAGE` modules, named once in the zygote (`main`): a child pops them by name, as iterating sys.modules
# would write to (and so copy) the page of every module's name. Once popped they are kept here: freeing them would
# write to every page they are on.
_SANDBOX_MODULES = []
_POPPED = []
# The signal that tells a python hook's init it is done (engine/process/sandbox_tree.py HOOK_DONE): sent only by pid 2
# of its own PID namespace, to its init (pid 1).
_DONE_SIGNAL = []


def _pop_sandbox_modules():
    """Take the `_PACKAGE` modules (engine/process/sandbox.py with its siblings, and the zygote's own) out of
    sys.modules (a fresh interpreter would not have them), and the importer cached for their directory; returns
    them."""
    popped = {name: sys.modules.pop(name) for name in _SANDBOX_MODULES if name in sys.modules}
    for directory in getattr(popped.get(_PACKAGE), "__path__", ()):
        sys.path_importer_cache.pop(directory, None)
    return popped


def _check_preloaded():
    """Every module this zygote loaded beyond the baseline must be the interpreter's own stdlib (not a file a
    PYTHONPATH entry shadows it with): otherwise children would see a module a fresh interpreter would not load."""
    stdlib = _stdlib_dirs()
    for name in set(sys.modules) - _BASELINE:
        if name == _PACKAGE or name.startswith(_PACKAGE + "."):
            continue  # ours, taken out of sys.modules before a hook runs (`_pop_sandbox_modules`)
        path = getattr(sys.modules[name], "__file__", None)
        if path and not os.path.realpath(path).startswith(stdlib):
            return f"module {name} loaded from {path}, outside the stdlib"
    return None


def _load(name, directory):
    """engine/process/<name>.py as `_PACKAGE`.<name>: `directory` becomes a bare package of its own (no engine package,
    no __init__ run), so that the stdlib-only modules there import each other relatively."""
    import importlib
    from importlib.machinery import ModuleSpec
    from importlib.util import module_from_spec

    package = sys.modules.get(_PACKAGE)
    if package is None:
        found = ModuleSpec(_PACKAGE, None, is_package=True)
        found.submodule_search_locations = [directory]
        package = sys.modules[_PACKAGE] = module_from_spec(found)
    if directory not in package.__path__:
        raise ImportError(f"{directory} is not {package.__path__[0]}, where the zygote runs from")
    return importlib.import_module(f"{_PACKAGE}.{name}")


_HERE = os.path.dirname(os.path.abspath(__file__))
_loop = _load("zygote_serve", _HERE)  # the zygote's loop
_child = _load("zygote_child", _HERE)  # its child, from the fork to the hook


def _as_python_main(spec, extras_top):
    """The rest of a python hook's start: environment, sys.argv, sys.path[0], preloaded modules it shadows."""
    _POPPED.append(_pop_sandbox_modules())
    spec["env"] = spec["sandbox"]["env"]
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


def _rehearse(sandbox):
    """In a prepared hook's process, before its call arrives: go through the steps between a call's arrival and the
    end of the script once with a made-up call and script, so that the pages they write (reference counts of the
    objects they use, the interpreter's caches, allocator pools) are copied from the zygote now rather than on the
    call's path, where each copy-on-write fault would delay the hook (bench/warm_timeline.py --faults counts them).
    What it sets, the call sets again (`_as_python_main`: environment, sys.argv, sys.path[0]); it imports nothing
    and leaves nothing cached, and the zygote's modules it pops stay out."""
    script = os.path.join(_HERE, "librefang-rehearsal.py")  # never read: compiled from _REHEARSAL_SOURCE
    env = {f"LIBREFANG_REHEARSAL_{i}": "x" * 40 for i in range(16)}
    call = {"sandbox": {"cwd": _HERE, "env": env, "rlimits": [["RLIMIT_NPROC", 129, 129]], "isolate": True,
                        "user_ns": True, "new_net": True, "hide": "/nonexistent", "keep": [_HERE, _HERE],
                        "read_only": False, "writable": [_HERE], "cgroups": [], "cgroup_limits": [1 << 30, 130],
                        "uid": 0, "gid": 0, "hook_uid": -1, "hook_gid": -1, "conceal": [_HERE, _HERE],
                        "tmp_mb": 1024, "seccomp": False},
            "script": script, "launcher": sys.executable, "netns": 3, "kept": [[_HERE, _HERE, True]]}
    call = json.loads(json.dumps(call))
    sandbox.SandboxSpec.from_dict(call["sandbox"])
    # The sandbox's last steps, to no effect: binding the kept directories back, the identity calls
    # (engine/process/sandbox_spare.py `rehearse`), the ctypes paths of capset (sandbox_enter.py; the capability
    # check and the bounding set ran for real before this, in pre_enter).
    sandbox.rehearse()
    lib = sandbox.libc()
    if lib is not None:
        lib.mount(None, os.fsencode("/nonexistent/librefang-rehearsal"), None, 0, None)  # ENOENT
        ctypes = sys.modules.get("ctypes")
        if ctypes is not None:
            (ctypes.c_uint32 * 2)(0, 0)
            (ctypes.c_uint32 * 6)()
            ctypes.get_errno()
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    os.close(fd)
    os.path.relpath(_HERE, "/")
    _as_python_main(call, frozenset())  # (nothing shadowed: no preloaded module is forgotten)
    main = _new_main(script)
    forked_modules = set(sys.modules)  # as `_run_main` and `_finalize` go through sys.modules
    [m for name, m in list(sys.modules.items()) if name not in forked_modules]
    exec(compile(_REHEARSAL_SOURCE, script, "exec", dont_inherit=True), main.__dict__)
    _clear_module(main)
    del main
    _flush_std(0)  # nothing written: nothing to flush
    gc.collect()


_REHEARSAL_SOURCE = """
import json
import sys

def answer(request):
    items = [str(k) for k in request]
    return {"type": "ok", "items": items, "n": len(items)}

request = json.loads('{"agent_id": "a", "message": "m", "n": [1, 2.5, null, true]}')
text = json.dumps(answer(request))
"""


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
        _child.die(f"{spec['launcher']}: can't open file {script!r}: [Errno {exc.errno}] {exc.strerror}\n", 2)
    main = _new_main(script)
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


def _new_main(script):
    main = types.ModuleType("__main__")
    main.__dict__.update({
        "__loader__": SourceFileLoader("__main__", script), "__spec__": None, "__annotations__": {},
        "__builtins__": builtins, "__file__": script, "__cached__": None,
    })
    return main


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
    copying) every shared page, in every call. Objects that existed at fork time are frozen (gc.freeze) and
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
    if status == 0 and _DONE_SIGNAL and os.getpid() == 2:
        # Our namespace's init (native/spare.c init_main, or sandbox_tree.py `_init`): done, exit 0. Its report goes
        # out while the kernel frees this process's memory; the worker sees our stdio closed now rather than after.
        os.closerange(0, 3)
        try:
            os.kill(1, _DONE_SIGNAL[0])
        except OSError:
            pass
    os._exit(status)


def main(exec_mode=False):
    """Serve python hooks (the zygote) or, with `exec_mode`, exec any hook's program (engine/process/hook_spawner.py: the
    worker never forks itself for a cold hook). Returns in a child, with its spec."""
    ctl = socket.socket(fileno=int(sys.argv[1]))
    _child.forget_inherited_signals()
    problem = None if exec_mode else _check_preloaded()
    sandbox = None
    if not problem:
        try:
            sandbox = _load("sandbox", os.path.dirname(os.path.abspath(sys.argv[2])))
        except Exception as exc:  # noqa: BLE001 - reported in the handshake: hooks then spawn normally
            problem = f"cannot load the sandbox module: {type(exc).__name__}: {exc}"
    if not problem and not exec_mode:  # what the sandbox module imported must be this interpreter's stdlib too
        problem = _check_preloaded()
    if problem or not hasattr(os, "pidfd_open") or not hasattr(os, "waitstatus_to_exitcode"):
        ctl.send(json.dumps({"ready": False, "why": problem or "python too old for warm start"}).encode())
        os._exit(3)
    extras_top = frozenset(n.partition(".")[0] for n in set(sys.modules) - _BASELINE
                           if getattr(sys.modules[n], "__file__", None))
    _SANDBOX_MODULES[:] = [name for name in sys.modules if name == _PACKAGE or name.startswith(_PACKAGE + ".")]
    zygote_pid = os.getpid()
    sandbox.cgroups.available()  # found (and stale leftovers removed) once, before the first child
    sandbox.seccomp_filter()  # compiled once, before the first child (every hook loads it)
    if sandbox.libc() is not None:
        sandbox.has_mount_setattr(sandbox.libc())  # asked once, before the first child (every view needs it)
    gc.collect()
    if hasattr(gc, "freeze"):
        gc.freeze()  # keep the collector from touching (and un-sharing) the zygote's pages in every child
    ctl.send(json.dumps({"ready": True, "pid": zygote_pid}).encode())
    spare_program = _loop.native_spare.program() if exec_mode else None  # engine/process/native_spare.py
    if not exec_mode:  # hooks' init: the same program's init mode, beside the hook (sandbox_tree.py)
        sandbox.use_native_init(_loop.native_spare.program())
    forked = _loop.ZygoteLoop(ctl, sandbox, spare_program, exec_mode).run()  # returns in a child only
    try:
        spec, exec_error = _child.become(forked, zygote_pid, sandbox, None if exec_mode else lambda: _rehearse(sandbox))
        if "argv" not in spec:
            if spec["sandbox"].get("isolate"):  # below our init (sandbox_tree.py), in a PID namespace of its own
                _DONE_SIGNAL.append(sandbox.HOOK_DONE)
            _as_python_main(spec, extras_top)
    except BaseException as exc:  # noqa: BLE001 - like a failing preexec: the hook never starts
        _child.die(f"warm start: sandbox setup failed in the child: {type(exc).__name__}: {exc}\n", 126)
    if exec_mode:
        _child.exec_hook(spec, exec_error)
    return spec


if __name__ == "__main__":
    _spec = main()
    del main, _loop
    _run_main(_spec)
