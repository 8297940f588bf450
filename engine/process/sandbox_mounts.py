"""The hook's view of the filesystem, built in its private mount namespace (engine/process/sandbox_enter.py `enter`,
engine/process/sandbox_spare.py `pre_enter`): `$LIBREFANG_HOME` covered by an empty read-only tmpfs with the kept
directories bound back, /sys read-only, and with `allow_filesystem = false` every other mount read-only except the
writable directories. Stdlib only, like engine/process/sandbox.py.
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


def kept_dirs(spec) -> list:
    """[path, real path] of the directories a prepared init binds back into the covered home: what `open_kept`
    would open, resolved where the home is still visible."""
    if not (spec.hide and os.path.isdir(spec.hide)):
        return []
    return [[path, os.path.realpath(path)] for path in spec.keep if _under(path, spec.hide) and os.path.isdir(path)]


def open_kept(spec) -> list:
    """(path, O_PATH descriptor) of the directories bound back into the covered home, opened while the home is
    still visible."""
    if not (spec.hide and os.path.isdir(spec.hide)):
        return []
    return [(path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            for path in spec.keep if _under(path, spec.hide) and os.path.isdir(path)]


def _build_view(lib, spec) -> None:
    _mount(lib, None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here reaches the service's mounts
    if spec.hide and os.path.isdir(spec.hide):
        kept = open_kept(spec)  # held open across the tmpfs, then bound back from the descriptor
        _mount(lib, "tmpfs", spec.hide, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        _bind_back(lib, spec.hide, kept)
    _read_only_mounts(lib, spec.read_only, spec.writable, sys_only=False)


def _bind_back(lib, hide: str, kept: list) -> None:
    """Bind the kept directories into the tmpfs covering `hide`, then make that tmpfs read-only."""
    for path, fd in kept:
        os.makedirs(path, exist_ok=True)
        _mount(lib, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    _mount(lib, None, hide, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _read_only_mounts(lib, read_only: bool, writable: tuple, sys_only: bool) -> None:
    """/sys read-only; with `read_only` every other mount too, except the `writable` directories."""
    if read_only and not sys_only:
        for path in writable:  # own mounts, so that they stay writable when everything else is not
            if os.path.isdir(path):
                _mount(lib, path, path, None, MS_BIND | MS_REC)
    for mountpoint, options in _mounts():
        if _under(mountpoint, "/proc") or _under(mountpoint, "/dev"):
            continue
        if not _under(mountpoint, "/sys"):
            if sys_only or not read_only or any(_under(mountpoint, w) for w in writable):
                continue
        if "ro" in options:
            continue
        locked = sum(flag for name, flag in _LOCKED_OPTIONS.items() if name in options)
        # Best effort per mount (one may be gone or refuse); "/" and /sys themselves must succeed.
        rc = lib.mount(None, os.fsencode(mountpoint), None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked, None)
        if rc != 0 and mountpoint in ("/", "/sys"):
            _check(rc, f"read-only {mountpoint}")


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

