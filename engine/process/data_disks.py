"""Each plugin's data directory a filesystem of its own, so that what its hooks store there is capped in bytes and in
inodes: a sparse ext4 image per plugin, `<parent of the data directories>/.disks/<plugin>.img` (for a service,
`$LIBREFANG_HOME/plugin_data/.disks/`, concealed from hooks with the rest of the home), loop-mounted nosuid,nodev on
the data directory and sized to the operator's `[limits] max_disk_mb`. A hook that fills it gets ENOSPC; the host's
disk, the service and other plugins are not affected (the policy: docs/security.md, "disk").

- `ensure` makes it ready once per plugin (engine/process/hook_dirs.py `prepare_data_dir`, on every spawn path; the
  wasm runtime and install-deps call it too); then a call costs one lstat. What the directory held before (a data
  directory from before, a file the service wrote there first) is moved into the new filesystem, owners, modes and
  links kept; sockets and device nodes stay where they were.
- A mount outlives the process that made it: another process (a restart, another worker) finds it and uses it, or
  mounts the image again. `librefang start` releases its home's mounts when it stops (`release_all`); a service
  killed with SIGKILL leaves them mounted, and the next one uses them as they are.
- A raised ceiling grows the filesystem online where the kernel lets the service (CAP_SYS_RESOURCE), else at its next
  mount; a lowered one shrinks it at its next mount if its data fits, else it keeps its size (nothing is lost). Each
  call's trace says so meanwhile (`note`).
- `remove` (uninstall) unmounts it and deletes the image, and the plugin's data with it.
- Every mount and unmount moves `epoch` forward: a sandbox spare that entered its mount namespace before it
  (engine/process/sandbox_spare.py `shape_of`) is not used, since the mount is not in its view.
- Where it cannot be done (not root, no loop devices, no mkfs.ext4, LIBREFANG_DATA_DISKS=0) hooks run as before and
  `degraded_reasons` says why (`sandbox.degraded`); a plugin whose directory could not be capped gets a `data_disk:`
  warning on each call.

Stdlib only, like its two parts: engine/process/data_disk_images.py (the tools, images, loop devices and the mount
table) and engine/process/data_disk_move.py (what the directory held, moved into its image).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import data_disk_images as images
from .data_disk_images import DISKS, MOUNT_OPTIONS, DiskError
from .data_disk_move import Move

__all__ = ["DISKS", "SWITCH", "DiskError", "degraded_reasons", "ensure", "epoch", "forget", "images_of", "note",
           "release_all", "remove", "unavailable", "usage"]

SWITCH = "LIBREFANG_DATA_DISKS"  # "0": no images, data directories are plain directories (sandbox.degraded)
RETRY_SECS = 60.0  # a data directory that could not be capped is tried again after this
_CAP_SYS_ADMIN = 21

_lock = threading.RLock()  # one process makes one disk ready at a time (and `.disks` is flock'ed across processes)
_ready: dict[str, tuple[int, int]] = {}  # data dir -> (st_dev of its filesystem, max_disk_mb it was checked for)
_notes: dict[str, tuple[str, int, float]] = {}  # data dir -> (what a call's trace says, max_disk_mb, retry after)
_why_not: list = []  # [reason or None]: whether images can be made here at all, probed once per process


# ---- what the callers use --------------------------------------------------------------------------------------

def ensure(data_dir: Path, size_mb: int) -> None:
    """Make the existing directory `data_dir` a filesystem of its own of `size_mb` MiB, once per process; after
    that one lstat. Never raises: what could not be done is said by `note` (and `degraded_reasons`)."""
    key, size_mb = str(data_dir), int(size_mb)
    ready = _ready.get(key)
    if ready is not None and ready[1] == size_mb:
        try:
            if os.lstat(data_dir).st_dev == ready[0]:
                return
        except OSError:
            pass
    noted = _notes.get(key)
    if noted is not None and noted[1] == size_mb and key not in _ready and time.monotonic() < noted[2]:
        return  # could not be capped a moment ago: not tried again on every call
    if unavailable() is not None:
        return
    with _lock:
        _ready.pop(key, None)
        try:
            with _locked(Path(data_dir).parent / DISKS) as disks:
                dev, note = _make_ready(Path(data_dir), disks, size_mb)
        except (OSError, DiskError, subprocess.SubprocessError, RecursionError) as exc:
            # (RecursionError: a directory from before nested deeper than the move walks; it stays as it is)
            _notes[key] = (f"not size-capped: {_describe(exc)}", size_mb, time.monotonic() + RETRY_SECS)
            return
        _ready[key] = (dev, size_mb)
        if note:
            _notes[key] = (note, size_mb, 0.0)
        else:
            _notes.pop(key, None)


def note(data_dir: Path | None) -> str | None:
    """What this call's trace says of its data directory's cap (None: capped at the ceiling, or not made here)."""
    if data_dir is None:
        return None
    noted = _notes.get(str(data_dir))
    return noted[0] if noted is not None else None


def epoch(data_dir: Path | None) -> int:
    """The data disks' mounts beside `data_dir`, as a number that moves whenever one is mounted or unmounted."""
    if data_dir is None:
        return 0
    try:
        return os.stat(os.path.join(os.path.dirname(data_dir), DISKS)).st_mtime_ns
    except OSError:
        return 0


def unavailable() -> str | None:
    """Why images cannot be made here (None: they can). Probed once per process."""
    if not _why_not:
        with _lock:
            if not _why_not:
                _why_not.append(_probe())
    return _why_not[0]


def degraded_reasons() -> list[str]:
    why = unavailable()
    if why is None:
        return []
    return [f"plugins' data directories are not size-capped: {why}; a hook can fill the host's disk through its "
            "data directory ([limits] max_disk_mb still caps each file, /tmp and /dev/shm: docs/security.md)"]


def forget() -> None:
    """Probe again and check every data directory again on next use (tests: a restarted service's view)."""
    with _lock:
        _why_not.clear()
        _ready.clear()
        _notes.clear()


def remove(data_dir: Path) -> bool:
    """Uninstall: the data directory unmounted and its image deleted (the plugin's data goes with it). Whether an
    image was there."""
    image = _image(Path(data_dir))
    if not image.parent.is_dir():
        return False
    with _lock, _locked(image.parent):
        images.detach_all(os.path.realpath(data_dir))
        found = image.exists()
        image.unlink(missing_ok=True)
        _bump(image.parent)
        _ready.pop(str(data_dir), None)
        _notes.pop(str(data_dir), None)
    return found


def release_all(root: Path) -> list[str]:
    """Unmount every data disk mounted under `root` (a home that goes away, a service that stops); their images
    stay. The mount points released."""
    top = os.path.realpath(root)
    released = []
    with _lock:
        found: dict[str, list[str]] = {}  # `.disks` -> its images' mount points under `top`
        for point, _fstype, source in images.mounts():
            if _under(point, top) and images.our_image(source) is not None:
                found.setdefault(os.path.join(os.path.dirname(point), DISKS), []).append(point)
        for disks, points in found.items():
            try:
                with _locked(Path(disks)):
                    released += [point for point in points if images.umount(point)]
                    _bump(Path(disks))
            except OSError:  # (its home is going away)
                released += [point for point in points if images.umount(point)]
        for key in [k for k in _ready if _under(os.path.realpath(k), top)]:
            del _ready[key]
    return released


def images_of(parent: Path) -> list[str]:
    """The plugins that have an image beside the data directories in `parent`."""
    try:
        return sorted(name[:-4] for name in os.listdir(Path(parent) / DISKS) if name.endswith(".img"))
    except OSError:
        return []


def usage(data_dir: Path) -> dict | None:
    """{"size_bytes", "used_bytes", "free_bytes", "inodes", "inodes_free"} of a data directory that is a disk of its
    own, None otherwise (for the plugin's state page)."""
    try:
        if images.our_image(images.source_at(os.path.realpath(data_dir))) is None:
            return None
        fs = os.statvfs(data_dir)
    except OSError:
        return None
    return {"size_bytes": fs.f_blocks * fs.f_frsize, "used_bytes": (fs.f_blocks - fs.f_bfree) * fs.f_frsize,
            "free_bytes": fs.f_bavail * fs.f_frsize, "inodes": fs.f_files, "inodes_free": fs.f_favail}


# ---- making one ready ------------------------------------------------------------------------------------------

def _make_ready(data_dir: Path, disks: Path, size_mb: int) -> tuple[int, str | None]:
    """(st_dev of the mounted filesystem, what the trace should say or None). Raises OSError, DiskError."""
    image = disks / f"{data_dir.name}.img"
    target = os.path.realpath(data_dir)
    source = images.source_at(target)
    if source is not None:
        backing = images.our_image(source)
        if backing is None:
            raise DiskError(f"{source} is mounted on it, not its image")
        if not images.same_file(backing, image):  # an image deleted while mounted (uninstalled meanwhile): not its own
            images.detach_all(target)
            _bump(disks)
            return _make_ready(data_dir, disks, size_mb)
        return os.lstat(target).st_dev, _resize_mounted(image, source, size_mb)
    fresh = not image.exists()
    note = None
    if fresh:
        images.make_image(image, size_mb)
    else:
        note = _resize_unmounted(image, size_mb)
    under = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            images.run(["mount", "-n", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), target])
        except DiskError:
            if fresh:
                image.unlink(missing_ok=True)
            raise
        _bump(disks)
        # An image that holds nothing yet (just made, or made by a process that died before it was used) takes
        # what the directory held all or nothing.
        fresh = fresh or not [name for name in os.listdir(target) if name != "lost+found"]
        if fresh:
            _rmdir_lost_found(target)  # (e2fsck makes it again when it needs it)
        moved = Move(under, target, fresh)
        try:
            moved.copy()
        except (OSError, DiskError, RecursionError) as exc:
            if not fresh:  # its image is mounted, with what it had; the rest stays under the mount point
                return os.lstat(target).st_dev, ((note + "; ") if note else "") + (
                    f"what its directory held before this mount stays under the mount point: {_describe(exc)}")
            images.detach_all(target)  # the directory stays as it was, uncapped; the next try starts again
            image.unlink(missing_ok=True)
            _bump(disks)
            raise
        # Only once everything is in the image: what fails from here on is at worst in both places.
        moved.remove_originals()
        # The directory under the mount point is no hook's: a view that binds it (it cannot, engine/process/
        # sandbox_spare.py shape_of) would not be writable to the hook, rather than writable without a cap.
        os.fchown(under, 0, 0)
        os.fchmod(under, 0o700)
    finally:
        os.close(under)
    if moved.kept:
        note = ((note + "; ") if note else "") + (
            f"not moved into its image, left under the mount point ({moved.kept}): {', '.join(moved.kept_names)}"
            + (" ..." if moved.kept > len(moved.kept_names) else "") + " (links to files elsewhere, sockets, "
            "devices, or names its image already had)")
    return os.lstat(target).st_dev, note


def _resize_mounted(image: Path, device: str, size_mb: int) -> str | None:
    """A mounted image at another size than the ceiling: grown online where the kernel allows it; otherwise (and
    when lowered) what the trace says until its next mount."""
    have = images.fs_bytes(image)
    want = size_mb << 20
    if have == want:
        return None
    if have > want:
        return (f"its image stays at {have >> 20} MB until it is next mounted, then shrinks to the ceiling "
                f"({size_mb} MB, [limits] max_disk_mb) if its data fits")
    try:
        if os.stat(image).st_size < want:
            os.truncate(image, want)
        images.run(["losetup", "-c", device])
        images.run(["resize2fs", device])
        return None
    except (OSError, DiskError, subprocess.SubprocessError) as exc:
        return (f"its image stays at {have >> 20} MB until it is next mounted, then grows to the ceiling "
                f"({size_mb} MB, [limits] max_disk_mb): online resizing was refused ({_describe(exc)})")


def _resize_unmounted(image: Path, size_mb: int) -> str | None:
    """An image about to be mounted brought to the ceiling: grown, or shrunk when its data fits (checked by resize2fs,
    which refuses before changing anything); else what the trace says."""
    have = images.fs_bytes(image)
    want = size_mb << 20
    if have == want:
        return None
    if images.attached(image):
        return (f"its image stays at {have >> 20} MB (the ceiling is {size_mb} MB): a process still holds its "
                "filesystem (a loop device is attached to it)")
    try:
        images.run(["e2fsck", "-f", "-p", str(image)], ok=(0, 1))
    except DiskError as exc:  # mounted as it is: the kernel copes, resize2fs would not
        return f"its image stays at {have >> 20} MB (the ceiling is {size_mb} MB): {exc}"
    if want > have:
        try:
            if os.stat(image).st_size < want:
                os.truncate(image, want)
            images.run(["resize2fs", str(image), f"{size_mb}M"])
        except (OSError, DiskError) as exc:
            return f"its image stays at {have >> 20} MB (the ceiling is {size_mb} MB): {_describe(exc)}"
        return None
    try:
        images.run(["resize2fs", str(image), f"{size_mb}M"])
    except DiskError as exc:
        return (f"its image stays at {have >> 20} MB: it cannot shrink to the ceiling ({size_mb} MB, [limits] "
                f"max_disk_mb) without losing data, its own or the filesystem's ({exc})")
    os.truncate(image, want)
    return None


# ---- pieces ----------------------------------------------------------------------------------------------------

def _probe() -> str | None:
    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"turned off ({SWITCH}=0)"
    if not sys.platform.startswith("linux"):
        return f"no loop devices on {sys.platform}"
    if os.geteuid() != 0:
        return "the service is not root (each is a loop-mounted image, which needs root)"
    if not images.capable(_CAP_SYS_ADMIN):
        return "the service has no CAP_SYS_ADMIN (each is a loop-mounted image, which needs it)"
    if not os.path.exists("/dev/loop-control"):
        return "this system has no loop devices (/dev/loop-control is missing)"
    missing = images.missing_tools()
    if missing:
        return f"{', '.join(missing)} not found (Debian: e2fsprogs, mount)"
    return None


class _locked:
    """The `.disks` directory (made 0700 if missing), flock'ed: one process at a time mounts, resizes or removes."""

    def __init__(self, disks: Path):
        self.disks = disks

    def __enter__(self) -> Path:
        try:
            os.mkdir(self.disks, 0o700)
        except FileExistsError:
            pass
        self.fd = os.open(self.disks, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self.disks

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # (the lock goes with it)


def _image(data_dir: Path) -> Path:
    return data_dir.parent / DISKS / f"{data_dir.name}.img"


def _bump(disks: Path) -> None:
    """Move `epoch` forward (the directory's mtime, strictly later than before)."""
    now = max(time.time_ns(), os.stat(disks).st_mtime_ns + 1)
    os.utime(disks, ns=(now, now))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "what the directory held is nested too deeply to be moved into an image"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__


def _rmdir_lost_found(target: str) -> None:
    try:
        os.rmdir(os.path.join(target, "lost+found"))
    except OSError:
        pass


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
