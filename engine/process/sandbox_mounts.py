"""The hook's view of the filesystem, built in its private mount namespace in two parts: `prepare_view`, the same for
every call of one service (a spare child does it ahead of its call: engine/process/sandbox_spare.py `pre_enter`), then
`bind_kept`, the call's own directories (engine/process/sandbox_enter.py `enter` does both at once).

- every mount read-only: one recursive mount_setattr(2) where the kernel has it, else a remount of each mount
  (device files stay writable on a read-only mount: /dev/null, /dev/ptmx; /proc is the namespace's own);
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
import stat

from .sandbox_cgroups import unescape_mountinfo as _unescape
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
    _check,
    _mount,
    has_mount_setattr,
    mount_setattr,
)

_LOCKED_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                   "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PRIVATE_DIRS = ("/tmp", "/dev/shm")  # the hook's own tmpfs, writable
_COVER = MS_NOSUID | MS_NODEV | MS_NOEXEC
_MASK = ".librefang-mask"  # the unreadable file bound over concealed files, unlinked once bound


class View:
    """What `prepare_view` leaves for the call's part: descriptors of the covered directories as they are under their
    covers (a kept directory is bound from there), which covers are sealed (read-only), and the mounts' options."""

    def __init__(self, sources: dict, covers: list, mounts: list | None):
        self.sources = sources  # path -> O_PATH descriptor, opened before it was covered
        self.covers = covers  # covered directories (the private ones included)
        self.sealed = set(covers) - set(PRIVATE_DIRS)
        # [(mount point, locked flags)] as the namespace had them, for remounting a bind the old way; None where
        # mount_setattr(2) made the view read-only (and so sets a bind's flags: no flag to restate)
        self.mounts = mounts
        self.made = set()  # mount points made ahead, in a cover still writable then
        self.dirs = set()  # directories made in the covers so far (each made once)

    def close(self) -> None:
        for fd in self.sources.values():
            os.close(fd)
        self.sources = {}


def shape_covers(hide, covers, private: bool) -> tuple:
    """(directories, files) to cover, as they are now: existing ones (never a link), none below another (or below a
    private tmpfs), the home among them unless a wider cover hides it already."""
    kinds = {p: _kind(p) for p in (*covers, *((hide,) if hide else ()))}
    dirs = [p for p in (*covers, *((hide,) if hide else ())) if kinds[p] == stat.S_IFDIR]
    files = [p for p in covers if kinds[p] == stat.S_IFREG]
    outer = [*(PRIVATE_DIRS if private else ()), *dirs]
    dirs = [p for p in dict.fromkeys(dirs) if not any(o != p and _under(p, o) for o in outer)]
    files = [p for p in files if not any(_under(p, o) for o in outer)]
    return dirs, files


def prepare_view(lib, hide, covers, tmp_mb: int, ahead=(), covered=None) -> View:
    """The call-independent part of the view, in a fresh mount namespace (nothing reaches the service's). `ahead`:
    directories bound back now rather than by the call ([path, real path, False]: a warm zygote's interpreter),
    their mount points made before the covers are sealed. `covered`: what `shape_covers` said, if it was asked
    already."""
    _mount(lib, None, "/", None, MS_REC | MS_PRIVATE)
    dirs, files = covered if covered is not None else shape_covers(hide, covers, tmp_mb > 0)
    private = [p for p in PRIVATE_DIRS if tmp_mb > 0 and os.path.isdir(p)]
    sources = {p: os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in (*private, *dirs)}
    view = View(sources, [*private, *dirs], None)
    if has_mount_setattr(lib):
        # the covers and masks first, then one call makes everything read-only, them included (sealed)
        for path in dirs:
            _mount(lib, "tmpfs", path, "tmpfs", _COVER, "mode=0755,size=64k")
        if files and dirs:
            _mask_files(lib, files, dirs[0])
        _make_mount_points(view, [path for path, _real, _writable in ahead], dirs)
        failed = mount_setattr(lib, "/", MOUNT_ATTR_RDONLY, recursive=True)
        if failed:
            raise SetupError(f"read-only view: {os.strerror(failed)}")
    else:  # each mount remounted read-only (their flags noted first, for the binds), then each cover sealed
        view.mounts = _read_only_mounts(lib)
        for path in dirs:
            _mount(lib, "tmpfs", path, "tmpfs", _COVER, "mode=0755,size=64k")
        masked = _mask_files(lib, files, dirs[0]) if files and dirs else []
        for path in (*dirs, *masked):
            _seal(lib, path, True)
    for path in private:  # after: the hook's to write
        _mount(lib, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_mb}m")
    if files and not dirs:
        for path in _mask_files(lib, files, PRIVATE_DIRS[0]):
            _seal(lib, path, True)
    bind_kept(lib, view, ahead, last=False)
    return view


def _make_mount_points(view: View, paths, covers) -> None:
    """Mount points of directories in `covers` while they are still writable: no cover opened for them later."""
    mask = os.umask(0o022)
    try:
        for path in paths:
            cover = _deepest(path, covers)
            if cover is not None:
                _make_mount_point(path, cover, True, view.dirs)
                view.made.add(path)
    finally:
        os.umask(mask)


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
                _mount(lib, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
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
    _mount(lib, None, path, None, flags if writable else flags | MS_RDONLY)


def kept_dirs(spec, launcher: bool = True) -> list:
    """[path, real path, writable] of what the call binds back (with `launcher`, the launcher's installation too):
    resolved where everything is still visible (the service, or the helper that hands the call over). A linked
    directory is bound at its real path too (the hook's script is named by its real path)."""
    writable = set(spec.writable)
    out = []
    for path in spec.keep:
        real = _real_path(path)
        if real is not None:
            out.append([path, real, path in writable])
            if real != path:
                out.append([real, real, path in writable])
    if launcher:
        out += launcher_kept(spec.launcher)
    return out


def _real_path(path: str) -> str | None:
    """The real path of an existing `path` (None: there is none), asked of the kernel: open it O_PATH and read back
    the descriptor's name, three system calls where os.path.realpath lstat()s every component (as
    engine/filecache.py real_path does)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        name = ""
    finally:
        os.close(fd)
    if not name.startswith("/") or name.endswith(" (deleted)"):
        return os.path.realpath(path) if os.path.exists(path) else None
    return name


def launcher_kept(paths) -> list:
    """`kept_dirs` entries of the launcher's installation (real paths already: engine/process/hook_view.py)."""
    return [[path, path, False] for path in paths if os.path.isdir(path)]


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
    _mount(lib, None, path, None, MS_BIND | MS_REMOUNT | _COVER | (MS_RDONLY if read_only else 0))


def _mask_files(lib, files, directory: str) -> list:
    """An unreadable empty file (mode 0, made in `directory`: a fresh cover, or the private /tmp, and unlinked once
    bound) bound over each concealed file, with that tmpfs's nosuid, nodev and noexec; sealed by the caller. Returns
    the masked paths."""
    mask = os.path.join(directory, _MASK)
    fd = os.open(mask, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0)
    os.close(fd)
    try:
        for path in files:
            _mount(lib, mask, path, None, MS_BIND)
    finally:
        os.unlink(mask)
    return list(files)


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


def _kind(path: str) -> int | None:
    """The file type (stat.S_IFDIR, S_IFREG, ...) of `path` itself (a link is not followed), or None."""
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except OSError:
        return None


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
