"""Each plugin's data directory is a filesystem of its own (engine/process/data_disks.py): a sparse ext4 image per
plugin, loop-mounted on the directory and sized by `max_disk_mb`, made ready on the plugin's first hook call, what the
directory held before moved into it, reused by later processes, resized at its next mount, removed at uninstall.
Real hooks through the runner, real mounts, as root (CI runs as root); warm, cold and below the python spare where
the spawn path matters."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from engine.home import Home
from engine.plugins.install import uninstall
from engine.process import data_disk_images, data_disks, hook_dirs, identity, native_spare, sandbox, warmstart
from engine.process.runner import PROCESS, HookCall
from engine.process.runtimes import resolve_tag

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or data_disks.unavailable() is not None,
                                reason=f"data disks need root with loop devices here: {data_disks.unavailable()}")

# Reports its data directory as the hook sees it, and writes `write` bytes there in 1 MiB files (then `files` empty
# files) until the filesystem refuses.
PROBE = """
import errno, json, os, sys
req = json.loads(sys.stdin.read())
home = os.environ["LIBREFANG_PLUGIN_DATA_DIR"]
fs = os.statvfs(home)
out = {"dev": os.stat(home).st_dev, "size": fs.f_blocks * fs.f_frsize, "uid": os.getuid(),
       "listing": sorted(os.listdir(home)), "above": sorted(os.listdir(os.path.dirname(home)))}
for rel in req.get("read", []):
    try:
        out.setdefault("read", {})[rel] = open(os.path.join(home, rel)).read()
    except OSError as exc:
        out.setdefault("read", {})[rel] = exc.strerror
written, refused = 0, None
for i in range(req.get("write", 0) >> 20):
    try:
        with open(os.path.join(home, f"fill-{i}"), "wb") as fh:
            fh.write(b"x" * (1 << 20))
        written += 1 << 20
    except OSError as exc:
        refused = errno.errorcode[exc.errno]
        break
made = 0
for i in range(req.get("files", 0)):
    try:
        open(os.path.join(home, f"empty-{i}"), "w").close()
        made += 1
    except OSError as exc:
        refused = errno.errorcode[exc.errno]
        break
out.update(written=written, made=made, refused=refused)
print(json.dumps(out))
"""


@pytest.fixture
def home(tmp_path) -> Path:
    root = tmp_path / "lfhome"
    (root / "plugins").mkdir(parents=True)
    return root


@pytest.fixture(params=["warm", "cold", "cold-python-spare"])
def mode(request, monkeypatch):
    monkeypatch.setenv("LIBREFANG_WARM_START", "1" if request.param == "warm" else "0")
    monkeypatch.setenv(native_spare.SWITCH, "0" if request.param == "cold-python-spare" else "1")
    warmstart.shutdown()
    yield request.param
    warmstart.shutdown()


def call(home: Path, name: str, request: dict | None = None, disk_mb: int = 32, **kw):
    pdir = home / "plugins" / name
    (pdir / "hooks").mkdir(parents=True, exist_ok=True)
    (pdir / "hooks" / "probe.py").write_text(PROBE)
    (pdir / "plugin.toml").write_text(f'name = "{name}"\nversion = "1.0.0"\n[hooks]\nruntime = "python"\n'
                                      'ingest = "hooks/probe.py"\n')
    result = PROCESS.run(HookCall(plugin_dir=pdir, script="hooks/probe.py", runtime=resolve_tag("python"),
                               request=request or {}, timeout_secs=60, data_dir=home / "plugin_data" / name,
                               home_dir=home, max_disk_mb=disk_mb, **kw))
    assert result.ok, (result.failure, result.stderr)
    return result


def mounts_at(path: Path) -> list[tuple[str, str]]:
    """(source, options) of every mount on exactly `path`, from this process's mount table."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4] == os.path.realpath(path):
            sep = fields.index("-")
            found.append((fields[sep + 2], fields[5]))
    return found


def test_a_plugins_data_directory_is_a_filesystem_of_its_own_of_max_disk_mb(home, mode):
    result = call(home, "sized", disk_mb=32)
    data = home / "plugin_data" / "sized"
    [(source, options)] = mounts_at(data)
    assert source.startswith("/dev/loop") and {"nosuid", "nodev"} <= set(options.split(","))
    image = home / "plugin_data" / ".disks" / "sized.img"
    assert stat.S_IMODE(image.stat().st_mode) == 0o600 and stat.S_IMODE(image.parent.stat().st_mode) == 0o700
    assert image.stat().st_size == 32 << 20 and image.stat().st_blocks * 512 < 8 << 20  # sparse
    seen = result.reply
    assert seen["dev"] == data.stat().st_dev != home.stat().st_dev  # the hook writes on its own filesystem
    assert 24 << 20 < seen["size"] <= 32 << 20
    assert seen["listing"] == [] and seen["above"] == ["sized"]  # no lost+found; no image, no other plugin
    owner = data.stat()
    assert (owner.st_uid, owner.st_gid) == identity.hook_ids(home, "sized") == (seen["uid"], seen["uid"])
    assert stat.S_IMODE(owner.st_mode) == 0o700
    assert data_disks.usage(data)["size_bytes"] == seen["size"]


def test_a_hook_that_fills_it_gets_enospc_and_the_host_and_the_service_do_not(home, mode):
    before = shutil.disk_usage(home).free
    seen = call(home, "filler", {"write": 64 << 20}, disk_mb=32).reply
    assert seen["refused"] == "ENOSPC" and 20 << 20 < seen["written"] < 32 << 20, seen
    assert before - shutil.disk_usage(home).free < 40 << 20  # at most its image, never the host's disk
    data = home / "plugin_data" / "filler"
    # the service still writes its own small files there (root's reserved share), as the hook's identity
    ids = identity.hook_ids(home, "filler")
    made = hook_dirs.write_private(data, "agents/a1/state.json", "{}", ids)
    assert made.read_text() == "{}" and made.stat().st_uid == ids[0]
    # another plugin is not affected
    assert call(home, "neighbour", {"write": 4 << 20}).reply["written"] == 4 << 20


def test_inodes_are_capped_too(home):
    seen = call(home, "inodes", {"files": 100_000}, disk_mb=8).reply
    assert seen["refused"] == "ENOSPC" and 1000 < seen["made"] < 4096, seen


def test_what_the_directory_held_before_is_moved_into_it_without_loss(home, tmp_path):
    data = home / "plugin_data" / "old"
    (data / "agents" / "a1").mkdir(parents=True)
    (data / "agents" / "a1" / "state.json").write_text('{"n": 7}')
    (data / "notes.txt").write_text("kept")
    os.chmod(data / "notes.txt", 0o640)
    os.link(data / "notes.txt", data / "agents" / "hard.txt")
    os.symlink("/etc/shadow", data / "shadow")  # a link planted by a hook: moved as a link, never followed
    os.mkfifo(data / "pipe")
    outside = tmp_path / "root-only"
    outside.write_text("ROOT ONLY")
    os.chmod(outside, 0o600)
    os.link(outside, data / "linked-out")  # a hard link to a file of someone else's
    ids = identity.hook_ids(home, "old")
    for path in (data, data / "agents", data / "agents" / "a1", data / "agents" / "a1" / "state.json",
                 data / "notes.txt", data / "pipe"):
        os.chown(path, *ids, follow_symlinks=False)
    underneath = os.open(data, os.O_RDONLY | os.O_DIRECTORY)  # the directory as it is before the mount
    try:
        result = call(home, "old", {"read": ["agents/a1/state.json", "notes.txt", "agents/hard.txt", "shadow",
                                             "linked-out"]})
        seen = result.reply
        assert mounts_at(data)
        assert seen["read"] == {"agents/a1/state.json": '{"n": 7}', "notes.txt": "kept", "agents/hard.txt": "kept",
                                "shadow": "Permission denied", "linked-out": "No such file or directory"}
        assert os.readlink(data / "shadow") == "/etc/shadow"
        assert (data / "notes.txt").stat().st_ino == (data / "agents" / "hard.txt").stat().st_ino
        assert stat.S_IMODE((data / "notes.txt").stat().st_mode) == 0o640
        assert stat.S_ISFIFO((data / "pipe").stat().st_mode)
        # A link to a file elsewhere is not copied (its copy would be handed to the plugin): it stays under the
        # mount point, said on the trace; the rest was moved, not copied, so nothing else is left there uncapped.
        assert os.listdir(underneath) == ["linked-out"] and outside.read_text() == "ROOT ONLY"
        assert outside.stat().st_nlink == 2
        assert [w for w in result.warnings if w.startswith("data_disk")] == \
               ["data_disk: not moved into its image, left under the mount point (1): linked-out (links to files "
                "elsewhere, sockets, devices, or names its image already had)"]
        assert os.fstat(underneath).st_uid == 0 and stat.S_IMODE(os.fstat(underneath).st_mode) == 0o700
    finally:
        os.close(underneath)


@pytest.mark.parametrize("image_before", [False, True], ids=["no-image", "empty-image-left-by-a-crash"])
def test_a_directory_that_holds_more_than_the_cap_stays_as_it_is_and_says_so(home, image_before):
    data = home / "plugin_data" / "big"
    data.mkdir(parents=True)
    (data / "blob").write_bytes(os.urandom(12 << 20))
    if image_before:  # a process died between making the image and using it
        (home / "plugin_data" / ".disks").mkdir(mode=0o700)
        data_disk_images.make_image(home / "plugin_data" / ".disks" / "big.img", 8)
    result = call(home, "big", {"read": []}, disk_mb=8)
    assert not mounts_at(data) and not (home / "plugin_data" / ".disks" / "big.img").exists()
    assert (data / "blob").stat().st_size == 12 << 20
    assert any(w.startswith("data_disk: not size-capped: the directory holds 12 MB") for w in result.warnings), \
        result.warnings


def test_it_is_used_again_by_a_later_process_and_mounted_again_after_a_release(home):
    env = {**os.environ, "LIBREFANG_HOME": str(home), "PYTHONPATH": str(REPO)}
    driver = textwrap.dedent(f"""
        import json, os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.engine.test_data_disks import call
        from pathlib import Path
        seen = call(Path({str(home)!r}), "kept", {{"write": 2 << 20}}).reply
        print(json.dumps(seen), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # a service killed: nothing released
    """)
    done = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    first = json.loads(done.stdout.strip().splitlines()[-1])
    data = home / "plugin_data" / "kept"
    assert len(mounts_at(data)) == 1 and data.stat().st_dev == first["dev"]
    data_disks.forget()  # this process: a later start, nothing known yet
    again = call(home, "kept", {"read": []}).reply
    assert again["dev"] == first["dev"] and len(mounts_at(data)) == 1  # used as it is
    assert "fill-0" in again["listing"] and "fill-1" in again["listing"]
    assert data_disks.release_all(home) == [os.path.realpath(data)] and not mounts_at(data)
    assert os.listdir(data) == []  # what the plugin kept is in its image meanwhile
    third = call(home, "kept", {"read": []}).reply
    assert len(mounts_at(data)) == 1 and {"fill-0", "fill-1"} <= set(third["listing"])


def restart(home: Path) -> None:
    """What a service's stop and start do to its disks: released with it, and no helper of it left (a spare of a
    zygote holds the filesystem in its mount namespace)."""
    warmstart.shutdown()
    data_disks.release_all(home)


def test_a_changed_ceiling_applies_at_the_next_mount_and_a_shrink_never_loses_data(home):
    data = home / "plugin_data" / "ceiling"
    call(home, "ceiling", {"write": 12 << 20}, disk_mb=32)
    grown = call(home, "ceiling", disk_mb=64)
    if grown.reply["size"] <= 32 << 20:  # online resizing refused here (no CAP_SYS_RESOURCE): said, until remounted
        assert any("stays at 32 MB until it is next mounted, then grows" in w for w in grown.warnings), grown.warnings
        restart(home)
        grown = call(home, "ceiling", disk_mb=64)
    assert 48 << 20 < grown.reply["size"] <= 64 << 20 and not grown.warnings
    restart(home)
    kept = call(home, "ceiling", {"read": []}, disk_mb=8)  # 12 MB held: it does not fit, it keeps its size
    assert kept.reply["size"] == grown.reply["size"] and sum(n.startswith("fill-") for n in kept.reply["listing"]) == 12
    assert any("stays at 64 MB: it cannot shrink to the ceiling (8 MB" in w for w in kept.warnings), kept.warnings
    for i in range(12):
        (data / f"fill-{i}").unlink()
    restart(home)
    shrunk = call(home, "ceiling", {"read": []}, disk_mb=24)  # (an ext4 of 64 MB has 13 MB of tables and journal)
    assert 16 << 20 < shrunk.reply["size"] <= 24 << 20 and not shrunk.warnings
    assert (home / "plugin_data" / ".disks" / "ceiling.img").stat().st_size == 24 << 20


def test_uninstall_removes_the_image_and_its_mount(home):
    call(home, "gone", {"write": 1 << 20})
    data = home / "plugin_data" / "gone"
    assert mounts_at(data)
    result = uninstall(Home(home), "gone")
    assert result["data_image_removed"] is True
    assert not mounts_at(data) and not (home / "plugin_data" / ".disks" / "gone.img").exists()
    assert data_disks.images_of(home / "plugin_data") == []


def test_a_spare_prepared_before_a_disk_was_mounted_never_serves_its_plugin(home, mode):
    """A helper's spare copies the mount table when it enters its namespace: one prepared before a plugin's disk was
    mounted would bind the directory under the mount (uncapped, hidden from the service) instead of the disk."""
    for name in ("first", "second", "third"):  # each first call mounts a disk after the helper's spare was made
        seen = call(home, name, {"write": 1 << 20}).reply
        data = home / "plugin_data" / name
        assert seen["dev"] == data.stat().st_dev and seen["written"] == 1 << 20
        assert (data / "fill-0").stat().st_size == 1 << 20


def test_where_it_cannot_be_done_hooks_run_uncapped_and_it_is_said(home, monkeypatch):
    monkeypatch.setenv(data_disks.SWITCH, "0")
    data_disks.forget()
    sandbox.forget_probe()
    try:
        result = call(home, "plain", {"write": 1 << 20})
        assert not mounts_at(home / "plugin_data" / "plain") and result.reply["written"] == 1 << 20
        [warning] = [w for w in result.warnings if w.startswith("sandbox.degraded")]
        assert "plugins' data directories are not size-capped: turned off (LIBREFANG_DATA_DISKS=0)" in warning
        assert any("not size-capped" in r for r in sandbox.degraded_reasons())
    finally:
        monkeypatch.delenv(data_disks.SWITCH)
        data_disks.forget()
        sandbox.forget_probe()
    assert sandbox.degraded_reasons() == [] or not any("not size-capped" in r for r in sandbox.degraded_reasons())


def test_a_service_that_is_not_root_says_its_data_directories_are_not_capped():
    user = 1_700_000_124
    own = Path(tempfile.mkdtemp(prefix="lf-disks-"))
    try:
        os.chown(own, user, user)
        python = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/bin")
        if python is None or not shutil.which("setpriv"):
            pytest.skip("needs setpriv and a system python of the service's version, which an ordinary user may run")
        code = "import json; from engine.process import data_disks; print(json.dumps(data_disks.degraded_reasons()))"
        done = subprocess.run(["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", python, "-c", code], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, cwd=own,
                              capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(own, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    [reason] = json.loads(done.stdout)
    assert reason.startswith("plugins' data directories are not size-capped: the service is not root"), reason
