"""A hostile plugin that fills its data directory, through the real service as an operator runs it (root, the
default mechanism; `[limits] max_disk_mb = 48` in config.toml), warm and cold (`make test` runs this file again with
warm start off and below the python spare): the directory is a filesystem of its own of that size
(engine/process/data_disks.py), so the hook gets ENOSPC, in bytes and in files, while another plugin still writes,
the service still answers and the host's disk is not filled. What a plugin kept survives a restart of the service
(a clean stop, and a SIGKILL), uninstall removes its image and mount, and where the images cannot be made hooks run
and the service says so. The policy: docs/security.md ("disk")."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from engine.process import data_disks, sandbox
from tests.e2e.live import LiveService
from tests.plugin_factory import make_plugin, write_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or sandbox.mode() != "root" or data_disks.unavailable() is not None,
                                reason="the service must run as root with namespaces and loop devices (as CI does): "
                                       f"{data_disks.unavailable()}")

CAP_MB = 48
LIMITS = f"[limits]\nmax_disk_mb = {CAP_MB}"

PREAMBLE = """
import errno, json, os, sys
req = json.loads(json.loads(sys.stdin.read())["message"])
data = os.environ["LIBREFANG_PLUGIN_DATA_DIR"]
fs = os.statvfs(data)
out = {"size": fs.f_blocks * fs.f_frsize}
def reply():
    print(json.dumps({"memories": [{"content": json.dumps(out)}]}))
"""

FILL = PREAMBLE + """
written = 0
for i in range(req["chunks"]):  # 4 MiB files, each far below RLIMIT_FSIZE: only a cap on the whole directory stops it
    try:
        with open(os.path.join(data, f"fill-{i}"), "wb") as fh:
            for _ in range(4):
                fh.write(b"x" * (1 << 20))
                fh.flush()
                written += 1 << 20
    except OSError as exc:
        out["refused"] = errno.errorcode[exc.errno]
        break
out["written"] = written
reply()
"""

FILES = PREAMBLE + """
made = 0
for i in range(req["files"]):
    try:
        open(os.path.join(data, f"f{i}"), "w").close()
        made += 1
    except OSError as exc:
        out["refused"] = errno.errorcode[exc.errno]
        break
out["made"] = made
reply()
"""

WRITE = PREAMBLE + """
path = os.path.join(data, req["name"])
if req.get("text") is not None:
    with open(path, "w") as fh:
        fh.write(req["text"])
try:
    out["read"] = open(path).read(4096)
except OSError as exc:
    out["read"] = exc.strerror
out["dev"] = os.stat(data).st_dev
reply()
"""


def start(root: Path, **env: str) -> LiveService:
    svc = LiveService(root)
    svc.env.update(env)
    (svc.home / "config.toml").write_text(LIMITS + "\n")
    return svc.start()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = start(tmp_path_factory.mktemp("disk"))
    try:
        yield svc
    finally:
        svc.stop()


def call(svc: LiveService, name: str, source: str, request: dict, *, warm: bool = True) -> dict:
    """Install `source` as the ingest hook of plugin `name`, call it through REST; its JSON reply."""
    make_plugin(svc.home / "plugins", name, {"ingest": source}, toml_extra="" if warm else "warm_start = false")
    write_config(svc.home, plugin=name, extra=LIMITS)
    status, body = svc.hook("ingest", {"agent_id": "a", "message": json.dumps(request)}, timeout=120)
    assert status == 200, body
    assert body["source"] == name, body
    return json.loads(body["memories"][0]["content"])


def mounts_at(path: Path) -> int:
    point = os.path.realpath(path)
    return sum(line.split(" ")[4] == point for line in Path("/proc/self/mountinfo").read_text().splitlines())


WARMTH = pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])


@WARMTH
def test_a_hook_that_fills_its_data_directory_gets_enospc_and_nothing_else_is_touched(service, warm):
    name = f"filler-{warm}"
    free = shutil.disk_usage(service.home).free
    seen = call(service, name, FILL, {"chunks": 256}, warm=warm)  # it tries 1 GiB
    assert seen["refused"] == "ENOSPC", seen
    assert 32 << 20 < seen["written"] <= seen["size"] and 36 << 20 < seen["size"] <= CAP_MB << 20, seen
    image = service.home / "plugin_data" / ".disks" / f"{name}.img"
    assert image.stat().st_size == CAP_MB << 20 and image.stat().st_blocks * 512 <= CAP_MB << 20
    assert free - shutil.disk_usage(service.home).free < 512 << 20  # (the host is shared: others write too)
    # another plugin still writes its own, the hostile one still answers (and may clean up), the service is healthy
    neighbour = call(service, f"neighbour-{warm}", WRITE, {"name": "mine.txt", "text": "x" * 4096}, warm=warm)
    assert neighbour["read"] == "x" * 4096
    assert call(service, name, WRITE, {"name": "fill-0", "text": None}, warm=warm)["read"].startswith("xxxx")
    status, health = service.request("GET", "/api/health", auth=False)
    assert status == 200 and health["status"] == "ok", health


@WARMTH
def test_a_hook_that_makes_files_until_it_cannot_is_capped_in_inodes_too(service, warm):
    seen = call(service, f"inodes-{warm}", FILES, {"files": 200_000}, warm=warm)
    assert seen["refused"] == "ENOSPC" and 4_000 < seen["made"] < 20_000, seen


def test_what_a_plugin_kept_survives_a_sigkill_and_a_clean_restart(service):
    name = "keeper"
    first = call(service, name, WRITE, {"name": "kept.txt", "text": "before"})
    data = service.home / "plugin_data" / name
    # killed: its mount stays, and the next start uses it as it is
    for proc in [*service.workers, service.web]:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    service.workers, service.web = [], None
    assert mounts_at(data) == 1 and (data / "kept.txt").read_text() == "before"
    service.start()
    again = call(service, name, WRITE, {"name": "kept.txt", "text": None})
    assert again == {**first, "read": "before"} and mounts_at(data) == 1
    # stopped: released (its image keeps what it held), mounted again by the worker that starts next
    service.stop()
    assert mounts_at(data) == 0 and not (data / "kept.txt").exists()
    service.start()
    assert mounts_at(data) == 1  # before any hook runs: the state page shows what the plugin kept
    status, state = service.request("GET", f"/api/plugins/{name}/state")
    assert status == 200 and [f["path"] for f in state["files"]] == ["kept.txt"], state
    assert state["disk"]["size_bytes"] == first["size"], state
    assert call(service, name, WRITE, {"name": "kept.txt", "text": None})["read"] == "before"


def test_uninstall_removes_the_image_and_its_mount(service):
    name = "leaver"
    call(service, name, WRITE, {"name": "x", "text": "x"})
    data = service.home / "plugin_data" / name
    assert mounts_at(data) == 1
    status, body = service.request("POST", "/api/plugins/uninstall", {"name": name})
    assert status == 200 and body["data_image_removed"] is True, body
    assert mounts_at(data) == 0 and not (service.home / "plugin_data" / ".disks" / f"{name}.img").exists()


def test_where_the_images_cannot_be_made_hooks_run_and_the_service_says_so(tmp_path):
    svc = start(tmp_path / "plain", LIBREFANG_DATA_DISKS="0")
    try:
        seen = call(svc, "plain", WRITE, {"name": "x.txt", "text": "still runs"})
        assert seen["read"] == "still runs" and mounts_at(svc.home / "plugin_data" / "plain") == 0
        status, health = svc.request("GET", "/api/health", auth=False)
        assert health["sandbox"]["degraded"] is True
        assert any("plugins' data directories are not size-capped: turned off (LIBREFANG_DATA_DISKS=0)" in r
                   for r in health["sandbox"]["reasons"]), health
        status, doctor = svc.request("GET", "/api/plugins/doctor?fresh=true")
        assert status == 200 and "not size-capped" in json.dumps(doctor), doctor
    finally:
        svc.stop()


def test_librefang_start_releases_its_data_disks_when_it_stops(tmp_path):
    """`make run` as root: hooks get their disks; SIGTERM stops everything and leaves no mount behind (the images
    keep what the plugins kept, for the next start)."""
    from tests.e2e.test_supervisor import Supervised
    from tests.waiting import wait_until

    service = Supervised(tmp_path)
    try:
        (service.home / "config.toml").write_text(LIMITS + "\n")
        service.start()
        make_plugin(service.home / "plugins", "started", {"ingest": WRITE})
        status, body = service.request("PUT", "/api/context-engine/config", {"plugin": "started"})
        assert status == 200, body
        status, body = service.request("POST", "/api/context-engine/hooks/ingest",
                                       {"agent_id": "a", "message": json.dumps({"name": "k.txt", "text": "kept"})},
                                       timeout=60)
        assert status == 200 and body["source"] == "started", body
        seen = json.loads(body["memories"][0]["content"])
        data = service.home / "plugin_data" / "started"
        assert mounts_at(data) == 1 and 36 << 20 < seen["size"] <= CAP_MB << 20
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(timeout=60) == 0
        wait_until(lambda: not service.leftovers(), 10, "no process left behind")
        assert mounts_at(data) == 0 and (service.home / "plugin_data" / ".disks" / "started.img").exists()
    finally:
        service.kill_everything()
