"""A service that is not root but has subordinate ids (docs/security.md, "A service that is not root"): the engine run
as an ordinary user whose /etc/subuid and /etc/subgid give it a range runs every hook as a uid/gid of that range of
its plugin's own, on every spawn path: warm (forked from the zygote), cold (the spawner's native spare), below the
python spare, and spawned by the worker itself; install-deps builds as that identity too. Without the range, or
without uidmap, the hooks run as the service's user and `sandbox.degraded` says what is missing.

The user and its ranges exist only in the service's own mount namespace: /etc/passwd, /etc/group, /etc/subuid and
/etc/subgid are bound over by files of the test there (newuidmap, setuid root, reads them from that namespace), so
the host's /etc is never changed and nothing is left behind, whatever happens to the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
USER, NAME = 1_700_000_321, "lf-subids"
UIDS = (1_710_000_000, 65_536)  # the user's subordinate uids ...
GIDS = (1_720_000_000, 65_536)  # ... and gids (another range: the hook's gid must come from this one)
SITE = REPO / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
PYTHON = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/bin")
TOOLS = ("unshare", "setpriv", "mount", "newuidmap", "newgidmap")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start the engine as another user"),
    pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS),
                       reason=f"needs {', '.join(TOOLS)} (util-linux, mount and uidmap: make setup installs uidmap)"),
    pytest.mark.skipif(PYTHON is None or not SITE.is_dir(),
                       reason="needs a system python of the service's version, which an ordinary user may run"),
]

# The spawn paths, as the worker's environment selects them.
PATHS = {
    "warm": {},
    "cold": {"LIBREFANG_WARM_START": "0"},
    "python-spare": {"LIBREFANG_WARM_START": "0", "LIBREFANG_NATIVE_SPARE": "0"},
    "worker": {"LIBREFANG_WARM_START": "0", "LIBREFANG_SPAWNER": "0"},
}

# Runs as the service's user: the hooks of two plugins, four times each (the first call of a helper takes a plain
# spare, the next ones a spare that entered its namespaces ahead, and from the plugin's second such call on, its kept
# network namespace), with data directories outside $LIBREFANG_HOME where the other plugin's hook could see them (read-only)
# if its identity let it.
CALLS = """
import json, os, sys
from pathlib import Path
from engine.process import sandbox, warmstart
from engine.process.runner import PROCESS, HookCall
from engine.process.runtimes import resolve_tag
os.umask(0o077)  # as the service (librefang_site/settings.py)
home, top = Path(os.environ["LIBREFANG_HOME"]), Path(sys.argv[1])
(home / "api_token").write_text("TOP-SECRET")
(top / "secret").write_text("SERVICE-SECRET")  # the service user's own file, where hooks see the host
out = {"mode": sandbox.mode(), "reasons": sandbox.degraded_reasons(), "calls": []}
for name, other in (("alpha", "beta"), ("beta", "alpha")) * 4:
    pdir = home / "plugins" / name
    (pdir / "hooks").mkdir(parents=True, exist_ok=True)
    (pdir / "hooks" / "hook.py").write_text(sys.argv[2])
    r = PROCESS.run(HookCall(plugin_dir=pdir, script="hooks/hook.py", runtime=resolve_tag("python"), timeout_secs=30,
                          request={"other": str(top / "data" / other), "secret": str(top / "secret"),
                                   "token": str(home / "api_token")},
                          data_dir=top / "data" / name, home_dir=home, allow_network=False))
    out["calls"].append({"plugin": name, "ok": r.ok, "reply": r.reply,
                         "error": None if r.ok else f"{r.failure} {r.stderr[-2000:]}"})
warmstart.shutdown()
print(json.dumps(out))
"""

HOOK = """
import json, os, socket, sys
req = json.loads(sys.stdin.read())
def netns():  # its cookie (never reused, Linux >= 5.14), else its inode
    try:
        with socket.socket(socket.AF_UNIX) as s:
            return s.getsockopt(socket.SOL_SOCKET, 71, 8).hex()  # SO_NETNS_COOKIE
    except OSError:
        return os.readlink("/proc/self/ns/net")
data = os.environ["LIBREFANG_PLUGIN_DATA_DIR"]
with open(os.path.join(data, "mine.txt"), "w") as fh:
    fh.write("mine")
out = {"ids": [os.getresuid(), os.getresgid(), os.getgroups()], "data": data,
       "init": open("/proc/1/cmdline", "rb").read().split(b"\\0")[0].decode(errors="replace"),
       "net": netns(), "ifaces": open("/proc/net/dev").read().count(":"),
       "status": [line for line in open("/proc/self/status").read().splitlines()
                  if line.startswith(("CapEff", "CapPrm", "NoNewPrivs", "Seccomp:"))]}
for key, action in (("other_list", lambda: os.listdir(req["other"])),
                    ("other_file", lambda: open(os.path.join(req["other"], "mine.txt")).read()),
                    ("secret", lambda: open(req["secret"]).read()), ("token", lambda: open(req["token"]).read())):
    try:
        out[key] = action()
    except OSError as exc:
        out[key] = exc.strerror
print(json.dumps(out))
"""


@pytest.fixture
def top():
    """A directory of the service user's own where hooks can see it (under /var/tmp: /tmp is a hook's own)."""
    path = Path(tempfile.mkdtemp(prefix="lf-subids-", dir="/var/tmp"))
    for sub in ("home", "data"):
        (path / sub).mkdir()
    for each, mode in ((path, 0o755), (path / "home", 0o700), (path / "data", 0o755)):  # data: each plugin's in sight
        os.chown(each, USER, USER)
        os.chmod(each, mode)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_service(top: Path, script: str, *args: str, env: dict | None = None, ranges: bool = True,
               uidmap: bool = True) -> dict:
    """Run `script` as the ordinary user NAME in a mount namespace of its own whose /etc names it and (`ranges`) gives
    it UIDS and GIDS, (without `uidmap`: with newuidmap hidden); its last line of JSON."""
    etc = top / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(Path("/etc/passwd").read_text() + f"{NAME}:x:{USER}:{USER}::/nonexistent:/bin/false\n")
    (etc / "group").write_text(Path("/etc/group").read_text() + f"{NAME}:x:{USER}:\n")
    (etc / "subuid").write_text(f"someone-else:100000:65536\n{NAME}:{UIDS[0]}:{UIDS[1]}\n" if ranges else "")
    (etc / "subgid").write_text(f"someone-else:100000:65536\n{NAME}:{GIDS[0]}:{GIDS[1]}\n" if ranges else "")
    for f in etc.iterdir():
        os.chmod(f, 0o644)
    binds = [f"mount --bind {etc / f} /etc/{f}" for f in ("passwd", "group", "subuid", "subgid")]
    if not uidmap:
        binds.append(f"mount --bind /dev/null {shutil.which('newuidmap')}")
    (top / "script.py").write_text(textwrap.dedent(script))
    os.chmod(top / "script.py", 0o644)
    variables = {"PATH": "/usr/bin:/bin", "LIBREFANG_HOME": str(top / "home"), "HOME": str(top),
                 "PYTHONPATH": f"{REPO}:{SITE}", **(env or {})}
    inner = " && ".join(binds) + f" && exec setpriv --reuid={USER} --regid={USER} --clear-groups \"$@\""
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "sh", PYTHON,
                           str(top / "script.py"), *args], env=variables, cwd=top, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def in_range(ids: tuple[int, int]) -> bool:
    uid, gid = ids
    return UIDS[0] <= uid < UIDS[0] + UIDS[1] and GIDS[0] <= gid < GIDS[0] + GIDS[1]


@pytest.mark.parametrize("path", list(PATHS))
def test_each_plugins_hooks_run_as_an_identity_of_its_own_from_the_services_range(top, path):
    seen = as_service(top, CALLS, str(top), textwrap.dedent(HOOK), env=PATHS[path])
    if seen["mode"] is None:
        pytest.skip(f"this kernel refuses unprivileged user namespaces: {seen['reasons']}")
    # the one thing a service that is not root still lacks: a size-capped data disk (docs/security.md, "Data disks")
    assert seen["mode"] == "subids" and [r for r in seen["reasons"] if "not size-capped" not in r] == [], seen
    identities = {}
    for call in seen["calls"]:
        assert call["ok"], call["error"]
        hook = call["reply"]
        (ruid, euid, suid), (rgid, egid, sgid), groups = hook["ids"]
        assert ruid == euid == suid and rgid == egid == sgid and groups == [], hook["ids"]
        assert in_range((ruid, rgid)) and USER not in (ruid, rgid), hook["ids"]  # never root nor the service's user
        assert identities.setdefault(call["plugin"], (ruid, rgid)) == (ruid, rgid)  # stable per plugin
        assert {"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "NoNewPrivs:\t1",
                "Seccomp:\t2"} <= set(hook["status"]), hook["status"]
        # what it writes in its data directory is its identity's on the host
        made = os.stat(Path(hook["data"]) / "mine.txt")
        assert (made.st_uid, made.st_gid) == identities[call["plugin"]]
        # the service user's files are not its to read: the one in sight by permission, the token concealed
        assert hook["secret"] == "Permission denied" and hook["token"] == "No such file or directory", hook
    assert identities["alpha"] != identities["beta"]
    # no network (an empty namespace, loopback only), never the service's; the plugin's own kept one on the
    # helpers' prepared spares (made after its first such call), never another plugin's
    assert all(c["reply"]["ifaces"] == 1 for c in seen["calls"])
    if path != "worker":
        nets = {name: [c["reply"]["net"] for c in seen["calls"] if c["plugin"] == name] for name in identities}
        assert nets["alpha"][2] == nets["alpha"][3] and nets["beta"][2] == nets["beta"][3], nets
        assert nets["alpha"][3] != nets["beta"][3], nets
    # the other plugin's data directory (in sight, read-only) is not its to read (its first call saw it missing)
    later = [c["reply"] for c in seen["calls"][1:]]
    assert all(h["other_list"] == "Permission denied" and h["other_file"] == "Permission denied" for h in later), later
    if path == "cold":  # the next calls took the spawner's native spare (its init is the C program)
        assert seen["calls"][2]["reply"]["init"].endswith("librefang-spare"), seen["calls"][2]["reply"]
    if path == "python-spare":
        assert not any(c["reply"]["init"].endswith("librefang-spare") for c in seen["calls"])


# The service's own files in a shared data directory: LIBREFANG_PLUGIN_CONFIG (read by the hook) and
# LIBREFANG_STATE_FILE (written by it), made by the service through the engine's invoke.
ENGINE = """
import json, os, sys
from pathlib import Path
from engine.home import Home
from engine.invoke import invoke
from engine.plugins.catalog import Catalog
from engine.process import warmstart
os.umask(0o077)
home = Home(Path(os.environ["LIBREFANG_HOME"]))
pdir = home.root / "plugins" / "keeper"
(pdir / "hooks").mkdir(parents=True)
(pdir / "plugin.toml").write_text('name = "keeper"\\nversion = "1"\\n[config]\\nlimit = { type = "number", default = 7 }'
                                  '\\n[hooks]\\nruntime = "python"\\ningest = "hooks/hook.py"\\nenable_shared_state = true\\n')
(pdir / "hooks" / "hook.py").write_text(sys.argv[1])
class Sink:
    def record(self, item): pass
    def line(self, *args): pass
out = []
for n in range(2):
    a = invoke(Catalog(home).get("keeper"), "ingest", {"agent_id": "a1", "message": "m"}, home=home,
               invocations=Sink(), stderr=Sink(), agent_id="a1")
    out.append(a.result.reply if a.ok else f"{a.result.failure} {a.result.stderr}")
warmstart.shutdown()
state = home.data_dir("keeper") / "agents" / "a1" / "state.json"
seen = {"calls": out, "state": state.read_text(), "state_path": str(state)}
# what the hook kept to itself, listed and wiped by the service (engine/process/plugin_files.py)
from engine.process import plugin_files
seen["listing"] = plugin_files.listing(home.data_dir("keeper"), frozenset(), 50)
seen["wiped"] = plugin_files.wipe(home.data_dir("keeper"), frozenset())
seen["left"] = sorted(os.listdir(home.data_dir("keeper")))
print(json.dumps(seen))
"""

STATEFUL = """
import json, os, sys
sys.stdin.read()
hidden = os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "hidden")
os.makedirs(hidden, mode=0o700, exist_ok=True)  # a directory the hook keeps to itself
open(os.path.join(hidden, "notes.txt"), "w").write("12345")
config = json.load(open(os.environ["LIBREFANG_PLUGIN_CONFIG"]))
path = os.environ["LIBREFANG_STATE_FILE"]
state = json.load(open(path))
state["n"] = state.get("n", 0) + 1
with open(path, "w") as fh:
    json.dump(state, fh)
print(json.dumps({"type": "ingest_result", "memories": [{"content": json.dumps([config, state])}],
                  "uid": os.getuid()}))
"""


def test_the_services_files_in_a_shared_data_directory_reach_the_hook_and_what_the_hook_hides_is_still_wiped(top):
    seen = as_service(top, ENGINE, textwrap.dedent(STATEFUL))
    first, second = seen["calls"]
    assert isinstance(first, dict) and isinstance(second, dict), seen
    assert json.loads(first["memories"][0]["content"]) == [{"limit": 7}, {"n": 1}]
    assert json.loads(second["memories"][0]["content"]) == [{"limit": 7}, {"n": 2}]  # the hook kept its state
    assert UIDS[0] <= first["uid"] < UIDS[0] + UIDS[1]
    assert json.loads(seen["state"]) == {"n": 2}  # ... and the service still reads it
    data = Path(seen["state_path"]).parents[2]
    top_dir = os.stat(data)
    assert top_dir.st_uid == USER and top_dir.st_mode & 0o7777 == 0o2770 and top_dir.st_gid != USER
    assert GIDS[0] <= top_dir.st_gid < GIDS[0] + GIDS[1]
    # what the hook kept to itself (a 0700 directory of its identity's) is still listed and wiped, not passed over
    assert "hidden/notes.txt" in [f["path"] for f in seen["listing"]["files"]], seen["listing"]
    assert seen["listing"]["agents_with_state"] == ["a1"]
    assert seen["wiped"]["files_removed"] == seen["listing"]["file_count"] and seen["left"] == [], seen


# install-deps as the service's user: a package built by an in-tree backend (nothing fetched) that says who built it;
# installed twice, so that the second swap removes the first venv, which the plugin's identity wrote.
INSTALL = """
import json, os, sys
from pathlib import Path
from engine.plugins.requirements import install_requirements
os.umask(0o077)
home = Path(os.environ["LIBREFANG_HOME"])
pdir = home / "plugins" / "builder"
(pdir / "tinypkg").mkdir(parents=True)
(pdir / "plugin.toml").write_text('name = "builder"\\nversion = "1"\\n[hooks]\\nruntime = "python"\\n')
(pdir / "tinypkg" / "pyproject.toml").write_text('[build-system]\\nrequires = []\\nbuild-backend = "backend"\\n'
                                                 'backend-path = ["."]\\n[project]\\nname = "tinypkg"\\nversion = "1"\\n')
(pdir / "tinypkg" / "backend.py").write_text(sys.argv[1])
(pdir / "requirements.txt").write_text("./tinypkg\\n")
out = [install_requirements(pdir, home / "plugin_data" / "builder", 240) for _ in range(2)]
print(json.dumps({"results": [[r.ok, r.output[-3000:]] for r in out]}))
"""

BACKEND = """
import base64, hashlib, os, zipfile
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {"tinypkg.py": b"BUILT_BY = %d\\n" % os.getuid(),
             "tinypkg-1.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: tinypkg\\nVersion: 1\\n",
             "tinypkg-1.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for p, d in files.items()] + ["tinypkg-1.dist-info/RECORD,,"]
    name = "tinypkg-1-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for p, d in files.items():
            whl.writestr(p, d)
        whl.writestr("tinypkg-1.dist-info/RECORD", "\\n".join(record) + "\\n")
    return name
"""


def test_install_deps_builds_as_the_plugins_identity_and_replaces_its_venv(top):
    seen = as_service(top, INSTALL, textwrap.dedent(BACKEND))
    (ok1, out1), (ok2, out2) = seen["results"]
    assert ok1, out1
    assert ok2, out2  # the second install put its venv in place of the first, which the service removed
    data = top / "home" / "plugin_data" / "builder"
    (module,) = (data / "venv").glob("lib/python*/site-packages/tinypkg.py")
    built_by = int(module.read_text().split("=")[1])
    assert UIDS[0] <= built_by < UIDS[0] + UIDS[1]  # the package's build code ran as the plugin's identity
    assert sorted(p.name for p in data.iterdir() if p.name.startswith("venv")) == ["venv"]
    venv = os.stat(data / "venv")
    assert (venv.st_uid, venv.st_gid) != (USER, USER) and in_range((venv.st_uid, venv.st_gid))


DEGRADED = """
import json
from engine.process import sandbox
print(json.dumps({"mode": sandbox.mode(), "reasons": sandbox.degraded_reasons()}))
"""


def test_without_a_range_it_says_which_files_need_one_and_how(top):
    seen = as_service(top, DEGRADED, ranges=False)
    if seen["mode"] is None:
        pytest.skip(f"this kernel refuses unprivileged user namespaces: {seen['reasons']}")
    assert seen["mode"] == "userns", seen
    (reason,) = [r for r in seen["reasons"] if "identity" in r]
    assert f"{NAME} has no range in /etc/subuid and /etc/subgid" in reason, reason
    assert f"`{NAME}:<start>:<count>`" in reason and "run as the service's own user" in reason, reason


def test_without_uidmap_it_says_to_install_it(top):
    seen = as_service(top, DEGRADED, uidmap=False)
    if seen["mode"] is None:
        pytest.skip(f"this kernel refuses unprivileged user namespaces: {seen['reasons']}")
    assert seen["mode"] == "userns", seen
    assert any("apt-get install uidmap" in r for r in seen["reasons"]), seen["reasons"]
