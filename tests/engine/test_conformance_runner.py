"""Runner and sandbox conformance (engine/process/runner.py, engine/process/sandbox.py): the one-shot protocol plus hostile hooks
(escapes, floods, detached children), each with an exact classified outcome. Every case spawns a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine import protocol as P
from engine.process.runner import BLOCKED_ENV_VARS
from engine.process.sandbox import network_isolation_available
from engine.protocol import EmptyOutput, parse_output
from tests.engine.helpers import pid_alive, run
from tests.waiting import wait_until


@pytest.fixture(params=["isolated", "degraded"])
def spawn_mode(request, monkeypatch):
    """Spawned hooks (no zygote) in their own namespaces (engine/process/sandbox.py), or without them as on an OS that refuses
    namespaces: the protocol behaves the same. (Python hooks may also come from the warm-start zygote.)"""
    from engine.process import sandbox

    monkeypatch.setenv("LIBREFANG_WARM_START", "0")
    if request.param == "degraded":
        monkeypatch.setenv("LIBREFANG_SANDBOX_NAMESPACES", "0")
    sandbox.forget_probe()
    yield request.param
    monkeypatch.undo()
    sandbox.forget_probe()


@pytest.fixture
def pdir(tmp_path) -> Path:
    d = tmp_path / "plug"
    d.mkdir()
    return d


# ---- output parsing: the last stdout line that parses as JSON wins ----

def test_it_picks_the_last_json_line():
    assert parse_output('log line\n{"a": 1}\nmore log\n') == {"a": 1}
    assert parse_output('{"first": 1}\n{"second": 2}\n') == {"second": 2}


def test_it_accepts_any_json_type_and_wraps_plain_text():
    assert parse_output("42\n") == 42
    assert parse_output('"just a string"') == "just a string"
    assert parse_output("just plain text\nsecond line") == {"text": "just plain text\nsecond line"}


def test_it_calls_blank_stdout_empty_output():
    with pytest.raises(EmptyOutput):
        parse_output("  \n\n")


def test_it_reports_empty_output_as_a_classified_failure(pdir):
    r = run(pdir, "import sys; sys.stdin.read()")
    assert not r.ok and r.failure.kind == P.EMPTY_OUTPUT


# ---- the request on stdin, env, cwd, data dir ----

ENV_DUMP = """
import json, os, sys
req = json.loads(sys.stdin.readline())
print(json.dumps({"req": req, "env": dict(os.environ), "cwd": os.getcwd()}))
"""


def test_it_sends_one_json_line_then_closes_stdin(pdir):
    src = """
    import sys
    data = sys.stdin.read()
    print(__import__("json").dumps({"raw": data}))
    """
    r = run(pdir, src, {"type": "ingest", "message": "héllo", "agent_id": "a1"})
    assert r.ok
    assert r.reply["raw"].endswith("\n") and r.reply["raw"].count("\n") == 1
    assert json.loads(r.reply["raw"]) == {"type": "ingest", "message": "héllo", "agent_id": "a1"}


def test_it_clears_the_environment_and_sets_librefang_vars_in_order(spawn_mode, pdir, monkeypatch):
    monkeypatch.setenv("SERVICE_SECRET", "do-not-leak")
    monkeypatch.setenv("PYTHONIOENCODING", "utf-8")
    monkeypatch.setenv("ALLOWED_ONE", "from-service")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "never")
    r = run(pdir, ENV_DUMP, {"type": "ingest", "message": "msg", "agent_id": "agent-7"},
            plugin_env={"FROM_ENV": "x", "ALLOWED_ONE": "from-manifest", "LIBREFANG_RUNTIME": "forged"},
            allowed_env_vars=("ALLOWED_ONE", "DJANGO_SECRET_KEY"))
    env = r.reply["env"]
    assert "SERVICE_SECRET" not in env
    assert env["LIBREFANG_AGENT_ID"] == "agent-7"
    assert env["LIBREFANG_MESSAGE"] == "msg"
    assert env["LIBREFANG_PLUGIN_DIR"] == str(pdir)
    assert env["LIBREFANG_PLUGIN_DATA_DIR"] == str(pdir.parent / "data")
    assert env["PATH"] == os.environ["PATH"]
    assert env["HOME"] == str(pdir.parent / "data")  # the hook's own home: its data directory (docs/security.md)
    assert env["PYTHONIOENCODING"] == "utf-8"  # python passthrough list
    assert env["FROM_ENV"] == "x"
    assert env["LIBREFANG_RUNTIME"] == "forged"  # [env] comes after the LIBREFANG_ vars (later wins)
    assert env["ALLOWED_ONE"] == "from-service"  # allowed_env_vars come last (docs/compatibility.md)
    assert "DJANGO_SECRET_KEY" not in env and "DJANGO_SECRET_KEY" in BLOCKED_ENV_VARS


def test_it_caps_librefang_message_at_64_kib_but_sends_the_whole_message_on_stdin(pdir):
    big = "é" * 100_000  # 200 KB of UTF-8: over Linux's 128 KiB single-env-string limit
    r = run(pdir, ENV_DUMP, {"type": "ingest", "message": big, "agent_id": "a"})
    assert r.ok, r.failure
    assert len(r.reply["env"]["LIBREFANG_MESSAGE"].encode()) == 65536
    assert r.reply["req"]["message"] == big


def test_it_runs_in_the_plugin_dir_with_a_writable_data_dir(pdir):
    src = """
    import json, os, sys
    sys.stdin.read()
    p = os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "state.txt")
    open(p, "w").write("kept")
    print(json.dumps({"cwd": os.getcwd()}))
    """
    r = run(pdir, src)
    assert r.reply == {"cwd": str(pdir)}
    assert (pdir.parent / "data" / "state.txt").read_text() == "kept"


# ---- path checks on every call ----

def test_it_rejects_parent_dir_components(pdir):
    (pdir.parent / "evil.py").write_text("print('{}')")
    for script in ("../evil.py", "hooks/../../evil.py"):
        r = run(pdir, None, name=script)
        assert r.failure.kind == P.PATH_TRAVERSAL, script


def test_it_rejects_a_symlink_that_escapes_the_plugin_dir(pdir):
    outside = pdir.parent / "outside.py"
    outside.write_text("print('{}')")
    (pdir / "hooks").mkdir()
    (pdir / "hooks" / "link.py").symlink_to(outside)
    r = run(pdir, None, name="hooks/link.py")
    assert r.failure.kind == P.PATH_TRAVERSAL


def test_it_reports_a_missing_script_before_looking_for_the_launcher(pdir):
    r = run(pdir, None, name="hooks/nope.py", runtime="vlang")
    assert r.failure.kind == P.SCRIPT_NOT_FOUND


# ---- exits ----

def test_it_classifies_a_non_zero_exit_with_stderr(pdir):
    r = run(pdir, "import sys; sys.stdin.read(); print('boom', file=sys.stderr); sys.exit(42)")
    assert r.failure.kind == P.SCRIPT_ERROR and r.failure.exit_code == 42
    assert r.failure.message == "exit code 42: boom"


@pytest.mark.parametrize("sig,label", [(signal.SIGSEGV, "SIGSEGV"), (signal.SIGKILL, "OOM-killed or SIGKILL"),
                                       (signal.SIGTERM, "killed by SIGTERM")])
def test_it_classifies_death_by_signal(pdir, sig, label):
    r = run(pdir, f"import os, sys; sys.stdin.read(); os.kill(os.getpid(), {int(sig)})")
    assert r.failure.kind == P.SCRIPT_ERROR and r.failure.signal == sig
    assert r.failure.message.startswith(label)


# ---- hostile hooks: each ends within its timeout with a classified failure ----

def test_it_kills_a_hook_that_never_exits(pdir):
    t = time.monotonic()
    r = run(pdir, "import time\nwhile True: time.sleep(1)", timeout=1)
    assert r.failure.kind == P.TIMEOUT
    assert time.monotonic() - t < 10


def marked_pids(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (a hook's own pids are its namespace's, not ours)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read() and pid_alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_it_kills_the_whole_process_group_on_timeout(spawn_mode, pdir):
    marker = f"grandchild-{os.getpid()}-{time.monotonic_ns()}"
    src = f"""
    import subprocess, sys, time
    sys.stdin.read()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
    time.sleep(300)
    """
    r = run(pdir, src, timeout=2)
    assert r.failure.kind == P.TIMEOUT
    wait_until(lambda: marked_pids(marker), 5, f"the grandchild {marker} gone", until=lambda pids: not pids)


def test_it_returns_promptly_when_a_grandchild_keeps_the_pipes_open(pdir):
    src = """
    import json, subprocess, sys
    sys.stdin.read()
    subprocess.Popen(["sleep", "300"])  # inherits stdout/stderr
    print(json.dumps({"memories": [{"content": "done"}]}), flush=True)
    """
    t = time.monotonic()
    r = run(pdir, src, timeout=20)
    assert r.ok and r.reply == {"memories": [{"content": "done"}]}
    assert time.monotonic() - t < 10


def test_it_copes_with_a_hook_that_ignores_stdin(pdir):
    src = "import json; print(json.dumps({'ok': True}))"
    r = run(pdir, src, {"type": "ingest", "message": "x" * 2_000_000, "agent_id": "a"})
    assert r.ok and r.reply == {"ok": True}


def test_it_times_out_a_hook_that_closes_stdout_early_and_hangs(pdir):
    src = """
    import os, sys, time
    sys.stdin.read()
    os.close(1)
    time.sleep(300)
    """
    r = run(pdir, src, timeout=1)
    assert r.failure.kind == P.TIMEOUT


def test_it_survives_invalid_utf8(pdir):
    src = r"""
    import sys
    sys.stdin.read()
    sys.stdout.buffer.write(b"\xff\xfe bad \xc3\x28\n")
    sys.stderr.buffer.write(b"err \xff\n")
    """
    lines = []
    r = run(pdir, src, on_stderr=lines.append)
    assert r.ok and r.reply == {"text": "\ufffd\ufffd bad \ufffd("}
    assert lines == ["err \ufffd"]


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_it_kills_endless_output_at_the_1_mib_cap_without_waiting_for_the_timeout(pdir, stream):
    src = f"""
    import sys
    sys.stdin.read()
    while True:
        sys.{stream}.write("x" * 65536)
    """
    t = time.monotonic()
    r = run(pdir, src, timeout=60)
    assert r.failure.kind == P.OUTPUT_OVERFLOW
    assert f"more than 1048576 bytes on {stream}" in r.failure.message
    assert time.monotonic() - t < 30


# ---- stderr streaming ----

def test_it_streams_stderr_lines_while_the_hook_runs(pdir, tmp_path):
    flag = pdir.parent / "data" / "flag"  # (in its data directory: the hook sees nothing else of ours)
    src = f"""
    import json, os, sys, time
    sys.stdin.read()
    print("  indented line", file=sys.stderr, flush=True)
    print("", file=sys.stderr, flush=True)
    while not os.path.exists({str(flag)!r}):
        time.sleep(0.02)
    print(json.dumps({{"saw": "flag"}}))
    """
    seen = []

    def on_line(line):
        seen.append(line)
        flag.write_text("1")  # only possible if the line arrived before the hook exited

    r = run(pdir, src, timeout=20, on_stderr=on_line)
    assert r.ok and r.reply == {"saw": "flag"}
    assert seen == ["  indented line"]


# ---- resource limits ----

def test_it_applies_max_memory_mb_as_a_real_rlimit(spawn_mode, pdir):
    src = """
    import json, sys
    sys.stdin.read()
    hog = bytearray(400 * 1024 * 1024)
    print(json.dumps({"allocated": len(hog)}))
    """
    r = run(pdir, src, max_memory_mb=100)
    assert r.failure.kind == P.SCRIPT_ERROR
    assert r.failure.message.startswith("memory limit exceeded (max_memory_mb=100)")
    assert "MemoryError" in r.stderr
    assert run(pdir, src, max_memory_mb=1024).ok


def test_it_applies_max_cpu_secs(spawn_mode, pdir):
    r = run(pdir, "import sys\nsys.stdin.read()\nwhile True: pass", timeout=30, max_cpu_secs=1)
    assert r.failure.kind == P.SCRIPT_ERROR and r.failure.signal == signal.SIGXCPU
    assert r.failure.message.startswith("CPU time limit exceeded (max_cpu_secs=1)")


# ---- network ----

CONNECT = """
import json, os, socket, sys
port = json.loads(sys.stdin.readline())["port"]
try:
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
    out = "connected"
except OSError as exc:
    out = type(exc).__name__
print(json.dumps({"net": out, "proxy": os.environ.get("http_proxy"), "sandbox": os.environ.get("LIBREFANG_SANDBOX")}))
"""


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv.getsockname()[1]
    srv.close()


def test_it_denies_network_when_allow_network_is_false(spawn_mode, pdir, listener):
    if not network_isolation_available():
        pytest.skip("this OS refuses unshare(CLONE_NEWNET) to the service (needs root or CAP_SYS_ADMIN)")
    r = run(pdir, CONNECT, {"port": listener}, allow_network=False)
    assert r.ok, r.failure
    assert r.reply["net"] != "connected"
    assert r.reply["proxy"] == "" and r.reply["sandbox"] == "1"


def test_it_allows_network_when_allow_network_is_true(pdir, listener):
    r = run(pdir, CONNECT, {"port": listener}, allow_network=True)
    assert r.reply == {"net": "connected", "proxy": None, "sandbox": None}


# ---- the worker dies: its hooks die with it ----

def test_it_kills_running_hooks_when_the_worker_is_sigkilled(spawn_mode, pdir, tmp_path):
    marker = f"hook-{os.getpid()}-{time.monotonic_ns()}"  # the hook is found on the host by its marker
    script = (f"import os, sys, time\n"
              f"os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)', {marker!r}])\n")
    (pdir / "hooks").mkdir()
    (pdir / "hooks" / "hook.py").write_text(script)
    driver = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from pathlib import Path
        from engine.process.runner import PROCESS, HookCall
        from engine.process.runtimes import resolve_tag
        PROCESS.run(HookCall(Path({str(pdir)!r}), "hooks/hook.py", resolve_tag("python"), {{}}, 300))
    """)
    worker = subprocess.Popen([sys.executable, "-c", driver])
    try:
        wait_until(lambda: marked_pids(marker), 30, f"the hook {marker} running")
        [hook_pid] = marked_pids(marker)
        worker.kill()
        worker.wait(10)
        wait_until(lambda: not pid_alive(hook_pid), 10, f"the hook (pid {hook_pid}) gone with its worker")
    finally:
        worker.kill()


# ---- per-plugin virtualenv ----

def test_it_runs_python_hooks_with_the_plugins_venv(pdir, tmp_path):
    venv = pdir.parent / "data" / "venv"  # where engine/plugins/requirements.py makes it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    src = "import json, os, sys\nsys.stdin.read()\nprint(json.dumps([sys.prefix, os.environ['VIRTUAL_ENV']]))"
    r = run(pdir, src, venv_dir=venv)
    assert r.reply == [str(venv), str(venv)]
    r = run(pdir, src + "", venv_dir=None)
    assert r.failure is not None or r.reply[0] != str(venv)


def test_allow_filesystem_false_makes_everything_but_the_data_dir_read_only(pdir, tmp_path):
    from engine.process.runner import filesystem_isolation_available

    if not filesystem_isolation_available():
        pytest.skip("this OS refuses a private mount namespace to the service (needs root or CAP_SYS_ADMIN)")
    outside = tmp_path / "outside.txt"
    src = f"""
    import json, os, sys, tempfile
    sys.stdin.read()
    out = {{}}
    for name, path in [("outside", {str(outside)!r}), ("plugin_dir", "written.txt"),
                       ("data", os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "ok.txt"))]:
        try:
            open(path, "w").write("x")
            out[name] = "written"
        except OSError as exc:
            out[name] = exc.strerror
    with tempfile.NamedTemporaryFile(dir=None) as fh:
        out["tmp"] = os.path.dirname(fh.name)
    out["home"] = os.environ["HOME"]
    out["marker"] = os.environ.get("LIBREFANG_READONLY_FS")
    print(json.dumps(out))
    """
    r = run(pdir, src, allow_filesystem=False, plugin_env={"HOME": "/custom"})
    assert r.ok, (r.failure, r.stderr)
    # (`outside` is below /tmp, where the hook has a private tmpfs of its own: no entry of ours to write into)
    assert r.reply.pop("outside") in ("Read-only file system", "Permission denied")
    assert r.reply == {"plugin_dir": "Read-only file system", "data": "written",
                       "tmp": str(pdir.parent / "data" / "tmp"), "home": "/dev/null", "marker": "1"}
    assert not outside.exists() and (pdir.parent / "data" / "ok.txt").exists()
    r = run(pdir, src, plugin_env={"HOME": "/custom"})  # allow_filesystem = true reads more, never writes more
    assert r.reply["outside"] in ("Read-only file system", "Permission denied") and not outside.exists()
    assert r.reply["home"] == "/custom" and r.reply["marker"] is None
