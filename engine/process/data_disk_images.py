"""The pieces of a data disk (engine/process/data_disks.py) that are the system's: the tools (e2fsprogs, mount),
an image made, its filesystem's size, loop devices and the mount table. Stdlib only (the sandbox's libc handle for
umount2)."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from pathlib import Path

from .sandbox_cgroups import unescape_mountinfo
from .sandbox_libc import MNT_DETACH, libc

DISKS = ".disks"  # the images' directory, beside the data directories (no plugin name starts with a dot)
TOOLS = ("mkfs.ext4", "e2fsck", "resize2fs", "mount", "losetup")
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
# root's share of each image: the service's own files there (state files, config) are still written once a hook
# has filled the rest (a hook's uid never gets it).
RESERVED_PERCENT = "1"
_TOOL_TIMEOUT_SECS = 300
_tools: dict[str, str] = {}  # tool -> its path (found on PATH, or in /usr/sbin, /sbin)


class DiskError(Exception):
    pass


def missing_tools() -> list[str]:
    """The tools not found (on PATH, /usr/sbin or /sbin); the others are remembered for `run`."""
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"])
    for tool in TOOLS:
        _tools[tool] = shutil.which(tool, path=search) or ""
    return [tool for tool in TOOLS if not _tools[tool]]


def run(argv: list[str], ok: tuple[int, ...] = (0,)) -> None:
    """Run one of TOOLS; DiskError with what it said when its exit status is not in `ok`."""
    proc = subprocess.run([_tools.get(argv[0]) or argv[0], *argv[1:]], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=_TOOL_TIMEOUT_SECS, env={**os.environ, "LC_ALL": "C"})
    if proc.returncode not in ok:
        text = " ".join((proc.stderr or proc.stdout).split())[:300]
        raise DiskError(f"{argv[0]} failed (exit {proc.returncode}): {text}")


def make_image(image: Path, size_mb: int) -> None:
    """A sparse file of `size_mb` MiB with an empty ext4 filesystem, made beside its name and renamed into place."""
    tmp = image.with_name(f".{image.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size_mb << 20)
    finally:
        os.close(fd)
    try:
        run(["mkfs.ext4", "-q", "-F", "-m", RESERVED_PERCENT, "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
             str(tmp)])
        os.rename(tmp, image)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def capable(cap: int) -> bool:
    """Whether this process has the capability `cap` (its effective set)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> cap & 1)
    except OSError:
        pass
    return False


def mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, source) of every mount of this process's namespace, in mount order."""
    with open("/proc/self/mountinfo", "rb") as fh:
        lines = fh.read().splitlines()
    out = []
    for line in lines:
        fields = line.split(b" ")
        try:
            sep = fields.index(b"-")
        except ValueError:
            continue
        if len(fields) < sep + 3 or len(fields) < 5:
            continue
        decode = lambda raw: unescape_mountinfo(raw).decode("utf-8", "surrogateescape")  # noqa: E731
        out.append((decode(fields[4]), decode(fields[sep + 1]), decode(fields[sep + 2])))
    return out


def source_at(point: str) -> str | None:
    """The source of the topmost mount on exactly `point`, or None."""
    found = None
    for mount_point, _fstype, source in mounts():
        if mount_point == point:
            found = source
    return found


def our_image(source: str | None) -> str | None:
    """The image file (as the loop device names it) when `source` is a loop device backed by a data disk image."""
    if not source or not source.startswith("/dev/loop"):
        return None
    try:
        with open(f"/sys/block/{os.path.basename(source)}/loop/backing_file") as fh:
            backing = fh.read().rstrip("\n")
    except OSError:
        return None
    path = backing.removesuffix(" (deleted)")
    if os.path.basename(os.path.dirname(path)) != DISKS or not path.endswith(".img"):
        return None
    return backing


def same_file(backing: str, image: Path) -> bool:
    """Whether the loop device's backing file `backing` (as `our_image` gave it) is `image` itself."""
    if backing.endswith(" (deleted)"):
        return False
    try:
        a, b = os.stat(backing), os.stat(image)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def attached(image: Path) -> bool:
    """Whether a loop device is attached to `image` (its filesystem may be mounted in some namespace)."""
    try:
        mine = os.stat(image)
        names = os.listdir("/sys/block")
    except OSError:
        return False
    for name in names:
        if not name.startswith("loop"):
            continue
        try:
            with open(f"/sys/block/{name}/loop/backing_file") as fh:
                backing = fh.read().rstrip("\n")
            there = os.stat(backing)
        except OSError:
            continue
        if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            return True
    return False


def fs_bytes(image: Path) -> int:
    """The size of the ext4 filesystem in `image`, from its superblock."""
    with open(image, "rb") as fh:
        fh.seek(1024)
        sb = fh.read(1024)
    if len(sb) < 1024 or struct.unpack_from("<H", sb, 0x38)[0] != 0xEF53:
        raise DiskError(f"{image} holds no ext4 filesystem")
    blocks = struct.unpack_from("<I", sb, 0x4)[0]
    if struct.unpack_from("<I", sb, 0x60)[0] & 0x80:  # INCOMPAT_64BIT
        blocks |= struct.unpack_from("<I", sb, 0x150)[0] << 32
    return blocks * (1024 << struct.unpack_from("<I", sb, 0x18)[0])


def detach_all(point: str) -> None:
    """Every mount on `point` unmounted (lazily: a hook still running keeps its view until it ends)."""
    while source_at(point) is not None:
        if not umount(point):
            raise DiskError(f"cannot unmount {point}: {os.strerror(ctypes.get_errno())}")


def umount(point: str) -> bool:
    """The topmost mount on `point` detached (MNT_DETACH); whether it was."""
    lib = libc()
    return lib is not None and lib.umount2(os.fsencode(point), MNT_DETACH) == 0
