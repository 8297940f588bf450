"""The hook's view of the filesystem, built in its private mount namespace by carrying out a plan's steps
(engine/process/sandbox_plan.py, which decides what is covered, masked, made private and bound back): `prepare_view`,
the same for every call of one service (a spare child does it ahead of its call: engine/process/sandbox_spare.py
`pre_enter`), then `bind_kept`, the call's own directories (engine/process/sandbox_enter.py `enter` does both at
once). engine/process/native/spare.c carries out the same steps in C.

How, here:
- a cover is an empty tmpfs (nosuid, nodev, noexec); what it hides stays reachable to the binds through a
  descriptor opened before it was mounted;
- every mount is made read-only by one recursive mount_setattr(2) where the kernel has it, which seals the covers and
  masks too; elsewhere each mount is remounted read-only before anything is stacked on it and each cover and mask is
  sealed at the plan's read-only step (device files stay writable on a read-only mount: /dev/null, /dev/ptmx; /proc
  is the namespace's own);
- a kept path is bound through the covers (a sealed cover opened for its mount point and sealed again), nosuid and
  nodev, read-only unless the plan says writable.
Stdlib only, like engine/process/sandbox.py.
"""

from __future__ import annotations

import os
import stat

from .sandbox_cgroups import unescape_mountinfo
from .sandbox_libc import (
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
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
    SetupError,
    check,
    has_mount_setattr,
    mount,
    mount_setattr,
)
from .sandbox_plan import BIND, COVER, MASK, MOUNT_POINT, PRIVATE, PRIVATE_DIRS, READ_ONLY, SEAL, under

_LOCKED_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                   "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
_COVER = MS_NOSUID | MS_NODEV | MS_NOEXEC
_MASK = ".librefang-mask"  # the unreadable file bound over concealed files, unlinked once bound


class View:
    """What `prepare_view` leaves for the call's part: descriptors of the covered directories as they are under their
    covers (a kept directory is bound from there), which covers are sealed (read-only), and the mounts' options."""

    def __init__(self, mounts: list | None):
        self.sources = {}  # path -> O_PATH descriptor, opened before it was covered
        self.covers = []  # covered directories (the private ones included)
        self.sealed = set()  # covers made read-only (not the private ones)
        # [(mount point, locked flags)] as the namespace had them, for remounting a bind the old way; None where
        # mount_setattr(2) made the view read-only (and so sets a bind's flags: no flag to restate)
        self.mounts = mounts
        self.unsealed = []  # covers and masks made since the last read-only step (sealed there, the old way)
        self.mask = None  # the mask file while masks are being bound (unlinked after the last)
        self.made = set()  # mount points made ahead, in a cover still writable then
        self.dirs = set()  # directories made in the covers so far (each made once)

    def close(self) -> None:
        for fd in self.sources.values():
            os.close(fd)
        self.sources = {}


def prepare_view(lib, steps) -> View:
    """The call-independent part of the view, in a fresh mount namespace (nothing reaches the service's): `steps`
    (engine/process/sandbox_plan.py `view_plan`) carried out in order."""
    mount(lib, None, "/", None, MS_REC | MS_PRIVATE)
    view = View(None if has_mount_setattr(lib) else _read_only_mounts(lib))
    try:
        for step in steps:
            if view.mask is not None and step[0] != MASK:
                _drop_mask(view)
            _STEPS[step[0]](lib, view, *step[1:])
    finally:
        _drop_mask(view)
    return view


def _cover(lib, view: View, path: str) -> None:
    view.sources[path] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    mount(lib, "tmpfs", path, "tmpfs", _COVER, "mode=0755,size=64k")
    view.covers.append(path)
    view.sealed.add(path)
    view.unsealed.append(path)


def _mask(lib, view: View, path: str, directory: str) -> None:
    """An unreadable empty file (mode 0, made in `directory`, unlinked once the last mask is bound) bound over `path`,
    with that tmpfs's nosuid, nodev and noexec."""
    mask = os.path.join(directory, _MASK)
    if view.mask != mask:
        _drop_mask(view)
        os.close(os.open(mask, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0))
        view.mask = mask
    mount(lib, mask, path, None, MS_BIND)
    view.unsealed.append(path)


def _drop_mask(view: View) -> None:
    if view.mask is not None:
        os.unlink(view.mask)
        view.mask = None


def _mount_point(lib, view: View, path: str) -> None:
    """A kept path's mount point made in its cover while the cover is still writable: not opened for it later."""
    mask = os.umask(0o022)
    try:
        _make_mount_point(path, _deepest(path, view.covers), True, view.dirs)
    finally:
        os.umask(mask)
    view.made.add(path)


def _read_only(lib, view: View) -> None:
    if view.mounts is None:
        failed = mount_setattr(lib, "/", MOUNT_ATTR_RDONLY, recursive=True)
        if failed:
            raise SetupError(f"read-only view: {os.strerror(failed)}")
    else:  # (the host's mounts were remounted read-only first, in `prepare_view`)
        for path in view.unsealed:
            _seal(lib, path, True)
    view.unsealed = []


def _private(lib, view: View, path: str, size_mb: int) -> None:
    view.sources[path] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    mount(lib, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={size_mb}m")
    view.covers.append(path)


def _seal_step(lib, view: View, path: str) -> None:
    _seal(lib, path, True)


def _bind_ahead(lib, view: View, path: str, real: str, writable: bool) -> None:
    bind_kept(lib, view, [[path, real, writable]], last=False)


_STEPS = {COVER: _cover, MASK: _mask, MOUNT_POINT: _mount_point, READ_ONLY: _read_only, PRIVATE: _private,
          SEAL: _seal_step, BIND: _bind_ahead}


def bind_kept(lib, view: View, kept, last: bool = True) -> None:
    """Bind the call's directories (and files) back at their paths: `kept` is [path, real path, writable]. Through a
    sealed cover, the cover is opened for the mount point and sealed again. `last`: nothing is bound after these (the
    view's descriptors are closed)."""
    opened = set()
    mask = os.umask(0o022)  # mount points traversable by the hook's identity (the service's umask is 077)
    try:
        for path, real, writable in kept:
            fd = _open_source(view, real)
            try:
                cover = _deepest(path, view.covers)
                if cover is not None and path not in view.made:
                    if cover in view.sealed and cover not in opened:
                        _seal(lib, cover, False)
                        opened.add(cover)
                    _make_mount_point(path, cover, stat.S_ISDIR(os.fstat(fd).st_mode), view.dirs)
                mount(lib, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            finally:
                os.close(fd)
            _bound_flags(lib, view, path, real, writable)
    finally:
        os.umask(mask)
        for cover in opened:
            _seal(lib, cover, True)
        if last:
            view.close()


def rehearse_binds(lib, view: View) -> None:
    """`bind_kept`'s steps once, to no effect, in a prepared hook's process ahead of its call (so that the pages they
    write are copied then, not on the call's path: engine/process/warmstart_zygote.py `_rehearse`): a source opened,
    a mount point made in the private /tmp and removed, a bind's flags set on a path that does not exist."""
    fd = _open_source(view, "/")
    try:
        stat.S_ISDIR(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    if PRIVATE_DIRS[0] in view.covers:
        scratch = os.path.join(PRIVATE_DIRS[0], ".librefang-rehearsal")
        mask = os.umask(0o022)
        try:
            _make_mount_point(os.path.join(scratch, "kept"), _deepest(scratch, view.covers), True, set())
        finally:
            os.umask(mask)
            for path in (os.path.join(scratch, "kept"), scratch):
                try:
                    os.rmdir(path)
                except OSError:
                    pass
    mount_setattr(lib, "/nonexistent/librefang-rehearsal", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, MOUNT_ATTR_RDONLY)


def _bound_flags(lib, view: View, path: str, real: str, writable: bool) -> None:
    """A kept path's bind: nosuid, nodev, read-only unless it is the writable one; its other flags as its source's."""
    if view.mounts is None:
        ro = MOUNT_ATTR_RDONLY
        failed = mount_setattr(lib, path, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (0 if writable else ro),
                               ro if writable else 0)
        if failed:
            raise SetupError(f"mount {path}: {os.strerror(failed)}")
        return
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | _locked_at(view.mounts, real)
    mount(lib, None, path, None, flags if writable else flags | MS_RDONLY)


def _open_source(view: View, real: str) -> int:
    """An O_PATH descriptor on `real` as it is under the covers (reached through the deepest covered ancestor)."""
    top = _deepest(real, view.sources)
    flags = os.O_PATH | os.O_CLOEXEC
    if top is None:
        return os.open(real, flags)
    rel = os.path.relpath(real, top)
    return os.open(rel, flags, dir_fd=view.sources[top]) if rel != "." else os.dup(view.sources[top])


def _deepest(path: str, tops) -> str | None:
    found = [t for t in tops if under(path, t)]
    return max(found, key=len) if found else None


def _make_mount_point(path: str, cover: str, directory: bool, made: set) -> None:
    """`path` made in the (empty, fresh) tmpfs of `cover`: its directories one by one from the cover down (but those
    in `made`, which it adds to), and an empty file for a file."""
    parts = os.path.relpath(path, cover).split(os.sep)
    current = cover
    for part in parts if directory else parts[:-1]:
        current = os.path.join(current, part)
        if current in made:
            continue
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            pass
        made.add(current)
    if not directory:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _seal(lib, path: str, read_only: bool) -> None:
    mount(lib, None, path, None, MS_BIND | MS_REMOUNT | _COVER | (MS_RDONLY if read_only else 0))


def _read_only_mounts(lib) -> list:
    """Every mount made read-only, one remount each (where mount_setattr(2) is missing; the flags a user namespace
    locks kept); returns [(mount point, locked flags)] of every mount."""
    found = []
    for mountpoint, options in _mounts():
        locked = sum(flag for name, flag in _LOCKED_OPTIONS.items() if name in options)
        found.append((mountpoint, locked))
        if "ro" in options:
            continue
        # Best effort per mount (one may be gone or refuse); "/" and /sys themselves must succeed.
        rc = lib.mount(None, os.fsencode(mountpoint), None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked, None)
        if rc != 0 and mountpoint in ("/", "/sys"):
            check(rc, f"read-only {mountpoint}")
    return found


def _locked_at(mounts: list, path: str) -> int:
    """The locked flags of the mount `path` is on (a bind of it must keep them)."""
    best, flags = "", 0
    for point, locked in mounts:
        if under(path, point) and len(point) >= len(best):
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
        point = unescape_mountinfo(fields[4]).decode("utf-8", "surrogateescape")
        out.append((point, set(fields[5].decode().split(","))))
    return out


