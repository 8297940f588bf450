"""A service that is not root and has no subordinate ids (docs/security.md, "A service that is not root"): the engine
run as an ordinary user (a subprocess under `setpriv`, with its own $LIBREFANG_HOME, a uid with no user name) isolates
its hooks in an unprivileged user namespace. What holds there: their own PID/mount/IPC namespaces, the read-only view
with the service's home concealed, a private /tmp, no capabilities and the seccomp filter. What does not, and is
said with what is missing: they run as the service's own user (`sandbox.degraded`). With subordinate ids they run as
identities of their own: tests/engine/test_sandbox_subids.py."""

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
USER = 1_700_000_123  # an ordinary uid of no one's, outside the [sandbox] range

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root to start the engine as another user (setpriv)")

DRIVER = """
import json, os, sys
from pathlib import Path
from engine.process import sandbox, warmstart
from engine.process.runner import PROCESS, HookCall
from engine.process.runtimes import resolve_tag
home = Path(os.environ["LIBREFANG_HOME"])
pdir = home / "plugins" / "probe"
(pdir / "hooks").mkdir(parents=True, exist_ok=True)
(home / "api_token").write_text("secret")
(pdir / "hooks" / "hook.py").write_text(sys.argv[1])
result = PROCESS.run(HookCall(plugin_dir=pdir, script="hooks/hook.py", runtime=resolve_tag("python"), request={},
                           timeout_secs=30, data_dir=home / "plugin_data" / "probe", home_dir=home))
warmstart.shutdown()
print(json.dumps({"mode": sandbox.mode(), "reasons": sandbox.degraded_reasons(), "ok": result.ok,
                  "reply": result.reply, "stderr": result.stderr, "warnings": result.warnings}))
"""

HOOK = """
import json, os, sys
sys.stdin.read()
out = {"uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
for name, path in (("token", os.path.join(os.environ["HOME"], "..", "..", "api_token")), ("shadow", "/etc/shadow"),
                   ("etc", "/etc/lf-nonroot"), ("tmp", "/tmp/x"), ("data", os.path.join(os.environ["HOME"], "x"))):
    try:
        open(path, "w" if name in ("etc", "tmp", "data") else "r").write("x") if name in ("etc", "tmp", "data") \\
            else open(path).read()
        out[name] = "done"
    except OSError as exc:
        out[name] = exc.strerror
status = open("/proc/self/status").read().splitlines()
out["status"] = [line for line in status if line.startswith(("CapEff", "NoNewPrivs", "Seccomp:"))]
print(json.dumps(out))
"""


@pytest.fixture
def own_dir():
    """A directory of the ordinary user's own (pytest's tmp_path is below a directory only root may enter)."""
    path = Path(tempfile.mkdtemp(prefix="lf-nonroot-"))
    os.chown(path, USER, USER)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_service_that_is_not_root_isolates_its_hooks_and_says_what_it_cannot(own_dir):
    tmp_path = own_dir
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, USER, USER)
    site = REPO / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    python = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/bin")
    if python is None or not site.is_dir():
        pytest.skip("needs a system python of the service's version, which an ordinary user may run")
    env = {"PATH": "/usr/bin:/bin", "LIBREFANG_HOME": str(home), "PYTHONPATH": f"{REPO}:{site}", "HOME": str(tmp_path)}
    done = subprocess.run(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", python, "-c",
                           textwrap.dedent(DRIVER), textwrap.dedent(HOOK)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if seen["mode"] is None:
        pytest.skip(f"this kernel refuses unprivileged user namespaces: {seen['reasons']}")
    assert seen["mode"] == "userns" and seen["ok"], seen
    hook = seen["reply"]
    # what holds: its own PID namespace, the home concealed, nothing of the host written, no privileges, seccomp
    assert set(hook["pids"]) <= {1, 2, 3} and hook["token"] == "No such file or directory"
    assert hook["shadow"] in ("Permission denied", "No such file or directory")
    assert hook["etc"] in ("Read-only file system", "Permission denied") and not Path("/etc/lf-nonroot").exists()
    assert hook["tmp"] == "done" and hook["data"] == "done"  # its private /tmp, its data directory
    assert "CapEff:\t0000000000000000" in hook["status"] and "Seccomp:\t2" in hook["status"]
    # what does not, said loudly: the hook is the service's own user on the host
    assert hook["uid"] == USER
    assert any(f"uid {USER} has no user name" in reason and "run as the service's own user" in reason
               for reason in seen["reasons"]), seen["reasons"]
    assert seen["warnings"] and "sandbox.degraded" in seen["warnings"][0]
    assert (home / "plugin_data" / "probe" / "x").stat().st_uid == USER
