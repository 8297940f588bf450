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

Stdlib only (the sandbox's libc handle for umount2).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from .sandbox_cgroups import unescape_mountinfo
from .sandbox_libc import MNT_DETACH, libc

DISKS = ".disks"  # beside the data directories (no plugin name starts with a dot)
SWITCH = "LIBREFANG_DATA_DISKS"  # "0": no images, data directories are plain directories (sandbox.degraded)
TOOLS = ("mkfs.ext4", "e2fsck", "resize2fs", "mount", "losetup")
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
# root's share of each image: the service's own files there (state files, config) are still written once a hook
# has filled the rest (a hook's uid never gets it).
RESERVED_PERCENT = "1"
RETRY_SECS = 60.0  # a data directory that could not be capped is tried again after this
_TOOL_TIMEOUT_SECS = 300
_CAP_SYS_ADMIN = 21

_lock = threading.RLock()  # one process makes one disk ready at a time (and `.disks` is flock'ed across processes)
_ready: dict[str, tuple[int, int]] = {}  # data dir -> (st_dev of its filesystem, max_disk_mb it was checked for)
_notes: dict[str, tuple[str, int, float]] = {}  # data dir -> (what a call's trace says, max_disk_mb, retry after)
_why_not: list = []  # [reason or None]: whether images can be made here at all, probed once per process
_tools: dict[str, str] = {}  # tool -> its path (found on PATH, or in /usr/sbin, /sbin)


class DiskError(Exception):
    pass


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
        _detach_all(os.path.realpath(data_dir))
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
        for point, _fstype, source in _mounts():
            if _under(point, top) and _our_image(source) is not None:
                found.setdefault(os.path.join(os.path.dirname(point), DISKS), []).append(point)
        for disks, points in found.items():
            try:
                with _locked(Path(disks)):
                    released += [point for point in points if _umount(point)]
                    _bump(Path(disks))
            except OSError:  # (its home is going away)
                released += [point for point in points if _umount(point)]
        for key in [k for k in _ready if _under(os.path.realpath(k), top)]:
            del _ready[key]
    return released


def images(parent: Path) -> list[str]:
    """The plugins that have an image beside the data directories in `parent`."""
    try:
        return sorted(name[:-4] for name in os.listdir(Path(parent) / DISKS) if name.endswith(".img"))
    except OSError:
        return []


def usage(data_dir: Path) -> dict | None:
    """{"size_bytes", "used_bytes", "free_bytes", "inodes", "inodes_free"} of a data directory that is a disk of its
    own, None otherwise (for the plugin's state page)."""
    try:
        if _our_image(_source_at(os.path.realpath(data_dir))) is None:
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
    source = _source_at(target)
    if source is not None:
        backing = _our_image(source)
        if backing is None:
            raise DiskError(f"{source} is mounted on it, not its image")
        if not _same_file(backing, image):  # an image deleted while mounted (uninstalled meanwhile): not its own
            _detach_all(target)
            _bump(disks)
            return _make_ready(data_dir, disks, size_mb)
        return os.lstat(target).st_dev, _resize_mounted(image, source, size_mb)
    fresh = not image.exists()
    note = None
    if fresh:
        _make_image(image, size_mb)
    else:
        note = _resize_unmounted(image, size_mb)
    under = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _run(["mount", "-n", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), target])
        _bump(disks)
        moved = _Move(under, target, fresh)
        try:
            moved.copy()
        except (OSError, DiskError, RecursionError) as exc:
            if not fresh:  # its image is mounted, with what it had; the rest stays under the mount point
                return os.lstat(target).st_dev, ((note + "; ") if note else "") + (
                    f"what its directory held before this mount stays under the mount point: {_describe(exc)}")
            _detach_all(target)  # the directory stays as it was, uncapped; the next try starts again
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


def _make_image(image: Path, size_mb: int) -> None:
    """A sparse file of `size_mb` MiB with an empty ext4 filesystem, made beside its name and renamed into place."""
    tmp = image.with_name(f".{image.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size_mb << 20)
    finally:
        os.close(fd)
    try:
        _run(["mkfs.ext4", "-q", "-F", "-m", RESERVED_PERCENT, "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
              str(tmp)])
        os.rename(tmp, image)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _resize_mounted(image: Path, device: str, size_mb: int) -> str | None:
    """A mounted image at another size than the ceiling: grown online where the kernel allows it; otherwise (and
    when lowered) what the trace says until its next mount."""
    have = _fs_bytes(image)
    want = size_mb << 20
    if have == want:
        return None
    if have > want:
        return (f"its image stays at {have >> 20} MB until it is next mounted, then shrinks to the ceiling "
                f"({size_mb} MB, [limits] max_disk_mb) if its data fits")
    try:
        if os.stat(image).st_size < want:
            os.truncate(image, want)
        _run(["losetup", "-c", device])
        _run(["resize2fs", device])
        return None
    except (OSError, DiskError, subprocess.SubprocessError) as exc:
        return (f"its image stays at {have >> 20} MB until it is next mounted, then grows to the ceiling "
                f"({size_mb} MB, [limits] max_disk_mb): online resizing was refused ({_describe(exc)})")


def _resize_unmounted(image: Path, size_mb: int) -> str | None:
    """An image about to be mounted brought to the ceiling: grown, or shrunk when its data fits (checked by resize2fs,
    which refuses before changing anything); else what the trace says."""
    have = _fs_bytes(image)
    want = size_mb << 20
    if have == want:
        return None
    if _attached(image):
        return (f"its image stays at {have >> 20} MB (the ceiling is {size_mb} MB): a process still holds its "
                "filesystem (a loop device is attached to it)")
    try:
        _run(["e2fsck", "-f", "-p", str(image)], ok=(0, 1))
    except DiskError as exc:  # mounted as it is: the kernel copes, resize2fs would not
        return f"its image stays at {have >> 20} MB (the ceiling is {size_mb} MB): {exc}"
    if want > have:
        try:
            if os.stat(image).st_size < want:
                os.truncate(image, want)
            _run(["resize2fs", str(image), f"{size_mb}M"])
        except (OSError, DiskError) as exc:
            return f"its image stays at {have >> 20} MB (the ceiling is {size_mb} MB): {_describe(exc)}"
        return None
    try:
        _run(["resize2fs", str(image), f"{size_mb}M"])
    except DiskError as exc:
        return (f"its image stays at {have >> 20} MB: it cannot shrink to the ceiling ({size_mb} MB, [limits] "
                f"max_disk_mb) without losing data, its own or the filesystem's ({exc})")
    os.truncate(image, want)
    return None


class _Move:
    """What the directory held under the mount point, moved into the new filesystem: copied (owners, modes, times,
    symbolic links as links, hard links as links among the copies, fifos), then the originals removed. Nothing is
    followed through a link. A fresh image takes everything or nothing (DiskError when it does not fit); a mounted
    image of before keeps its own entry where both have one, and the other stays under the mount point (`kept`)."""

    def __init__(self, under: int, target: str, fresh: bool):
        self.under, self.target, self.fresh = under, target, fresh
        self.links: dict[tuple[int, int], str] = {}  # a file with several links inside: where its first copy is
        self.inside: dict[tuple[int, int], int] = {}  # links found inside, of each file that has several
        self.kept, self.kept_names = 0, []

    def copy(self) -> None:
        """Everything into the image (raises OSError, DiskError; nothing is removed yet)."""
        self.skip: set[str] = set()
        if self.fresh:
            _rmdir_lost_found(self.target)
        if not os.listdir(self.under):
            return
        root = os.open(self.target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            blocks, entries = _usage(self.under, self.inside)
            if self.fresh:
                fs = os.fstatvfs(root)
                if blocks * 512 > fs.f_bavail * fs.f_frsize or entries > fs.f_favail:
                    raise DiskError(f"the directory holds {blocks * 512 >> 20} MB in {entries} entries, more than its "
                                    f"image of {(fs.f_blocks * fs.f_frsize) >> 20} MB takes ([limits] max_disk_mb)")
            self.skip = self._copy_dir(self.under, root, "")
        finally:
            os.close(root)

    def remove_originals(self) -> None:
        """What was copied, removed from under the mount point (what was not stays, `kept`). Best effort: what
        cannot be removed stays there, a copy of what the image has."""
        try:
            self._remove(self.under, "", self.skip)
        except OSError:
            pass

    def _copy_dir(self, src: int, dst: int, rel: str) -> set[str]:
        """Copy the entries of `src` into `dst`; the relative paths not copied (left where they are)."""
        skip: set[str] = set()
        for name in os.listdir(src):
            path = os.path.join(rel, name)
            st = os.lstat(name, dir_fd=src)
            try:
                there = os.lstat(name, dir_fd=dst)
            except FileNotFoundError:
                there = None
            if there is not None:
                if stat.S_ISDIR(st.st_mode) and stat.S_ISDIR(there.st_mode):
                    with _opened(name, src) as s, _opened(name, dst) as d:
                        skip |= self._copy_dir(s, d, path)
                else:
                    skip.add(path)
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)
                    or stat.S_ISFIFO(st.st_mode)):
                skip.add(path)  # a socket or device node: nothing a hook could use again
                continue
            try:
                self._copy(name, st, src, dst, path, skip)
            except OSError as exc:
                if self.fresh:
                    raise
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                _remove_tree(name, dst)
                skip.add(path)
        return skip

    def _copy(self, name: str, st: os.stat_result, src: int, dst: int, path: str, skip: set[str]) -> None:
        mode = stat.S_IMODE(st.st_mode) & ~0o6000  # no set-id bits (the mount is nosuid anyway)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=dst)
            with _opened(name, src) as s, _opened(name, dst) as d:
                skip |= self._copy_dir(s, d, path)
                os.fchown(d, st.st_uid, st.st_gid)
                os.fchmod(d, mode)
                os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
        elif stat.S_ISREG(st.st_mode):
            if st.st_nlink > self.inside.get((st.st_dev, st.st_ino), 1):
                # A link to a file elsewhere (hook_dirs.hand_over leaves such files alone): its copy, alone in the
                # new filesystem, would be handed to the plugin's identity. It stays where it is.
                skip.add(path)
                return
            first = self.links.get((st.st_dev, st.st_ino)) if st.st_nlink > 1 else None
            if first is not None:
                root = os.open(self.target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.link(first, name, src_dir_fd=root, dst_dir_fd=dst, follow_symlinks=False)
                finally:
                    os.close(root)
                return
            s = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src)
            try:
                if not stat.S_ISREG(os.fstat(s).st_mode):
                    skip.add(path)  # replaced meanwhile
                    return
                d = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                            dir_fd=dst)
                try:
                    while True:
                        chunk = os.read(s, 1 << 20)
                        if not chunk:
                            break
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(d, view):]
                    os.fchown(d, st.st_uid, st.st_gid)
                    os.fchmod(d, mode)
                    os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
                finally:
                    os.close(d)
            finally:
                os.close(s)
            if st.st_nlink > 1:
                self.links[(st.st_dev, st.st_ino)] = path
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
            os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
            os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)
        else:
            os.mkfifo(name, mode, dir_fd=dst)
            os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)

    def _remove(self, fd: int, rel: str, skip: set[str]) -> None:
        """Remove from under the mount point what was copied (everything but `skip`)."""
        for name in os.listdir(fd):
            path = os.path.join(rel, name)
            if path in skip:
                self.kept += 1
                if len(self.kept_names) < 5:
                    self.kept_names.append(path)
                continue
            st = os.lstat(name, dir_fd=fd)
            if stat.S_ISDIR(st.st_mode):
                with _opened(name, fd) as inner:
                    self._remove(inner, path, skip)
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY:
                        raise
            else:
                os.unlink(name, dir_fd=fd)


# ---- pieces ----------------------------------------------------------------------------------------------------

def _probe() -> str | None:
    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"turned off ({SWITCH}=0)"
    if not sys.platform.startswith("linux"):
        return f"no loop devices on {sys.platform}"
    if os.geteuid() != 0:
        return "the service is not root (each is a loop-mounted image, which needs root)"
    if not _capable(_CAP_SYS_ADMIN):
        return "the service has no CAP_SYS_ADMIN (each is a loop-mounted image, which needs it)"
    if not os.path.exists("/dev/loop-control"):
        return "this system has no loop devices (/dev/loop-control is missing)"
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"])
    for tool in TOOLS:
        _tools[tool] = shutil.which(tool, path=search) or ""
    missing = [tool for tool in TOOLS if not _tools[tool]]
    if missing:
        return f"{', '.join(missing)} not found (Debian: e2fsprogs, mount)"
    return None


def _capable(cap: int) -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> cap & 1)
    except OSError:
        pass
    return False


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


class _opened:
    """A directory entry opened as a directory, following no link."""

    def __init__(self, name: str, dir_fd: int):
        self.fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def _image(data_dir: Path) -> Path:
    return data_dir.parent / DISKS / f"{data_dir.name}.img"


def _bump(disks: Path) -> None:
    """Move `epoch` forward (the directory's mtime, strictly later than before)."""
    now = max(time.time_ns(), os.stat(disks).st_mtime_ns + 1)
    os.utime(disks, ns=(now, now))


def _run(argv: list[str], ok: tuple[int, ...] = (0,)) -> None:
    proc = subprocess.run([_tools.get(argv[0]) or argv[0], *argv[1:]], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=_TOOL_TIMEOUT_SECS, env={**os.environ, "LC_ALL": "C"})
    if proc.returncode not in ok:
        text = " ".join((proc.stderr or proc.stdout).split())[:300]
        raise DiskError(f"{argv[0]} failed (exit {proc.returncode}): {text}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "what the directory held is nested too deeply to be moved into an image"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__


def _mounts() -> list[tuple[str, str, str]]:
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


def _source_at(point: str) -> str | None:
    """The source of the topmost mount on exactly `point`, or None."""
    found = None
    for mount_point, _fstype, source in _mounts():
        if mount_point == point:
            found = source
    return found


def _our_image(source: str | None) -> str | None:
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


def _same_file(backing: str, image: Path) -> bool:
    if backing.endswith(" (deleted)"):
        return False
    try:
        a, b = os.stat(backing), os.stat(image)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _attached(image: Path) -> bool:
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


def _fs_bytes(image: Path) -> int:
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


def _detach_all(point: str) -> None:
    """Every mount on `point` unmounted (lazily: a hook still running keeps its view until it ends)."""
    while _source_at(point) is not None:
        if not _umount(point):
            raise DiskError(f"cannot unmount {point}: {os.strerror(_last_errno())}")


def _umount(point: str) -> bool:
    lib = libc()
    return lib is not None and lib.umount2(os.fsencode(point), MNT_DETACH) == 0


def _last_errno() -> int:
    import ctypes

    return ctypes.get_errno()


def _rmdir_lost_found(target: str) -> None:
    try:
        os.rmdir(os.path.join(target, "lost+found"))  # e2fsck makes it again when it needs it
    except OSError:
        pass


def _usage(fd: int, links: dict[tuple[int, int], int]) -> tuple[int, int]:
    """(512-byte blocks, entries) below the directory `fd`, following no link; `links` counts the names found of
    each regular file that has more than one."""
    blocks = entries = 0
    for _root, dirs, files, inner in os.fwalk(dir_fd=fd, follow_symlinks=False):
        for name in dirs + files:
            try:
                st = os.lstat(name, dir_fd=inner)
            except FileNotFoundError:
                continue
            blocks += st.st_blocks
            entries += 1
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                links[(st.st_dev, st.st_ino)] = links.get((st.st_dev, st.st_ino), 0) + 1
    return blocks, entries


def _remove_tree(name: str, dir_fd: int) -> None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        with _opened(name, dir_fd) as inner:
            for child in os.listdir(inner):
                _remove_tree(child, inner)
        os.rmdir(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
