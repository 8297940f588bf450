"""Warm start (engine/process/warmstart.py): python hooks forked from a zygote behave exactly like spawned ones.

Every case runs real hooks through engine.process.runner PROCESS, the runtime the worker uses, in both modes.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from engine import protocol as P
from engine.home import Home
from engine.invoke import hook_call_for
from engine.plugins.catalog import Catalog
from engine.process import sandbox, warmstart
from engine.process.runner import PROCESS, HookCall
from engine.process.runtimes import resolve_tag
from tests.engine.test_conformance_runner import marked_pids
from tests.plugin_factory import make_plugin
from tests.waiting import wait_until

PROBE = r'''
"""probe docstring"""
import json, os, resource, signal, sys
req = json.loads(sys.stdin.read())
print("probe on stderr", file=sys.stderr)
state = {
    "globals": sorted(globals()),
    "dunders": [__name__, __doc__, __package__, repr(__spec__), type(__loader__).__name__, __file__, __cached__],
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "executable": sys.executable,
    "flags": repr(sys.flags), "cwd": os.getcwd(), "env": dict(os.environ), "umask": os.umask(0o022),
    "leader": [os.getpgid(0) == os.getpid(), os.getsid(0) == os.getpid()],
    "signals": {s.name: repr(signal.getsignal(s)) for s in signal.Signals
                if s not in (signal.SIGKILL, signal.SIGSTOP)},
    "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "stdio": [[s.encoding, s.errors, s.line_buffering, s.seekable(), s.isatty(), s.fileno()]
              for s in (sys.stdin, sys.stdout, sys.stderr)],
    "limits": [resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NOFILE)],
    "fds": sorted(os.listdir("/proc/self/fd")),
    "netns": os.readlink("/proc/self/ns/net"),
    "main_is_us": sys.modules["__main__"].__dict__ is globals(),
    "req": req,
}
print(json.dumps(state))
'''


pytestmark = pytest.mark.usefixtures("fresh_zygotes")


def _plugin(tmp_path: Path, source: str, name: str = "hook.py") -> Path:
    pdir = tmp_path / "plug"
    pdir.mkdir(exist_ok=True)
    (pdir / name).write_text(textwrap.dedent(source).lstrip())
    return pdir


def _call(pdir: Path, script: str = "hook.py", request=None, **kw) -> HookCall:
    kw.setdefault("timeout_secs", 30)
    return HookCall(plugin_dir=pdir, script=script, runtime=resolve_tag("python"),
                    request=request if request is not None else {"agent_id": "a1", "message": "hi"},
                    data_dir=pdir.parent / "data", **kw)


def _run(call: HookCall, warm: bool, monkeypatch, lines: list | None = None):
    monkeypatch.setenv("LIBREFANG_WARM_START", "1" if warm else "0")
    return PROCESS.run(call, on_stderr=(lines.append if lines is not None else None))


# A hook runs below its PID namespace's init (engine/process/sandbox.py), a fork of whatever started it: the zygote's command
# line there says the hook was forked warm. Which zygote served a call is counted on our side (`_served`).
WARM_PROBE = ("import json, sys\nsys.stdin.read()\n"
              "print(json.dumps({'warm': b'warmstart_zygote' in open('/proc/self/cmdline', 'rb').read()}))\n")


def _warm_probe(tmp_path):
    return _plugin(tmp_path, WARM_PROBE)


def _served() -> dict[int, int]:
    with warmstart._lock:
        return {z.pid: z.calls for z in warmstart._zygotes.values() if z.alive()}


def test_it_forks_python_hooks_from_a_zygote(tmp_path, monkeypatch):
    pdir = _warm_probe(tmp_path)
    first = _run(_call(pdir), True, monkeypatch)
    second = _run(_call(pdir), True, monkeypatch)
    assert first.ok and second.ok, (first.failure, second.failure)
    pids = warmstart.zygote_pids()
    assert len(pids) == 1
    assert first.reply == second.reply == {"warm": True}
    assert _served() == {pids[0]: 2}


def test_it_gives_a_forked_hook_exactly_the_process_a_spawned_one_gets(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, PROBE)
    for call_kw in ({}, {"max_memory_mb": 512, "max_cpu_secs": 7, "allow_network": False},
                    {"allow_network": True, "plugin_env": {"LANG": "C.UTF-8", "PYTHONIOENCODING": "latin-1"}}):
        lines_cold: list[str] = []
        lines_warm: list[str] = []
        cold = _run(_call(pdir, **call_kw), False, monkeypatch, lines_cold)
        warm = _run(_call(pdir, **call_kw), True, monkeypatch, lines_warm)
        assert cold.ok and warm.ok, (cold.failure, warm.failure, warm.stderr)
        cold_state, warm_state = dict(cold.reply), dict(warm.reply)
        netns = (cold_state.pop("netns"), warm_state.pop("netns"))
        assert cold_state == warm_state
        assert lines_cold == lines_warm == ["probe on stderr"]
        own_netns = os.readlink("/proc/self/ns/net")
        if call_kw.get("allow_network") is False:
            assert own_netns not in netns  # both in a fresh, empty namespace
        else:
            assert netns == (own_netns, own_netns)
    assert len(warmstart.zygote_pids()) == 2  # PYTHONIOENCODING/LANG change start-up: a zygote of their own


def test_it_keeps_no_state_between_calls(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, """
        import json, sys, helper
        sys.stdin.read()
        seen = getattr(json, "touched", 0)
        json.touched = seen + 1
        helper.COUNT += 1
        print(json.dumps({"seen": seen, "count": helper.COUNT, "loaded": "helper" in sys.modules}))
    """)
    (pdir / "helper.py").write_text("COUNT = 0\n")
    replies = [_run(_call(pdir), True, monkeypatch).reply for _ in range(3)]
    assert replies == [{"seen": 0, "count": 1, "loaded": True}] * 3


def test_it_lets_a_plugin_file_shadow_a_preloaded_stdlib_module(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, """
        import sys
        import json
        sys.stdin.read()
        print(json.dumps({"mine": json.MINE}))
    """)
    (pdir / "json.py").write_text("MINE = True\ndef dumps(obj):\n    return '{\"mine\": true}'\n")
    cold = _run(_call(pdir), False, monkeypatch)
    warm = _run(_call(pdir), True, monkeypatch)
    assert cold.ok and warm.ok, (cold.failure, warm.failure)
    assert cold.reply == warm.reply == {"mine": True}


def test_it_reports_crashes_exits_and_tracebacks_as_a_spawned_hook_would(tmp_path, monkeypatch):
    cases = {
        "raise ValueError('boom')\n": None,
        "import sys\nsys.exit(3)\n": None,
        "import sys\nsys.exit('fatal: no config')\n": None,
        "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n": None,
        "def broken(:\n": None,
        "import sys\nsys.stdin.read()\nprint('not json at all')\n": None,
        "import sys\nsys.stdin.read()\n": None,
    }
    for source in cases:
        pdir = _plugin(tmp_path, source)
        cold = _run(_call(pdir), False, monkeypatch)
        warm = _run(_call(pdir), True, monkeypatch)
        assert (cold.ok, cold.returncode, cold.stdout) == (warm.ok, warm.returncode, warm.stdout), source
        assert (cold.failure and cold.failure.to_dict()) == (warm.failure and warm.failure.to_dict()), source
        assert cold.stderr == warm.stderr, source


def test_it_runs_atexit_joins_threads_and_flushes_files_left_open(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, """
        import atexit, json, os, sys, threading, time
        sys.stdin.read()
        out = open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "left-open.txt"), "w")
        out.write("buffered, never closed")
        class Noisy:
            def __del__(self, write=sys.stderr.write):
                write("finalizer ran\\n")
        keep = Noisy()
        def late():
            time.sleep(0.2)
            print(json.dumps({"from": "thread"}))
        threading.Thread(target=late).start()
        atexit.register(lambda: print("atexit ran", file=sys.stderr))
    """)
    data = tmp_path / "data" / "left-open.txt"
    for warm in (False, True):
        data.unlink(missing_ok=True)
        result = _run(_call(pdir), warm, monkeypatch)
        assert result.ok, result.failure
        assert result.reply == {"from": "thread"}
        assert data.read_text() == "buffered, never closed"
        assert result.stderr.splitlines() == ["atexit ran", "finalizer ran"]


def test_it_kills_the_whole_group_on_timeout(tmp_path, monkeypatch):
    marker = tmp_path / "grandchild-alive"
    pdir = _plugin(tmp_path, f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60); open({str(marker)!r}, 'w').write('x')"])
        print("started", file=sys.stderr, flush=True)
        time.sleep(60)
    """)
    lines: list[str] = []
    started = time.monotonic()
    result = _run(_call(pdir, timeout_secs=1.5), True, monkeypatch, lines)
    assert time.monotonic() - started < 10
    assert not result.ok and result.failure.kind == P.TIMEOUT
    assert lines == ["started"]
    assert warmstart.zygote_pids()
    # Found by the marker in its command line: a survivor would still be there after the wait (it lives 60 s).
    wait_until(lambda: marked_pids(str(marker)), 10, "the hook's grandchild killed with its group",
               until=lambda pids: not pids)
    assert not marker.exists()


def test_it_enforces_the_memory_limit_in_a_forked_hook(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, """
        import sys
        sys.stdin.read()
        hog = bytearray(400 * 1024 * 1024)
        print('{"survived": true}')
    """)
    result = _run(_call(pdir, max_memory_mb=128), True, monkeypatch)
    assert warmstart.zygote_pids()
    assert not result.ok
    assert "MemoryError" in result.stderr
    assert "memory limit exceeded" in result.failure.message


def test_it_still_refuses_path_traversal(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, "print('{}')\n")
    (tmp_path / "outside.py").write_text("print('{\"escaped\": true}')\n")
    (pdir / "link.py").symlink_to(tmp_path / "outside.py")
    for script in ("../outside.py", "link.py"):
        result = _run(_call(pdir, script=script), True, monkeypatch)
        assert not result.ok and result.failure.kind == P.PATH_TRAVERSAL


def test_it_restarts_a_dead_zygote_and_never_fails_the_call(tmp_path, monkeypatch):
    pdir = _warm_probe(tmp_path)
    assert _run(_call(pdir), True, monkeypatch).ok
    [old] = warmstart.zygote_pids()
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: not _alive(old), 10, f"the SIGKILLed zygote {old} dead")
    after_crash = _run(_call(pdir), True, monkeypatch)
    assert after_crash.ok, after_crash.failure
    again = _run(_call(pdir), True, monkeypatch)
    [new] = warmstart.zygote_pids()
    assert new != old and _served() == {new: 2} and again.reply == {"warm": True}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before open, or between open and read (ESRCH)
        return False


def test_it_is_off_when_disabled_globally(tmp_path, monkeypatch):
    pdir = _warm_probe(tmp_path)
    result = _run(_call(pdir), False, monkeypatch)
    assert result.ok and result.reply == {"warm": False}
    assert warmstart.zygote_pids() == []


def test_it_is_off_for_a_plugin_that_says_warm_start_false(tmp_path, monkeypatch):
    home = Home(tmp_path / "home")
    make_plugin(home.plugins_dir, "cold", {"ingest": WARM_PROBE}, toml_extra="warm_start = false")
    make_plugin(home.plugins_dir, "warm", {"ingest": WARM_PROBE})
    catalog = Catalog(home)
    monkeypatch.setenv("LIBREFANG_WARM_START", "1")
    warm = {}
    for name in ("cold", "warm"):
        call = hook_call_for(catalog.get(name), "ingest", {"agent_id": "a", "message": "m"}, home)
        assert isinstance(call, HookCall)
        result = PROCESS.run(call)
        assert result.ok, result.failure
        warm[name] = result.reply["warm"]
    assert warm == {"cold": False, "warm": True}
    assert list(_served().values()) == [1]


def test_it_does_not_apply_to_other_runtimes(tmp_path, monkeypatch):
    pdir = tmp_path / "sh"
    pdir.mkdir()
    (pdir / "hook.sh").write_text('read -r line\necho "{\\"shell\\": \\"$BASH_VERSION\\"}"\n')
    call = HookCall(plugin_dir=pdir, script="hook.sh", runtime=resolve_tag("bash"), request={}, timeout_secs=30)
    result = _run(call, True, monkeypatch)
    assert result.ok and result.reply["shell"]
    assert warmstart.zygote_pids() == []


def test_it_keeps_zygote_stdio_out_of_the_hook(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, """
        import json, os, sys
        sys.stdin.read()
        print(json.dumps({"fds": sorted(int(f) for f in os.listdir("/proc/self/fd"))}))
    """)
    result = _run(_call(pdir), True, monkeypatch)
    assert result.ok
    assert result.reply["fds"] == [0, 1, 2, 3]  # 3: the directory listing itself
    json.dumps(result.reply)


def test_it_falls_back_to_a_spawn_when_pythonpath_shadows_a_preloaded_module(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, """
        import json, os, sys
        sys.stdin.read()
        print(json.dumps({}))
        print("warm", b"warmstart_zygote" in open("/proc/self/cmdline", "rb").read(), file=sys.stderr)
    """)
    shadow = pdir / "shadow"  # (the hook sees its own directories only)
    shadow.mkdir()
    (shadow / "json.py").write_text("SHADOW = True\ndef loads(s):\n    return {}\ndef dumps(o):\n    return '{\"shadow\": true}'\n")
    result = _run(_call(pdir, plugin_env={"PYTHONPATH": str(shadow)}), True, monkeypatch)
    assert result.ok, result.failure
    assert result.reply == {"shadow": True}  # the module a fresh interpreter imports, not the zygote's stdlib json
    assert result.stderr.strip() == "warm False"  # a plugin's PYTHONPATH never reaches a zygote: spawned normally
    assert warmstart.zygote_pids() == []


def test_it_lets_running_hooks_finish_when_a_zygote_is_evicted(tmp_path, monkeypatch):
    monkeypatch.setattr(warmstart, "MAX_ZYGOTES", 1)
    pdir = _plugin(tmp_path, """
        import json, os, sys, time
        req = json.loads(sys.stdin.read())
        time.sleep(req.get("sleep", 0))
        print(json.dumps({"warm": b"warmstart_zygote" in open("/proc/self/cmdline", "rb").read()}))
    """)
    import threading

    slow: list = []
    runner_thread = threading.Thread(target=lambda: slow.append(
        _run(_call(pdir, request={"sleep": 2}), True, monkeypatch)))
    runner_thread.start()
    [first] = wait_until(warmstart.zygote_pids, 20, "the zygote of the slow call started")
    wait_until(_served, 20, f"the slow hook forked by zygote {first}", until=lambda served: served == {first: 1})
    other = _run(_call(pdir, request={}, plugin_env={"TZ": "Pacific/Kiritimati"}), True, monkeypatch)
    assert other.ok and other.reply == {"warm": True}
    [second] = warmstart.zygote_pids()  # `first` was evicted ...
    assert second != first and _served() == {second: 1}
    runner_thread.join(30)
    assert slow[0].ok, slow[0].failure  # ... but its running hook (forked by `first`) finished normally
    assert slow[0].reply == {"warm": True}
    wait_until(lambda: not _alive(first), 10, f"the evicted zygote {first} exited once its hook was done")


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _the_spare(zygote: int) -> int:
    """The one child the zygote forked ahead for the next call. The spare is made after the last call answered, and
    that call's keeper is reaped a little later: for a moment the only child can be the old keeper, about to exit.
    A spare stays, and in a sandbox it has its own init made ahead: wait until one such child is seen twice."""
    last: list[int | None] = [None]

    def probe() -> dict:
        kids = _children_of(zygote)
        ready = kids[0] if len(kids) == 1 and (_children_of(kids[0]) or sandbox.mode() is None) else None
        steady = ready is not None and ready == last[0]
        last[0] = ready
        return {"children": kids, "spare": ready if steady else None}

    return wait_until(probe, 10, f"one spare child of zygote {zygote}, the same in two probes 0.1 s apart",
                      until=lambda seen: seen["spare"] is not None, every=0.1)["spare"]


def test_it_forks_on_demand_when_the_spare_child_died(tmp_path, monkeypatch):
    pdir = _warm_probe(tmp_path)
    assert _run(_call(pdir), True, monkeypatch).ok
    [zygote] = warmstart.zygote_pids()
    spare = _the_spare(zygote)
    os.kill(spare, signal.SIGKILL)
    wait_until(lambda: not _alive(spare), 10, f"the SIGKILLed spare {spare} dead")  # a zombie until the next call
    result = _run(_call(pdir), True, monkeypatch)
    assert result.ok, result.failure
    assert result.reply == {"warm": True} and _served() == {zygote: 2}
    assert warmstart.zygote_pids() == [zygote]


def test_a_hook_prepared_ahead_of_its_call_gets_the_same_process(tmp_path, monkeypatch):
    # From the second call on, the zygote's spare has entered the sandbox and rehearsed the hook's start before the
    # call came (engine/process/warmstart_zygote.py `_rehearse`): none of that shows.
    pdir = _plugin(tmp_path, PROBE.replace('"req": req,', '"req": req, "modules": sorted(sys.modules),'))
    cold = _run(_call(pdir), False, monkeypatch)
    assert cold.ok, cold.failure
    expected = dict(cold.reply)
    expected.pop("modules")
    for _ in range(3):
        warm = _run(_call(pdir), True, monkeypatch)
        assert warm.ok, (warm.failure, warm.stderr)
        state = dict(warm.reply)
        modules = state.pop("modules")
        assert state == expected
        assert not [m for m in modules if m.startswith("librefang")]
        assert not [k for k in state["env"] if "REHEARSAL" in k]


def test_a_hook_that_says_it_is_done_is_held_to_it(tmp_path, monkeypatch):
    # A warm hook tells its init "done, exit 0" (HOOK_DONE) as it exits (warmstart_zygote.py `_finalize`); one that
    # says so and goes on is killed there and then: the call ends with what it wrote, nothing left running. The first
    # call is forked on demand or from a plain spare, the next ones from spares prepared ahead.
    pdir = _plugin(tmp_path, """
        import json, os, signal, sys, time
        sys.stdin.read()
        print(json.dumps({"said": "done"}), flush=True)
        if os.getpid() == 2:
            os.kill(1, signal.SIGCONT)
        time.sleep(60)
        print(json.dumps({"said": "more"}), flush=True)
    """)
    (pdir / "first.py").write_text(WARM_PROBE)
    assert _run(_call(pdir, "first.py"), True, monkeypatch).ok
    for _ in range(3):
        result = _run(_call(pdir, timeout_secs=30), True, monkeypatch)
        assert result.ok, (result.failure, result.stderr)
        assert result.reply == {"said": "done"}


def test_only_the_hook_itself_can_say_it_is_done(tmp_path, monkeypatch):
    pdir = _plugin(tmp_path, """
        import json, os, signal, sys, time
        sys.stdin.read()
        child = os.fork()
        if child == 0:
            try:
                os.kill(1, signal.SIGCONT)  # not the hook: init ignores it
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        time.sleep(0.2)
        print(json.dumps({"pid": os.getpid()}), flush=True)
        sys.exit(5)
    """)
    (pdir / "first.py").write_text(WARM_PROBE)
    assert _run(_call(pdir, "first.py"), True, monkeypatch).ok
    for _ in range(3):
        result = _run(_call(pdir), True, monkeypatch)
        assert not result.ok and result.failure.exit_code == 5, result.failure
        assert json.loads(result.stdout) == {"pid": 2}
