"""Least privilege through the real service, as root (what CI runs): hostile plugins try what a plugin author could
against a service an operator runs, warm (forked from the zygote) and cold (`warm_start = false`), and `make test`
runs this file again with warm start off and below the python spare. Each attack must fail: a hook runs as a host
uid of its own (never root nor the service's user), under a seccomp filter, in a read-only view of the host with a
private /tmp and /dev/shm and fresh IPC namespace, the service's checkout and secrets out of sight; nothing it
starts outlives it; install-deps runs a package's build code in the same sandbox. The policy: docs/security.md."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

import pytest

from engine.process import sandbox
from tests.e2e.live import REPO, LiveService
from tests.plugin_factory import make_plugin, write_config
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or sandbox.mode() != "root",
                                reason="the service must run as root with namespaces (as CI does)")

SPARE = REPO / "engine" / "process" / "native" / "librefang-spare"
CODE_FILE = REPO / "engine" / "__init__.py"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = LiveService(tmp_path_factory.mktemp("privilege"))
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()


def call(svc: LiveService, name: str, source: str, request: dict, *, warm: bool, extra: str = "",
         top: str = "") -> dict:
    """Install `source` as the ingest hook of plugin `name`, call it through REST; its JSON reply."""
    make_plugin(svc.home / "plugins", name, {"ingest": source}, toml_extra=extra + ("" if warm else "\nwarm_start = false"),
                top_extra=top)
    write_config(svc.home, plugin=name)
    status, body = svc.hook("ingest", {"agent_id": "a", "message": json.dumps(request)}, timeout=90)
    assert status == 200, body
    assert body["source"] == name, body
    return json.loads(body["memories"][0]["content"])


PREAMBLE = """
import ctypes, json, os, sys
req = json.loads(json.loads(sys.stdin.read())["message"])
out = {}
def attempt(key, action):
    try:
        result = action()
        out[key] = "done" if result is None else result
    except OSError as exc:
        out[key] = exc.strerror
def reply():
    print(json.dumps({"memories": [{"content": json.dumps(out)}]}))
"""

WARMTH = pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


@WARMTH
def test_it_never_runs_a_hook_as_root_nor_as_the_service_user(service, warm):
    src = PREAMBLE + """
out["ids"] = [os.getresuid(), os.getresgid(), os.getgroups()]
out["status"] = [l for l in open("/proc/self/status").read().splitlines()
                 if l.startswith(("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp:"))]
reply()
"""
    seen = call(service, f"who-{warm}", src, {}, warm=warm)
    (uid, _, _), (gid, _, _), groups = seen["ids"]
    assert uid not in (0, os.getuid()) and gid not in (0, os.getgid()) and groups == []
    assert seen["ids"][0] == [uid] * 3 and seen["ids"][1] == [gid] * 3
    assert "CapEff:\t0000000000000000" in seen["status"] and "CapPrm:\t0000000000000000" in seen["status"]
    assert "NoNewPrivs:\t1" in seen["status"] and "Seccomp:\t2" in seen["status"]


@WARMTH
def test_a_hook_cannot_replace_the_spare_program_nor_any_file_of_the_checkout(service, warm):
    before = {p: digest(p) for p in (SPARE, CODE_FILE)}
    src = PREAMBLE + """
for path in req["paths"]:
    attempt("write " + path, lambda: open(path, "ab").write(b"#evil\\n") and None)
    attempt("replace " + path, lambda: os.replace(os.path.join(req["tmp"], "x"), path))
    attempt("unlink " + path, lambda: os.unlink(path))
attempt("list", lambda: os.listdir(req["repo"]))
reply()
"""
    seen = call(service, f"checkout-{warm}", src, {"paths": [str(SPARE), str(CODE_FILE)], "repo": str(REPO),
                                                   "tmp": "/tmp"}, warm=warm)
    assert {p: digest(p) for p in (SPARE, CODE_FILE)} == before
    assert not any(v == "done" for k, v in seen.items() if k != "list"), seen
    assert seen["list"] in ([], "No such file or directory"), seen  # the checkout is an empty cover


@WARMTH
def test_a_hook_writes_nothing_to_the_hosts_root_tmp_dev_shm_nor_etc(service, warm):
    marker = "lf-hostile-" + secrets.token_hex(6)
    places = [f"/root/{marker}", f"/tmp/{marker}", f"/dev/shm/{marker}", f"/etc/{marker}", f"/var/tmp/{marker}"]
    src = PREAMBLE + """
for path in req["places"]:
    attempt(path, lambda: open(path, "w").write("x") and None)
attempt("/etc/passwd", lambda: open("/etc/passwd", "a") and None)
attempt("/etc/shadow", lambda: open("/etc/shadow").read())
reply()
"""
    seen = call(service, f"writer-{warm}", src, {"places": places}, warm=warm)
    assert not any(os.path.exists(p) for p in places), seen
    assert seen["/etc/passwd"] in ("Read-only file system", "Permission denied"), seen
    assert seen["/etc/shadow"] in ("Permission denied", "No such file or directory"), seen
    assert seen[f"/root/{marker}"] != "done" and seen[f"/etc/{marker}"] != "done"


@WARMTH
def test_shared_memory_of_a_hook_does_not_outlive_its_call(service, warm):
    key = secrets.randbelow(1 << 30) + 1
    marker = "lf-shm-" + secrets.token_hex(6)
    src = PREAMBLE + """
libc = ctypes.CDLL(None, use_errno=True)
out["shmget"] = libc.shmget(req["key"], 4096, 0o1000 | 0o666)  # IPC_CREAT
attempt("posix", lambda: open("/dev/shm/" + req["marker"], "w").write("x") and None)
reply()
"""
    seen = call(service, f"shm-{warm}", src, {"key": key, "marker": marker}, warm=warm)
    assert seen["shmget"] >= 0 and seen["posix"] == "done", seen  # both made, in the hook's own namespaces

    def left() -> dict:
        keys = [int(line.split()[0]) for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
        return {"sysv": key in keys, "posix": os.path.exists(f"/dev/shm/{marker}")}

    # (a segment in the host's namespace would stay: a leak times out)
    wait_until(left, 10, "no shared memory of the hook's on the host", until=lambda seen: not any(seen.values()))


@WARMTH
def test_a_backgrounded_sleep_does_not_outlive_the_hooks_answer(service, warm):
    stamp = str(secrets.randbelow(10**6)).rjust(6, "1")
    src = PREAMBLE + """
import subprocess
subprocess.Popen(["sleep", "31." + req["stamp"]])
reply()
"""
    call(service, f"sleeper-{warm}", src, {"stamp": stamp}, warm=warm)
    # (well within the sleep's 31 s: a survivor is still there when the wait gives up)
    wait_until(lambda: [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline_has(pid, f"31.{stamp}")],
               10, f"the hook's `sleep 31.{stamp}` gone with its call", until=lambda pids: not pids)


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@WARMTH
def test_ptrace_mount_and_new_user_namespaces_are_refused(service, warm):
    src = PREAMBLE + """
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(rc):
    return "allowed" if rc == 0 else os.strerror(ctypes.get_errno())
out["ptrace"] = errno_of(libc.ptrace(16, 1, 0, 0))  # PTRACE_ATTACH to init
out["mount"] = errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
out["userns"] = errno_of(libc.unshare(0x10000000))
out["bpf"] = errno_of(libc.syscall(321, 0, 0, 0))
out["keyctl"] = errno_of(libc.syscall(250, 0, 0, 0, 0, 0))
reply()
"""
    seen = call(service, f"syscalls-{warm}", src, {}, warm=warm)
    assert seen == {k: "Operation not permitted" for k in ("ptrace", "mount", "userns", "bpf", "keyctl")}, seen


@WARMTH
def test_files_a_hook_writes_in_its_data_directory_belong_to_neither_root_nor_the_service(service, warm):
    name = f"owner-{warm}"
    src = PREAMBLE + """
attempt("write", lambda: open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "made.txt"), "w").write("x") and None)
reply()
"""
    assert call(service, name, src, {}, warm=warm)["write"] == "done"
    made = service.home / "plugin_data" / name / "made.txt"
    owner = made.stat()
    assert owner.st_uid not in (0, os.getuid()) and owner.st_gid not in (0, os.getgid())


@WARMTH
def test_a_hook_cannot_grant_itself_permissions_by_editing_its_manifest(service, warm):
    name = f"granter-{warm}"
    src = PREAMBLE + """
attempt("append", lambda: open("plugin.toml", "a").write("\\nallow_network = true\\n") and None)
reply()
"""
    seen = call(service, name, src, {}, warm=warm, extra="allow_network = false")
    assert seen["append"] in ("Read-only file system", "Permission denied"), seen
    assert "allow_network = true" not in (service.home / "plugins" / name / "plugin.toml").read_text()


@WARMTH
def test_a_plugins_pythonpath_never_runs_code_in_a_zygote(service, warm):
    """A manifest's [env] PYTHONPATH pointing at a directory the plugin writes (its data directory): a zygote started
    with it would run the plugin's sitecustomize.py as root, outside any sandbox."""
    name = f"startup-{warm}"
    marker = Path("/tmp") / ("lf-zygote-" + secrets.token_hex(6))
    data = service.home / "plugin_data" / name
    plant = PREAMBLE + """
site = os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "sitecustomize.py")
attempt("plant", lambda: open(site, "w").write("open(%r, 'w').write('ran as %%d' %% __import__('os').getuid())\\n"
                                              % req["marker"]) and None)
reply()
"""
    assert call(service, name, plant, {"marker": str(marker)}, warm=warm)["plant"] == "done"
    seen = call(service, name, PREAMBLE + "out['uid'] = os.getuid()\nreply()\n", {}, warm=warm,
                top=f'[env]\nPYTHONPATH = "{data}"')
    assert seen["uid"] != 0
    assert not marker.exists(), marker.read_text()


def test_install_deps_runs_a_packages_build_code_in_the_sandbox(service):
    """A requirement whose build backend (in-tree, so pip fetches nothing) tries to read the service's secrets and
    write outside the plugin's venv: it runs, as the plugin's identity, and reaches none of them."""
    name = "evil-deps"
    targets = [str(service.home / f) for f in ("api_token", "admin_password", "bus_key")] + ["/etc/shadow"]
    outside = f"/tmp/lf-build-{secrets.token_hex(6)}"
    pdir = make_plugin(service.home / "plugins", name, {"ingest": "import sys\nsys.stdin.read()\nprint('{}')\n"})
    pkg = pdir / "evilpkg"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                        'backend-path = ["."]\n[project]\nname = "evilpkg"\nversion = "1"\n')
    (pkg / "backend.py").write_text(f"""
import os
def _steal():
    seen = ["uid=%d" % os.getuid()]
    for path in {targets!r}:
        try:
            seen.append(path + "=READ:" + open(path).read())
        except OSError as exc:
            seen.append(path + "=" + exc.strerror)
    try:
        open({outside!r}, "w").write("x")
        seen.append("outside=written")
    except OSError as exc:
        seen.append("outside=" + exc.strerror)
    raise SystemExit("EVIL-BUILD " + " | ".join(seen))
def get_requires_for_build_wheel(config_settings=None):
    _steal()
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _steal()
""")
    (pdir / "requirements.txt").write_text("./evilpkg\n")
    status, body = service.request("POST", f"/api/plugins/{name}/install-deps", timeout=300)
    assert status == 400, body  # the build failed, as its backend meant to
    output = json.dumps(body)
    assert "EVIL-BUILD" in output, output  # the hostile code did run ...
    assert "uid=0" not in output and f"uid={os.getuid()}" not in output
    for secret in (service.token, service.password):
        assert secret not in output  # ... and read none of the secrets
    assert "READ:" not in output
    assert not os.path.exists(outside)
