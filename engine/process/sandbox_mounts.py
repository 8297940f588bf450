"""The hook's view of the filesystem, built in its private mount namespace in two parts: `prepare_view`, the same for
every call of one service (a spare child does it ahead of its call: engine/process/sandbox_spare.py `pre_enter`), then
`bind_kept`, the call's own directories (engine/process/sandbox_enter.py `enter` does both at once).

- every mount read-only (but /proc and /dev, whose devices a hook writes to);
- a private, size-capped tmpfs on /tmp and /dev/shm, gone with the namespace;
- the covers: an empty read-only tmpfs over each concealed directory (the service's home and code tree, /root,
  /home, /run, ... and, with allow_filesystem = false, every top-level directory that is not the system's) and an
  unreadable file over each concealed file (/etc/shadow, ...);
- the call's directories bound back at their paths, through the covers: the plugin's own directory and its launcher
  read-only, its data directory writable.
What is concealed is decided by the caller (engine/process/runner.py `sandbox_spec`, docs/security.md); this module
only applies it. Stdlib only, like engine/process/sandbox.py; engine/process/native/spare.c does the same in C.
"""

from __future__ import annotations

import os

from .sandbox_cgroups import unescape_mountinfo as _unescape
from .sandbox_libc import (
    MS_BIND,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_RELATIME,
    MS_REMOUNT,
    MS_STRICTATIME,
    _check,
    _mount,
)

_LOCKED_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                   "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PRIVATE_DIRS = ("/tmp", "/dev/shm")  # the hook's own tmpfs, writable
_COVER = MS_NOSUID | MS_NODEV | MS_NOEXEC
_MASK = "/tmp/.librefang-mask"  # the unreadable file bound over concealed files, unlinked once bound


class View:
    """What `prepare_view` leaves for the call's part: descriptors of the covered directories as they are under their
    covers (a kept directory is bound from there), which covers are sealed (read-only), and the mounts' options."""

    def __init__(self, sources: dict, covers: list, mounts: list):
        self.sources = sources  # path -> O_PATH descriptor, opened before it was covered
        self.covers = covers  # covered directories (the private ones included)
        self.sealed = set(covers) - set(PRIVATE_DIRS)
        self.mounts = mounts  # [(mount point, locked flags)] as the namespace had them

    def close(self) -> None:
        for fd in self.sources.values():
            os.close(fd)
        self.sources = {}


def shape_covers(hide, covers, private: bool) -> tuple:
    """(directories, files) to cover, as they are now: existing ones, none below another (or below a private tmpfs),
    the home among them unless a wider cover hides it already."""
    dirs = [p for p in (*covers, *((hide,) if hide else ())) if os.path.isdir(p) and not os.path.islink(p)]
    files = [p for p in covers if os.path.isfile(p) and not os.path.islink(p)]
    outer = [*(PRIVATE_DIRS if private else ()), *dirs]
    dirs = [p for p in dict.fromkeys(dirs) if not any(o != p and _under(p, o) for o in outer)]
    files = [p for p in files if not any(_under(p, o) for o in outer)]
    return dirs, files


def prepare_view(lib, hide, covers, tmp_mb: int) -> View:
    """The call-independent part of the view, in a fresh mount namespace (nothing reaches the service's)."""
    _mount(lib, None, "/", None, MS_REC | MS_PRIVATE)
    dirs, files = shape_covers(hide, covers, tmp_mb > 0)
    private = [p for p in PRIVATE_DIRS if tmp_mb > 0 and os.path.isdir(p)]
    sources = {p: os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in (*private, *dirs)}
    mounts = _read_only_mounts(lib)
    for path in private:
        _mount(lib, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_mb}m")
    for path in dirs:
        _mount(lib, "tmpfs", path, "tmpfs", _COVER, "mode=0755,size=64k")
        _seal(lib, path, True)
    if files:
        _mask_files(lib, files)
    return View(sources, [*private, *dirs], mounts)


def bind_kept(lib, view: View, kept) -> None:
    """Bind the call's directories (and files) back at their paths: `kept` is [path, real path, writable]. Through a
    sealed cover, the cover is opened for the mount point and sealed again."""
    opened = set()
    try:
        for path, real, writable in kept:
            fd = _open_source(view, real)
            try:
                cover = _deepest(path, view.covers)
                if cover is not None:
                    if cover in view.sealed and cover not in opened:
                        _seal(lib, cover, False)
                        opened.add(cover)
                    _make_mount_point(path, os.path.isdir(f"/proc/self/fd/{fd}"))
                _mount(lib, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            finally:
                os.close(fd)
            flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | _locked_at(view.mounts, real)
            _mount(lib, None, path, None, flags if writable else flags | MS_RDONLY)
    finally:
        for cover in opened:
            _seal(lib, cover, True)
        view.close()


def kept_dirs(spec) -> list:
    """[path, real path, writable] of what the call binds back: resolved where everything is still visible (the
    service, or the helper that hands the call over). A linked directory is bound at its real path too (the hook's
    script is named by its real path)."""
    writable = set(spec.writable)
    out = []
    for path in spec.keep:
        if os.path.exists(path):
            real = os.path.realpath(path)
            out.append([path, real, path in writable])
            if real != path:
                out.append([real, real, path in writable])
    return out


def _open_source(view: View, real: str) -> int:
    """An O_PATH descriptor on `real` as it is under the covers (reached through the deepest covered ancestor)."""
    top = _deepest(real, view.sources)
    flags = os.O_PATH | os.O_CLOEXEC
    if top is None:
        return os.open(real, flags)
    rel = os.path.relpath(real, top)
    return os.open(rel, flags, dir_fd=view.sources[top]) if rel != "." else os.dup(view.sources[top])


def _deepest(path: str, tops) -> str | None:
    found = [t for t in tops if _under(path, t)]
    return max(found, key=len) if found else None


def _make_mount_point(path: str, directory: bool) -> None:
    """Directories traversable by the hook's identity (mode 0755 whatever the umask: the service's is 077)."""
    mask = os.umask(0o022)
    try:
        os.makedirs(path if directory else os.path.dirname(path), 0o755, exist_ok=True)
        if not directory:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    finally:
        os.umask(mask)


def _seal(lib, path: str, read_only: bool) -> None:
    _mount(lib, None, path, None, MS_BIND | MS_REMOUNT | _COVER | (MS_RDONLY if read_only else 0))


def _mask_files(lib, files) -> None:
    """An unreadable empty file (mode 0, on the private /tmp) bound read-only over each concealed file."""
    fd = os.open(_MASK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0)
    os.close(fd)
    try:
        for path in files:
            _mount(lib, _MASK, path, None, MS_BIND)
            _mount(lib, None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _COVER)
    finally:
        os.unlink(_MASK)


def _read_only_mounts(lib) -> list:
    """Every mount but /proc's and /dev's made read-only (the flags a user namespace locks kept); returns [(mount
    point, locked flags)] of every mount."""
    found = []
    for mountpoint, options in _mounts():
        locked = sum(flag for name, flag in _LOCKED_OPTIONS.items() if name in options)
        found.append((mountpoint, locked))
        if _under(mountpoint, "/proc") or _under(mountpoint, "/dev") or "ro" in options:
            continue
        # Best effort per mount (one may be gone or refuse); "/" and /sys themselves must succeed.
        rc = lib.mount(None, os.fsencode(mountpoint), None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked, None)
        if rc != 0 and mountpoint in ("/", "/sys"):
            _check(rc, f"read-only {mountpoint}")
    return found


def _locked_at(mounts: list, path: str) -> int:
    """The locked flags of the mount `path` is on (a bind of it must keep them)."""
    best, flags = "", 0
    for point, locked in mounts:
        if _under(path, point) and len(point) >= len(best):
            best, flags = point, locked
    return flags


def _mounts() -> list:
    with open("/proc/self/mountinfo", "rb") as fh:
        lines = fh.read().splitlines()
    out = []
    for line in lines:
        fields = line.split(b" ")
        if len(fields) < 6:
            continue
        point = _unescape(fields[4]).decode("utf-8", "surrogateescape")
        out.append((point, set(fields[5].decode().split(","))))
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
