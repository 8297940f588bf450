"""The hook sandbox (engine/process/sandbox.py) through the real runner: hostile python and bash hooks, spawned and forked
from the warm-start zygote. A hook reaches only its own directories, sees no service process, and leaves no process
behind. Processes are found on the host by a unique marker in their command line."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine import protocol as P
from engine.home import Home
from engine.invoke import invoke
from engine.plugins.catalog import Catalog
from engine.plugins.lint import lint_plugin
from engine.process import native_spare, runner, sandbox, sandbox_libc, warmstart
from engine.process.runner import PROCESS, HookCall
from engine.process.runtimes import resolve_tag
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(sandbox.mode() is None, reason="this OS refuses namespaces to the tests")

SECRETS = ("api_token", "admin_password", "secret_key", "bus_key", "redis_password", "librefang.sqlite3",
           "librefang.sqlite3-wal", "librefang.sqlite3-shm", "plugins/other/hooks/ingest.py",
           "plugins/other/notes.txt", "plugin_data/other/state.json")


@pytest.fixture
def home(tmp_path) -> Path:
    """A $LIBREFANG_HOME with the service's secrets, another plugin and its data, and our plugin `mine`."""
    root = tmp_path / "lfhome"
    for rel in SECRETS:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"TOP-SECRET {rel}")
    (root / "plugins" / "mine" / "hooks").mkdir(parents=True)
    (root / "plugins" / "mine" / "kept.txt").write_text("mine")
    (root / "plugin_data" / "mine").mkdir(parents=True)
    (root / "plugin_data" / "mine" / "state.json").write_text('{"n": 1}')
    return root


@pytest.fixture(params=["warm", "warm-python-init", "cold", "cold-python-spare", "worker-spawned"])
def mode(request, monkeypatch, home):
    """warm: forked from the zygote, beside the native program as its init (engine/process/sandbox_tree.py
    `split_beside`); warm-python-init: below a fork of the zygote as init (a machine without a C compiler); cold:
    exec'd by the spawner, below its native spare (engine/process/native_spare.py) once primed; cold-python-spare: the
    same without the native program; worker-spawned: the fallback when the spawner is unavailable (Popen from the
    worker, `sandbox.enter` as its preexec function).

    A first call primes the helper: its next spare child enters this home's namespaces ahead of its call
    (engine/process/sandbox.py `pre_enter`), so every test's own calls run in a pre-entered sandbox, as a busy worker's do
    (the first call of a helper takes the plain path, `enter`, which test_a_helpers_first_call_is_contained_too
    covers)."""
    monkeypatch.setenv("LIBREFANG_WARM_START", "1" if request.param.startswith("warm") else "0")
    monkeypatch.setenv("LIBREFANG_SPAWNER", "0" if request.param == "worker-spawned" else "1")
    monkeypatch.setenv(native_spare.SWITCH, "0" if request.param.endswith("python-spare") or
                       request.param.endswith("python-init") else "1")
    warmstart.shutdown()
    primer = home / "plugins" / "primer"
    (primer / "hooks").mkdir(parents=True, exist_ok=True)
    (primer / "hooks" / "hook.py").write_text("import sys\nsys.stdin.read()\nprint('{}')\n")
    primed = PROCESS.run(HookCall(plugin_dir=primer, script="hooks/hook.py", runtime=resolve_tag("python"), request={},
                               timeout_secs=20, data_dir=home / "plugin_data" / "primer", home_dir=home))
    assert primed.ok, (primed.failure, primed.stderr)
    shutil.rmtree(primer)
    shutil.rmtree(home / "plugin_data" / "primer", ignore_errors=True)
    yield request.param
    warmstart.shutdown()


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_helpers_first_call_is_contained_too(home, warm, monkeypatch):
    monkeypatch.setenv("LIBREFANG_WARM_START", "1" if warm else "0")
    warmstart.shutdown()
    try:
        r = PROCESS.run(call(home, READ_EVERYTHING, request={"home": str(home), "secrets": list(SECRETS)}))
        assert r.ok, (r.failure, r.stderr)
        assert r.reply["read"] == {rel: "FileNotFoundError" for rel in SECRETS}
        assert r.reply["listing"] == ["plugin_data", "plugins"] and r.reply["up"] == ["plugin_data", "plugins"]
        assert r.reply["kept"] == "mine" and r.reply["state"] == '{"n": 1}'
    finally:
        warmstart.shutdown()


def call(home: Path, source: str, runtime: str = "python", request=None, **kw) -> HookCall:
    ext = {"python": "py", "bash": "sh"}[runtime]
    pdir = home / "plugins" / "mine"
    (pdir / "hooks" / f"hook.{ext}").write_text(textwrap.dedent(source).lstrip())
    return HookCall(plugin_dir=pdir, script=f"hooks/hook.{ext}", runtime=resolve_tag(runtime),
                    request=request if request is not None else {"home": str(home)},
                    timeout_secs=kw.pop("timeout_secs", 20), data_dir=home / "plugin_data" / "mine", home_dir=home,
                    **kw)


def marked_pids(marker: str) -> list[int]:
    """Live host processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{entry}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry))
        except OSError:
            pass
    return found


def gone(marker: str, within: float = 5.0) -> bool:
    return wait_until(lambda: marked_pids(marker), within, f"every process marked {marker} gone",
                      until=lambda pids: not pids) == []


# ---- files: $LIBREFANG_HOME holds only the plugin's own directories -------------------------------------------

READ_EVERYTHING = """
import json, os, sys
req = json.loads(sys.stdin.read())
home = req["home"]
out = {"read": {}, "listing": sorted(os.listdir(home))}
for rel in req["secrets"]:
    try:
        out["read"][rel] = open(os.path.join(home, rel)).read()
    except OSError as exc:
        out["read"][rel] = type(exc).__name__
out["kept"] = open("kept.txt").read()
out["state"] = open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "state.json")).read()
try:
    open("written-by-hook.txt", "w").write("x")
    out["plugin_dir"] = "written"
except OSError as exc:
    out["plugin_dir"] = exc.strerror
open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "written.txt"), "w").write("y")
try:
    os.chdir(".."); os.chdir(".."); out["up"] = sorted(os.listdir("."))
except OSError as exc:
    out["up"] = type(exc).__name__
print(json.dumps(out))
"""


def test_a_python_hook_reads_nothing_in_home_but_its_own_dirs(home, mode):
    r = PROCESS.run(call(home, READ_EVERYTHING, request={"home": str(home), "secrets": list(SECRETS)}))
    assert r.ok, (r.failure, r.stderr)
    assert r.reply["read"] == {rel: "FileNotFoundError" for rel in SECRETS}
    assert r.reply["listing"] == ["plugin_data", "plugins"] and r.reply["up"] == ["plugin_data", "plugins"]
    assert r.reply["kept"] == "mine" and r.reply["state"] == '{"n": 1}'
    # its own directories are the real ones: its data directory writable, its plugin directory read-only
    assert r.reply["plugin_dir"] == "Read-only file system"
    assert not (home / "plugins" / "mine" / "written-by-hook.txt").exists()
    assert (home / "plugin_data" / "mine" / "written.txt").read_text() == "y"
    assert r.warnings == []


def test_a_bash_hook_reads_nothing_in_home_but_its_own_dirs(home):
    src = """
    cat > /dev/null
    home="$(dirname "$(dirname "$LIBREFANG_PLUGIN_DIR")")"
    found=""
    for f in api_token admin_password secret_key librefang.sqlite3 plugins/other/notes.txt plugin_data/other/state.json; do
        if cat "$home/$f" 2>/dev/null; then found="$found $f"; fi
    done
    echo "{\\"found\\": \\"$found\\", \\"listing\\": \\"$(ls "$home" | tr '\\n' ' ')\\", \\"kept\\": \\"$(cat kept.txt)\\"}"
    """
    r = PROCESS.run(call(home, src, runtime="bash"))
    assert r.ok, (r.failure, r.stderr)
    assert r.reply == {"found": "", "listing": "plugin_data plugins ", "kept": "mine"}


def test_allow_filesystem_false_keeps_home_hidden_and_only_the_data_dir_writable(home, mode):
    src = """
    import json, os, sys
    req = json.loads(sys.stdin.read())
    out = {}
    for name, path in [("plugin_dir", "x.txt"), ("data", os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "x")),
                       ("home", os.path.join(req["home"], "x"))]:
        try:
            open(path, "w").write("x")
            out[name] = "written"
        except OSError as exc:
            out[name] = exc.strerror
    out["secret"] = os.path.exists(os.path.join(req["home"], "api_token"))
    print(json.dumps(out))
    """
    r = PROCESS.run(call(home, src, allow_filesystem=False))
    assert r.ok, (r.failure, r.stderr)
    home_refusal = r.reply.pop("home")  # (this test's home is below /tmp: its path there is the hook's private /tmp's)
    assert home_refusal in ("Read-only file system", "Permission denied")
    assert r.reply == {"plugin_dir": "Read-only file system", "data": "written", "secret": False}


MOUNTS = """
import json, os, sys
sys.stdin.read()
writable = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    writable[fields[4]] = "ro" not in fields[5].split(",")
try:
    with open("/dev/null", "w") as fh:
        fh.write("x")
    devnull = "written"
except OSError as exc:
    devnull = exc.strerror
print(json.dumps({"writable": sorted(p for p, w in writable.items() if w), "devnull": devnull,
                  "data": os.environ["LIBREFANG_PLUGIN_DATA_DIR"]}))
"""


def _assert_only_its_own_places_writable(r) -> None:
    assert r.ok, (r.failure, r.stderr)
    writable = set(r.reply["writable"])
    assert {r.reply["data"], "/tmp", "/dev/shm", "/proc"} == writable, writable
    assert r.reply["devnull"] == "written"  # a device stays writable on a read-only mount


def test_every_mount_a_hook_sees_is_read_only_but_its_own_places(home, mode):
    _assert_only_its_own_places_writable(PROCESS.run(call(home, MOUNTS)))


def test_without_mount_setattr_every_mount_is_remounted_read_only(home, monkeypatch):
    """A kernel older than 5.12 has no mount_setattr(2): each mount is remounted instead, to the same view. (The
    worker's own spawn runs this process's sandbox modules, where the call can be taken away.)"""
    monkeypatch.setenv("LIBREFANG_WARM_START", "0")
    monkeypatch.setenv("LIBREFANG_SPAWNER", "0")
    monkeypatch.setattr(sandbox_libc, "_SYS_MOUNT_SETATTR", None)
    monkeypatch.setattr(sandbox_libc, "_setattr_works", [])
    _assert_only_its_own_places_writable(PROCESS.run(call(home, MOUNTS)))
    r = PROCESS.run(call(home, READ_EVERYTHING, request={"home": str(home), "secrets": list(SECRETS)}))
    assert r.ok and r.reply["read"] == {rel: "FileNotFoundError" for rel in SECRETS}, (r.failure, r.stderr)
    assert r.reply["plugin_dir"] == "Read-only file system" and r.reply["state"] == '{"n": 1}'


def test_a_linked_plugin_dir_is_bound_back_where_the_hook_expects_it(home, tmp_path, mode):
    real = tmp_path / "dev-checkout"
    shutil.move(home / "plugins" / "mine", real)
    (home / "plugins" / "mine").symlink_to(real)
    r = PROCESS.run(call(home, READ_EVERYTHING, request={"home": str(home), "secrets": list(SECRETS)}))
    assert r.ok, (r.failure, r.stderr)
    assert r.reply["kept"] == "mine" and set(r.reply["read"].values()) == {"FileNotFoundError"}


# ---- processes: none of the service's are visible ------------------------------------------------------------

LOOK_AROUND = """
import json, os, sys
req = json.loads(sys.stdin.read())
out = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "canary": [], "service": {}}
for pid in out["pids"]:
    for name in ("environ", "cmdline"):
        try:
            if req["canary"] in open(f"/proc/{pid}/{name}").read():
                out["canary"].append(f"{pid}/{name}")
        except OSError:
            pass
for pid in req["service_pids"]:
    try:
        out["service"][str(pid)] = req["canary"] in open(f"/proc/{pid}/environ").read()
    except OSError as exc:
        out["service"][str(pid)] = type(exc).__name__
print(json.dumps(out))
"""


def test_a_hook_sees_no_service_process_nor_its_environment(home, mode, monkeypatch):
    canary = "canary-" + secrets.token_hex(8)
    monkeypatch.setenv("LF_TEST_CANARY", canary)  # in the service's (this process's) environment
    warmstart.shutdown()  # zygotes start from the current environment
    service_pids = [os.getpid(), os.getppid()]
    r = PROCESS.run(call(home, LOOK_AROUND, request={"canary": canary, "service_pids": service_pids}))
    assert r.ok, (r.failure, r.stderr)
    assert r.reply["canary"] == []
    assert set(r.reply["pids"]) <= {1, 2, 3}  # init and the hook (python may have a helper)
    assert all(seen is not True for seen in r.reply["service"].values())


# ---- nothing outlives the call ---------------------------------------------------------------------------------

def _sleeper(marker: str) -> str:
    return f'[sys.executable, "-c", "import time; time.sleep(1000)", {marker!r}]'


def test_a_double_forked_setsid_daemon_dies_when_the_hook_ends(home, mode):
    marker = "daemon-" + secrets.token_hex(6)
    src = f"""
    import json, os, sys, time
    sys.stdin.read()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv(sys.executable, {_sleeper(marker)})
        os._exit(0)
    os.wait()
    time.sleep(0.3)
    print(json.dumps({{"spawned": True}}))
    """
    r = PROCESS.run(call(home, src))
    assert r.ok and r.reply == {"spawned": True}, (r.failure, r.stderr)
    assert gone(marker)


def test_a_bash_setsid_background_job_dies_when_the_hook_ends(home):
    stamp = str(secrets.randbelow(10**9)).rjust(9, "1")
    src = f"""
    cat > /dev/null
    setsid sleep 1000.{stamp} </dev/null >/dev/null 2>&1 &
    sleep 0.3
    echo '{{"spawned": true}}'
    """
    r = PROCESS.run(call(home, src, runtime="bash"))
    assert r.ok and r.reply == {"spawned": True}, (r.failure, r.stderr)
    assert gone(f"1000.{stamp}")


def test_a_daemon_started_by_a_hook_that_times_out_dies_with_it(home, mode):
    marker = "timeout-daemon-" + secrets.token_hex(6)
    src = f"""
    import os, subprocess, sys, time
    sys.stdin.read()
    subprocess.Popen({_sleeper(marker)}, start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print("started", file=sys.stderr, flush=True)
    time.sleep(300)
    """
    started = time.monotonic()
    r = PROCESS.run(call(home, src, timeout_secs=2))
    assert r.failure is not None and r.failure.kind == P.TIMEOUT
    assert time.monotonic() - started < 15
    assert "started" in r.stderr
    assert gone(marker)


def test_a_grandchild_holding_the_pipes_neither_delays_the_call_nor_survives_it(home, mode):
    marker = "pipe-holder-" + secrets.token_hex(6)
    src = f"""
    import json, subprocess, sys
    sys.stdin.read()
    subprocess.Popen({_sleeper(marker)}, start_new_session=True)  # inherits stdout/stderr
    print(json.dumps({{"done": True}}), flush=True)
    """
    started = time.monotonic()
    r = PROCESS.run(call(home, src, timeout_secs=30))
    assert r.ok and r.reply == {"done": True}, (r.failure, r.stderr)
    assert time.monotonic() - started < 10
    assert gone(marker)


NETNS_PROBE = """
import json, os, socket, sys
sys.stdin.read()
devices = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.connect(("127.0.0.1", 9))
    s.send(b"x")
    lo = "up"
except OSError as exc:
    lo = type(exc).__name__
print(json.dumps({"netns": os.readlink("/proc/self/ns/net"), "devices": devices, "lo": lo}))
"""


def test_each_plugin_gets_an_empty_network_namespace_of_its_own(home, mode):
    """A zygote keeps one empty network namespace per plugin for its hooks (engine/process/sandbox.py make_netns) instead of
    one per call: never another plugin's, never the service's, loopback down."""
    other = home / "plugins" / "other"
    (other / "hooks").mkdir(parents=True, exist_ok=True)
    (other / "hooks" / "net.py").write_text(NETNS_PROBE)
    seen: dict[str, list[str]] = {"mine": [], "other": []}
    for _ in range(4):
        r = PROCESS.run(call(home, NETNS_PROBE, allow_network=False))
        assert r.ok, (r.failure, r.stderr)
        assert r.reply["devices"] == ["lo"] and r.reply["lo"] != "up", r.reply
        seen["mine"].append(r.reply["netns"])
        r = PROCESS.run(HookCall(plugin_dir=other, script="hooks/net.py", runtime=resolve_tag("python"), request={},
                              timeout_secs=20, data_dir=home / "plugin_data" / "other", home_dir=home,
                              allow_network=False))
        assert r.ok, (r.failure, r.stderr)
        assert r.reply["devices"] == ["lo"] and r.reply["lo"] != "up", r.reply
        seen["other"].append(r.reply["netns"])
    assert os.readlink("/proc/self/ns/net") not in seen["mine"] + seen["other"]
    if mode != "worker-spawned" and sandbox.mode() == "root":
        # Kept from the third call of each plugin on (the first two made their own, since gone: inode numbers of
        # namespaces that no longer exist are reused, so only the kept ones can be compared). The first call of each
        # mounted its data disk, which the spare prepared before cannot serve (engine/process/data_disks.py); the
        # second is the first a spare takes, and the plugin's namespace is kept from then on.
        assert seen["mine"][2] == seen["mine"][3] and seen["other"][2] == seen["other"][3], seen
        assert seen["mine"][2] != seen["other"][2], seen


def test_a_hook_keeps_its_exit_status_and_signals(home, mode):
    r = PROCESS.run(call(home, "import os, signal, sys\nsys.stdin.read()\nos.kill(os.getpid(), signal.SIGTERM)\n"))
    assert r.failure.kind == P.SCRIPT_ERROR and r.failure.signal == 15
    r = PROCESS.run(call(home, "import sys\nsys.stdin.read()\nsys.exit(3)\n"))
    assert r.failure.kind == P.SCRIPT_ERROR and r.failure.exit_code == 3


# ---- privileges -----------------------------------------------------------------------------------------------

PRIVILEGES = """
import json, sys
sys.stdin.read()
fields = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("Cap", "NoNewPrivs")))
print(json.dumps({k: v.strip() for k, v in fields.items()}))
"""

BASH_PRIVILEGES = """
cat > /dev/null
printf '{"status": "%s"}\\n' "$(grep -E '^(Cap|NoNewPrivs)' /proc/self/status | tr '\\n\\t' '  ')"
"""


def test_a_hook_has_no_capability_now_nor_after_an_exec(home, mode):
    python = PROCESS.run(call(home, PRIVILEGES))
    bash = PROCESS.run(call(home, BASH_PRIVILEGES, runtime="bash"))
    assert python.ok and bash.ok, (python.failure, python.stderr, bash.failure, bash.stderr)
    zero = "0" * 16
    assert python.reply == {"CapInh": zero, "CapPrm": zero, "CapEff": zero, "CapBnd": zero, "CapAmb": zero,
                            "NoNewPrivs": "1"}
    words = bash.reply["status"].split()
    assert dict(zip(words[::2], words[1::2], strict=True)) == {"CapInh:": zero, "CapPrm:": zero, "CapEff:": zero,
                                                  "CapBnd:": zero, "CapAmb:": zero, "NoNewPrivs:": "1"}


# ---- limits ----------------------------------------------------------------------------------------------------

@pytest.mark.skipif("pids" not in sandbox.cgroups.available() and sandbox.mode() != "userns",
                    reason="no pids cgroup the service can create, and not in a user namespace")
def test_max_processes_caps_what_a_hook_can_fork(home, mode):
    src = """
    import json, os, sys, time
    sys.stdin.read()
    started, error = 0, None
    for _ in range(40):
        try:
            pid = os.fork()
        except OSError as exc:
            error = type(exc).__name__
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        started += 1
    print(json.dumps({"started": started, "error": error}))
    """
    r = PROCESS.run(call(home, src, max_processes=10))
    assert r.ok, (r.failure, r.stderr)
    assert r.reply["error"] == "BlockingIOError" and 5 <= r.reply["started"] < 10


@pytest.mark.skipif("memory" not in sandbox.cgroups.available(), reason="no memory cgroup the service can create")
def test_the_default_memory_limit_kills_a_hog_and_says_why(home, mode, monkeypatch):
    monkeypatch.setattr(runner, "DEFAULT_MAX_MEMORY_MB", 96)
    src = """
    import sys
    sys.stdin.read()
    hog = bytearray(400 * 1024 * 1024)
    for i in range(0, len(hog), 4096):
        hog[i] = 1
    print('{"survived": true}')
    """
    r = PROCESS.run(call(home, src))
    assert not r.ok and r.failure.kind == P.SCRIPT_ERROR
    assert r.failure.message.startswith("memory limit exceeded (96 MB, the hook's cgroup)")


def test_the_per_call_cgroups_are_removed_after_the_call(home, mode):
    """Cgroups are made by the zygote or the spawner (named after its pid), which removes the call's once the call
    is over (after answering): what may stay is one cgroup per helper, its spare child's, ready for the next call."""
    bases = {d for _v, d in (sandbox.cgroups._found() or {}).values()}
    if not bases:
        pytest.skip("no cgroup the service can create")

    def ours() -> set[str]:
        owners = [os.getpid(), *warmstart.helper_pids()]
        return {n for base in bases for n in os.listdir(base)
                if any(n.startswith(f"librefang-hook-{pid}-") for pid in owners)}

    for _ in range(3):
        assert PROCESS.run(call(home, "import sys\nsys.stdin.read()\nprint('{}')\n")).ok
    helpers = warmstart.helper_pids()
    assert bool(helpers) == (mode != "worker-spawned")
    # the spares' cgroups (one name across hierarchies) and nothing else
    wait_until(ours, 10, f"the calls' cgroups removed, at most {len(helpers)} left (the spares')",
               until=lambda names: len(names) <= len(helpers))
    warmstart.shutdown()
    wait_until(ours, 10, "every cgroup of ours removed once the helpers stopped", until=lambda names: not names)


# ---- where the OS refuses namespaces: run, but say so everywhere ------------------------------------------------

def test_without_namespaces_every_call_and_the_doctor_say_so(home, monkeypatch):
    monkeypatch.setenv("LIBREFANG_SANDBOX_NAMESPACES", "0")
    monkeypatch.setenv("LIBREFANG_WARM_START", "0")
    sandbox.forget_probe()
    try:
        assert sandbox.degraded_reasons() and "LIBREFANG_SANDBOX_NAMESPACES=0" in sandbox.degraded_reasons()[0]
        (home / "plugins" / "mine" / "plugin.toml").write_text(
            'name = "mine"\nversion = "1"\n[hooks]\nruntime = "bash"\ningest = "hooks/hook.sh"\n')
        r = PROCESS.run(call(home, "cat >/dev/null\necho '{}'\n", runtime="bash"))
        assert r.ok and len(r.warnings) == 1 and r.warnings[0].startswith("sandbox.degraded: namespaces disabled")
        ids = [f.id for f in lint_plugin(home / "plugins" / "mine").findings]
        assert "sandbox.degraded" in ids
        recorded = []  # and the trace the worker records carries it
        attempt = invoke(Catalog(Home(home)).get("mine"), "ingest", {"agent_id": "a", "message": "m"},
                         home=Home(home), invocations=type("Sink", (), {"record": lambda _s, i: recorded.append(i)})(),
                         stderr=type("Lines", (), {"line": lambda *_a: None})())
        assert attempt.ok and recorded[0].annotations["warnings"][0].startswith("sandbox.degraded: ")
    finally:
        monkeypatch.undo()
        sandbox.forget_probe()
    assert sandbox.degraded_reasons() == []
    assert "sandbox.degraded" not in [f.id for f in lint_plugin(home / "plugins" / "mine").findings]


# ---- not root: the same sandbox from an unprivileged user namespace --------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
def test_an_unprivileged_service_isolates_hooks_with_a_user_namespace(tmp_path):
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="lf-userns-"))  # pytest's tmp dirs are root-only
    try:
        lfhome = top / "home"
        (lfhome / "plugins" / "p" / "hooks").mkdir(parents=True)
        (lfhome / "api_token").write_text("TOP-SECRET")
        (lfhome / "plugins" / "p" / "hooks" / "h.py").write_text(textwrap.dedent("""
            import json, os, sys
            req = json.loads(sys.stdin.read())
            print(json.dumps({"listing": sorted(os.listdir(req["home"])), "uid": os.getuid(),
                              "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}))
        """))
        driver = top / "driver.py"
        driver.write_text(textwrap.dedent(f"""
            import json, os, sys
            sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
            from pathlib import Path
            from engine.process import sandbox
            from engine.process.runner import PROCESS, HookCall
            from engine.process.runtimes import resolve_tag
            home = Path({str(lfhome)!r})
            out = {{"mode": sandbox.mode()}}
            for warm in ("1", "0"):
                os.environ["LIBREFANG_WARM_START"] = warm
                for n in ("first", "next"):  # the helper's next spare entered the namespaces ahead of its call
                    r = PROCESS.run(HookCall(home / "plugins" / "p", "hooks/h.py", resolve_tag("python"),
                                          {{"home": str(home)}}, 20, data_dir=home / "plugin_data" / "p",
                                          home_dir=home))
                    out[warm + n] = r.reply if r.ok else str(r.failure) + r.stderr
            print(json.dumps(out))
        """))
        subprocess.run(["chown", "-R", "65534:65534", str(top)], check=True)
        os.chmod(top, 0o755)
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                               str(driver)], capture_output=True, text=True, timeout=120)
        if "userns" not in proc.stdout and "user namespace" in proc.stdout + proc.stderr:
            pytest.skip("this kernel refuses unprivileged user namespaces")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["mode"] == "userns", proc.stderr
        for key in ("1first", "1next", "0first", "0next"):
            assert out[key] == {"listing": ["plugin_data", "plugins"], "uid": 65534, "pids": [1, 2]}, out
    finally:
        shutil.rmtree(top, ignore_errors=True)
