"""The cold-hook spawner's native spare (engine/process/native_spare.py, engine/process/native/spare.c): once the
spawner has seen the service's sandbox shape, cold hooks run below the C program, and a hook cannot tell it from the
python spare it replaces. The hostile-hook tests of tests/engine/test_sandbox.py run against both (`mode`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine.process import hook_view, native_spare, sandbox, sandbox_plan, warmstart
from engine.process.runner import PROCESS, HookCall
from engine.process.runtimes import resolve_tag
from engine.process.zygote_wire import send_call
from tests.engine.test_warmstart import PROBE

pytestmark = [pytest.mark.skipif(sandbox.mode() is None, reason="this OS refuses namespaces to the tests"),
              pytest.mark.usefixtures("fresh_zygotes")]

# pid 1 of the hook's namespace is its init: the native program, or a fork of the python spawner.
INIT_PROBE = "import sys\nsys.stdin.read()\nprint(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[0].decode())\n"
VIEW_PROBE = """
import json, os, sys
sys.stdin.read()
out = {"init": open("/proc/1/cmdline", "rb").read().split(b"\\0")[0].decode()}
writable = {}  # mount point -> the mount seen there (the last one mounted on it)
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    writable[fields[4].replace(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "<data>")] = "ro" not in fields[5].split(",")
out["writable"] = sorted(point for point, rw in writable.items() if rw)
for path in ("/etc/shadow", "/etc/passwd"):
    try:
        out[path] = len(open(path).read())
    except OSError as exc:
        out[path] = exc.strerror
out["home"] = sorted(os.listdir(os.path.dirname(os.path.dirname(os.environ["LIBREFANG_PLUGIN_DIR"]))))
print(json.dumps(out))
"""


@pytest.fixture
def program():
    """The built program; a machine with a C compiler must have it (`make setup` builds it)."""
    path = native_spare.program()
    if path is None:
        if shutil.which(os.environ.get("CC", "cc")):
            pytest.fail("engine/process/native/librefang-spare is missing or older than spare.c: run `make setup`")
        pytest.skip("no C compiler: cold hooks use the python spare")
    return path


def _plugin(home: Path, source: str) -> Path:
    pdir = home / "plugins" / "probe"
    (pdir / "hooks").mkdir(parents=True, exist_ok=True)
    (pdir / "hooks" / "hook.py").write_text(source)
    return pdir


def _cold(monkeypatch, native: bool | str, pdir: Path, home: Path, script: str = "hooks/hook.py",
          runtime: str = "python", **kw):
    """One cold call; `native`: whether the native spare may serve it, or the path of another build of it."""
    monkeypatch.setenv("LIBREFANG_WARM_START", "0")
    monkeypatch.setenv(native_spare.SWITCH, native if isinstance(native, str) else "1" if native else "0")
    call = HookCall(plugin_dir=pdir, script=script, runtime=resolve_tag(runtime),
                    request={"agent_id": "a1", "message": "hi"}, timeout_secs=30,
                    data_dir=home / "plugin_data" / "probe", home_dir=home, **kw)
    return PROCESS.run(call)


def test_cold_hooks_run_below_the_native_program_once_the_shape_is_known(tmp_path, monkeypatch, program):
    home = tmp_path / "lfhome"
    pdir = _plugin(home, INIT_PROBE)
    inits = []
    for _ in range(4):
        r = _cold(monkeypatch, True, pdir, home)
        assert r.ok, (r.failure, r.stderr)
        inits.append(r.stdout.strip())
    # the spawner's first spare is a plain fork (no shape seen yet); the ones made after a call are the program
    assert inits[0] != program and inits[2:] == [program, program], inits
    warmstart.shutdown()
    for _ in range(3):
        r = _cold(monkeypatch, False, pdir, home)
        assert r.ok, (r.failure, r.stderr)
        assert r.stdout.strip() != program


WARM_TREE_PROBE = """
import json, os, sys
sys.stdin.read()
init = open("/proc/1/cmdline", "rb").read().split(b"\\0")
print(json.dumps({"init": init[1].decode() if len(init) > 1 else "", "me": os.getpid(), "parent": os.getppid(),
                  "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}))
"""


def test_a_warm_hooks_init_is_the_programs_init_mode_beside_it(tmp_path, monkeypatch, program):
    """A warm hook (a fork of its zygote) runs beside init, not below it: init is the program's init mode (no fork
    of the zygote), the hook's parent its keeper outside the namespace (getppid() says 0). Without the program,
    init is a fork of the zygote and the hook's parent (pid 1)."""
    home = tmp_path / "lfhome"
    pdir = _plugin(home, WARM_TREE_PROBE)
    seen = {}
    for native in (True, False):
        monkeypatch.setenv("LIBREFANG_WARM_START", "1")
        monkeypatch.setenv(native_spare.SWITCH, "1" if native else "0")
        warmstart.shutdown()
        for _ in range(3):  # the first on demand, the next ones from prepared spares
            r = PROCESS.run(HookCall(plugin_dir=pdir, script="hooks/hook.py", runtime=resolve_tag("python"),
                                  request={}, timeout_secs=30, data_dir=home / "plugin_data" / "probe", home_dir=home))
            assert r.ok, (r.failure, r.stderr)
            assert r.reply["me"] == 2 and r.reply["pids"] == [1, 2], r.reply
            seen.setdefault(native, []).append((r.reply["init"], r.reply["parent"]))
    assert seen[True] == [("lfinit/1", 0)] * 3, seen
    assert all(parent == 1 and init != "lfinit/1" for init, parent in seen[False]), seen


def test_a_build_without_an_init_mode_leaves_warm_hooks_a_forked_init(tmp_path, monkeypatch, program):
    """A build from before the init mode (it answers 2 to "lfinit/1", as to any wire it does not know): the zygote
    asks once and its hooks' init stays a fork of it."""
    older = tmp_path / "librefang-spare-older"
    older.write_text("#!/bin/sh\nexit 2\n")
    older.chmod(0o755)
    home = tmp_path / "lfhome"
    pdir = _plugin(home, WARM_TREE_PROBE)
    monkeypatch.setenv("LIBREFANG_WARM_START", "1")
    monkeypatch.setenv(native_spare.SWITCH, str(older))
    warmstart.shutdown()
    for _ in range(3):
        r = PROCESS.run(HookCall(plugin_dir=pdir, script="hooks/hook.py", runtime=resolve_tag("python"), request={},
                              timeout_secs=30, data_dir=home / "plugin_data" / "probe", home_dir=home))
        assert r.ok, (r.failure, r.stderr)
        assert r.reply["parent"] == 1 and r.reply["init"] != "lfinit/1" and r.reply["pids"] == [1, 2], r.reply


@pytest.mark.parametrize("call_kw", [{}, {"max_memory_mb": 512, "max_cpu_secs": 7, "allow_network": False},
                                     {"allow_network": True, "plugin_env": {"LANG": "C.UTF-8", "X": "a b=c"}}],
                         ids=["defaults", "limits-no-network", "network-env"])
def test_a_hook_gets_the_same_process_from_the_native_and_the_python_spare(tmp_path, monkeypatch, program,
                                                                             call_kw):
    home = tmp_path / "lfhome"
    pdir = _plugin(home, PROBE)
    (home / "api_token").write_text("secret")  # a home to cover
    states = {}
    for native in (True, False):
        warmstart.shutdown()
        for _ in range(3):  # the last calls run in prepared spares
            r = _cold(monkeypatch, native, pdir, home, **call_kw)
            assert r.ok, (r.failure, r.stderr)
        state = dict(r.reply)
        netns = state.pop("netns")
        assert (netns == os.readlink("/proc/self/ns/net")) is (call_kw.get("allow_network") is not False)
        states[native] = state
    assert states[True] == states[False]


def test_a_build_without_mount_setattr_gives_hooks_the_same_view(tmp_path, monkeypatch, program):
    """Below Linux 5.12 (no mount_setattr) the program remounts each mount read-only and seals each cover itself;
    built that way, it gives a hook the same view as the usual build and the python spare."""
    remounts = tmp_path / "librefang-spare-remounts"
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-DLIBREFANG_NO_MOUNT_SETATTR", "-o", str(remounts),
                    native_spare.SOURCE], check=True)
    home = tmp_path / "lfhome"
    pdir = _plugin(home, VIEW_PROBE)
    (home / "api_token").write_text("secret")
    views = {}
    for native in (str(remounts), True, False):
        warmstart.shutdown()
        for _ in range(3):  # the last calls run in prepared spares
            r = _cold(monkeypatch, native, pdir, home)
            assert r.ok, (r.failure, r.stderr)
        views[native] = view = r.reply
        assert view.pop("init") == (native if native is not True else program) or native is False
    assert views[str(remounts)] == views[True] == views[False]
    assert sorted(views[True]["writable"]) == ["/dev/shm", "/proc", "/tmp", "<data>"]
    assert views[True]["home"] == ["plugin_data", "plugins"] and views[True]["/etc/shadow"] == "Permission denied"


def test_an_exec_failure_is_reported_as_from_the_python_spare(tmp_path, monkeypatch, program):
    home = tmp_path / "lfhome"
    pdir = _plugin(home, "print('{}')\n")
    (pdir / "hooks" / "tool").write_text("#!/nonexistent/interpreter\n")
    (pdir / "hooks" / "tool").chmod(0o755)
    outcomes = {}
    for native in (True, False):
        warmstart.shutdown()
        results = [_cold(monkeypatch, native, pdir, home, script="hooks/tool", runtime="native") for _ in range(3)]
        outcomes[native] = [(r.ok, r.failure) for r in results]
    assert not any(ok for ok, _ in outcomes[True])
    assert outcomes[True] == outcomes[False]


def test_the_call_is_encoded_field_by_field_and_a_nul_byte_is_refused():
    call = {"argv": ["/bin/echo", "hi"], "kept": [["/h/p", "/real/p", False], ["/h/d", "/h/d", True]],
            "sandbox": {"cwd": "/h/p", "env": {"A": "1", "B": ""}, "rlimits": [["RLIMIT_NOFILE", 64, 64]],
                        "new_net": True, "hook_uid": 1234, "hook_gid": 1235, "seccomp": True}}
    fields = native_spare.encode_call(call, 4).split(b"\0")
    assert fields == [b"K", b"/h/p", b"/real/p", b"0", b"K", b"/h/d", b"/h/d", b"1", b"N", b"4", b"U", b"1234",
                      b"1235", b"S", b"L", b"7", b"64", b"64", b"C", b"/h/p", b"A", b"/bin/echo", b"A", b"hi",
                      b"E", b"A=1", b"E", b"B=", b""]
    call["sandbox"]["env"]["C"] = "x\0K"
    with pytest.raises(OSError):  # the spawner then forks a python child, which refuses it as a spawn would
        native_spare.encode_call(call, None)


def _in_native_spare(program: str, plan: tuple, argv: list[str]) -> str:
    """What `argv` prints, run in a native spare started here for `plan` (no cgroup, no seccomp, no identity)."""
    shape = sandbox.shape_of(sandbox.SandboxSpec(cwd="/", isolate=True))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = native_spare.spawn(program, theirs, shape, plan, None, (), None)
    finally:
        theirs.close()
    pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, the exec error pipe
    try:
        assert native_spare.wait_ready(ours, 10)
        raw = native_spare.encode_call({"sandbox": {"cwd": "/", "env": {"PATH": "/usr/bin:/bin"}}, "argv": argv}, None)
        send_call(ours, len(raw), [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]])
        ours.sendall(raw)
        for _r, w in pipes:
            os.close(w)
        with os.fdopen(pipes[1][0], "rb") as out:
            said = out.read().decode()
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0  # (its keeper reported on `ours` first)
    finally:
        ours.close()
        for r, _w in (pipes[0], *pipes[2:]):
            os.close(r)
    return said


def test_the_program_makes_the_view_its_plan_says(tmp_path, program):
    """The native spare covers, masks and makes read-only what the plan it is given says (sandbox_plan.py), and
    nothing else of its own."""
    if sandbox.mode() != "root":
        pytest.skip("the service is not root here")
    covered, masked, shown = tmp_path / "covered", tmp_path / "masked.txt", tmp_path / "shown.txt"
    covered.mkdir()
    (covered / "secret").write_text("s")
    masked.write_text("m")
    shown.write_text("v")
    plan = sandbox_plan.view_plan(None, [str(covered), str(masked)], 0)
    script = (f"ls -A {covered}; cat {masked} 2>/dev/null || echo unreadable; cat {shown}; echo; "
              f"touch {tmp_path}/new 2>/dev/null || echo read-only")
    assert _in_native_spare(program, plan, ["/bin/sh", "-c", script]).split() == ["unreadable", "v", "read-only"]
    assert _in_native_spare(program, sandbox_plan.view_plan(None, [], 0), ["/bin/cat", str(masked)]) == "m"


def test_the_program_knows_no_path_nor_namespace_of_the_policy():
    """A policy change is made once, in python (engine/process/hook_view.py, sandbox_plan.py): the program's source
    names none of the paths it conceals or makes private, nor which namespaces a hook gets, and it refuses a plan's
    step it does not carry out (the spawner then keeps python spares)."""
    source = Path(native_spare.SOURCE).read_text()
    policy = [*sandbox_plan.PRIVATE_DIRS, *hook_view.CONCEALED_DIRS, *hook_view.CONCEALED_FILES]
    assert [path for path in policy if f'"{path}"' in source] == []
    assert re.findall(r"CLONE_NEW(?:NS|PID|IPC|UTS)\b", source) == []
    with pytest.raises(OSError):
        native_spare.encode_plan(((sandbox_plan.MOUNT_POINT, "/root/.pyenv"),))


def test_a_stale_or_foreign_build_is_not_used(tmp_path, monkeypatch, program):
    newer = tmp_path / "spare.c"
    newer.write_text("// edited after the build\n")
    os.utime(newer, (os.stat(program).st_mtime + 10,) * 2)
    monkeypatch.setattr(native_spare, "SOURCE", str(newer))
    assert native_spare.program() is None
    assert native_spare.program({native_spare.SWITCH: "0"}) is None
    other = subprocess.run([program, "lfspare/0", str(os.getpid()), "0", "0", "0", "0", "", "0", "0", "", "0"],
                           timeout=10)
    assert other.returncode == 2  # another wire: refused before anything (the spawner forks on demand instead)


@pytest.mark.parametrize("failure", ["exit 0", "exit 3", "exec sleep 30"], ids=["exits", "fails", "hangs-until-killed"])
def test_a_native_spare_that_cannot_prepare_leaves_the_call_to_a_python_child(tmp_path, monkeypatch, program,
                                                                               failure):
    broken, started = tmp_path / "broken-spare", tmp_path / "started"
    broken.write_text(f"#!/bin/sh\necho >> {started}\n{failure}\n")
    broken.chmod(0o755)
    home = tmp_path / "lfhome"
    pdir = _plugin(home, INIT_PROBE)
    for _ in range(7):  # the first call shows the shape; the next ones find a spare that never says it is ready
        r = _cold(monkeypatch, str(broken), pdir, home)
        assert r.ok, (r.failure, r.stderr)
        assert r.stdout.strip() not in (program, str(broken))
    assert len(started.read_text().splitlines()) <= 4  # after 3 failures in a row the spawner stopped trying


SIGNALS_PROBE = ("import json, signal, sys\nsys.stdin.read()\n"
                 "print(json.dumps({s: repr(signal.getsignal(getattr(signal, s))) for s in "
                 "('SIGHUP', 'SIGINT', 'SIGPIPE', 'SIGXFSZ', 'SIGUSR1', 'SIGTERM')}))\n")


def test_a_hook_gets_default_signals_whatever_the_service_was_started_with(tmp_path, monkeypatch, program):
    """`nohup librefang start` ignores SIGHUP in the service; no hook inherits that, warm, below the native spare or
    below the python one: each gets what a fresh python started with default signals has."""
    home = tmp_path / "lfhome"
    pdir = _plugin(home, SIGNALS_PROBE)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        seen = {}
        for mode in ("warm", "native", "python"):
            warmstart.shutdown()  # the zygote and the spawner start again, from this process as it is now
            for _ in range(3):  # the last calls run in prepared spares
                if mode == "warm":
                    monkeypatch.setenv("LIBREFANG_WARM_START", "1")
                    r = PROCESS.run(HookCall(plugin_dir=pdir, script="hooks/hook.py", runtime=resolve_tag("python"),
                                             request={}, timeout_secs=30, data_dir=home / "plugin_data" / "probe",
                                             home_dir=home))
                else:
                    r = _cold(monkeypatch, mode == "native", pdir, home)
                assert r.ok, (mode, r.failure, r.stderr)
            seen[mode] = r.reply
    finally:
        signal.signal(signal.SIGHUP, previous)
    fresh = json.loads(subprocess.run([sys.executable, "-c", SIGNALS_PROBE], input="", capture_output=True,
                                      text=True, check=True, preexec_fn=_default_signals).stdout)
    assert fresh["SIGHUP"] == "<Handlers.SIG_DFL: 0>"
    assert seen == {"warm": fresh, "native": fresh, "python": fresh}


def _default_signals():
    """A python started with every signal at its default (this test's own process may ignore more than SIGHUP: a
    shell's background job ignores SIGINT and SIGQUIT)."""
    for sig in signal.valid_signals():
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
