"""A hook's own directories on the host, made ready by the service (outside the sandbox, as root) for the
unprivileged identity the hook runs as (engine/process/identity.py): its data directory owned by that identity
(mode 0700), its plugin directory readable by that identity's group (never writable: the sandbox binds it
read-only), and the files the service itself puts in the data directory for the hook (`write_private`).

A service that is not root cannot enter a directory of another uid: there the data directory stays the service's,
shared with the identity's group (`prepare_shared_data_dir`: set-group-id, mode 2770), so that the service keeps
reaching what it keeps there while the hook cannot shut it out; what the hook writes is its identity's. What needs
privilege (a chown to that group) runs as root of the service's user namespace (`as_owner`,
engine/process/sandbox_userns.py).

The data directory is the hook's to write: everything the service does there must survive a hook that replaced
any entry with a symlink (or a hard link) meanwhile. So nothing here follows a link inside it: directories are
walked by descriptor (os.fwalk), ownership changed without following links, files created with O_EXCL|O_NOFOLLOW
and renamed into place.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from engine.process import data_disks

Ids = tuple[int, int]


def prepare_data_dir(data_dir: Path, ids: Ids | None, private_tmp: bool = False, disk_mb: int | None = None) -> None:
    """Create the data directory (and its `tmp`, for allow_filesystem = false) and hand it to `ids` (None: the
    service's own user runs hooks; nothing to hand over). `disk_mb`: the directory is a filesystem of its own of
    that size (engine/process/data_disks.py; where that cannot be, it says so and the directory stays as it is).
    Raises OSError."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if disk_mb is not None:
        data_disks.ensure(data_dir, disk_mb)
    if private_tmp:
        try:
            os.mkdir(data_dir / "tmp", 0o700)
        except FileExistsError:
            pass
    if ids is None:
        return
    top = os.lstat(data_dir)
    if (top.st_uid, top.st_gid) != ids or stat.S_IMODE(top.st_mode) != 0o700:
        hand_over(data_dir, ids)
    elif private_tmp:
        os.chown(data_dir / "tmp", *ids, follow_symlinks=False)


def hand_over(directory: Path, ids: Ids) -> None:
    """Give `directory` and everything below it to `ids`, following no link; a file with more than one link (it
    may be a hard link to a file elsewhere) keeps its owner."""
    os.chown(directory, *ids, follow_symlinks=False)
    os.chmod(directory, 0o700)  # (its parent is the service's: a hook cannot have replaced it)
    for _root, dirs, files, fd in os.fwalk(directory, follow_symlinks=False):
        for name in dirs + files:
            try:
                st = os.lstat(name, dir_fd=fd)
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    continue
                os.chown(name, *ids, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue


SHARED_MODE = 0o2770  # a shared data directory: the service's, its hook's group's, set-group-id


def prepare_shared_data_dir(data_dir: Path, gid: int, as_owner, private_tmp: bool = False) -> None:
    """A service that is not root: create the data directory (and its `tmp`) and share it with the hook's group
    `gid`, unless it is already (one lstat). `as_owner(fn, *args)` runs `fn` with the privilege to chown to `gid`.
    Raises OSError."""
    data_dir.mkdir(parents=True, exist_ok=True)
    top = os.lstat(data_dir)
    if top.st_gid != gid or stat.S_IMODE(top.st_mode) != SHARED_MODE:
        if private_tmp:
            _mkdir_quietly(data_dir / "tmp")
        as_owner(share, data_dir, gid)
    elif private_tmp and _mkdir_quietly(data_dir / "tmp"):
        fd = os.open(data_dir / "tmp", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, SHARED_MODE)  # (its group is the directory's)
        finally:
            os.close(fd)


def _mkdir_quietly(path: Path) -> bool:
    try:
        os.mkdir(path, 0o700)
        return True
    except FileExistsError:
        return False


def share(directory: Path, gid: int) -> None:
    """Share `directory` with the group `gid`, its owners unchanged: it and the directories below set-group-id (what
    is made there is the group's) and group-writable, files group-readable and -writable (and -executable where
    their owner may run them), following no link; a file with more than one link is left alone. Needs the privilege
    to chown to `gid` (`as_owner`)."""
    os.chown(directory, -1, gid, follow_symlinks=False)
    os.chmod(directory, SHARED_MODE)  # (its parent is the service's: a hook cannot have replaced it)
    for _root, dirs, files, fd in os.fwalk(directory, follow_symlinks=False):
        for name in dirs + files:
            try:
                st = os.lstat(name, dir_fd=fd)
                if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
                    continue
                mode = stat.S_IMODE(st.st_mode)
                os.chown(name, -1, gid, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    _chmod_unlinked(name, fd, st, (mode | 0o2070) & ~0o4000)
                elif stat.S_ISREG(st.st_mode):
                    _chmod_unlinked(name, fd, st, (mode | 0o060 | (0o010 if mode & 0o100 else 0)) & ~0o6000)
            except FileNotFoundError:
                continue


def _chmod_unlinked(name: str, dir_fd: int | None, st: os.stat_result, mode: int) -> None:
    """chmod `name` in `dir_fd` if it is still what `st` saw, never through a link."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if stat.S_IFMT(os.fstat(fd).st_mode) == stat.S_IFMT(st.st_mode):
            os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def make_readable(plugin_dir: Path, script: Path | None, gid: int, as_owner=None) -> None:
    """Let the hook's group read (and traverse, and run what its owner may run) the plugin directory, unless it
    can already (group or others). Checked on the directory and the script (two stats per call); when either is not
    readable, the whole tree is fixed (through `as_owner(fn, *args)` where chown needs its privilege). Never adds
    write permission; removes the group's."""
    probe = [plugin_dir] + ([script] if script is not None else [])
    if all(_readable(os.stat(path), gid) for path in probe):
        return
    if as_owner is None:
        _share_with_group(plugin_dir, gid)
    else:
        as_owner(_share_with_group, plugin_dir, gid)


def _readable(st: os.stat_result, gid: int) -> bool:
    need = 0o5 if stat.S_ISDIR(st.st_mode) else 0o4
    return (st.st_mode & need) == need or (st.st_gid == gid and (st.st_mode >> 3) & need == need)


def _share_with_group(top: Path, gid: int) -> None:
    real = os.path.realpath(top)
    _group_read(real, None, gid)
    for _root, dirs, files, fd in os.fwalk(real, follow_symlinks=False):
        for name in dirs + files:
            _group_read(name, fd, gid)


def _group_read(name: str, dir_fd: int | None, gid: int) -> None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return  # links are followed to what they point at, which is checked on its own (or refused: path checks)
    mode = stat.S_IMODE(st.st_mode)
    new = (mode | 0o040 | (0o010 if stat.S_ISDIR(st.st_mode) or mode & 0o100 else 0)) & ~0o020
    if st.st_gid != gid:
        os.chown(name, -1, gid, dir_fd=dir_fd, follow_symlinks=False)
    if new != mode or st.st_gid != gid:  # (chown clears set-id bits: the mode is written again)
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            if stat.S_IFMT(os.fstat(fd).st_mode) == stat.S_IFMT(st.st_mode):  # still what was looked at, no link
                os.chmod(f"/proc/self/fd/{fd}", new & ~0o6000)
        finally:
            os.close(fd)


def write_private(data_dir: Path, rel: str, text: str, ids: Ids | None, replace: bool = True) -> Path:
    """Write `text` to `data_dir/rel` for the hook: created beside it with O_EXCL (never through a link), owned by
    `ids`, renamed into place (`replace=False`: only when nothing is there yet). The directories on the way are made
    without following links. Returns the path. Raises OSError."""
    parts = Path(rel).parts
    dir_fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            made = False
            try:
                os.mkdir(part, 0o700, dir_fd=dir_fd)
                made = True
                if ids is not None and os.geteuid() == 0:
                    os.chown(part, *ids, dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                pass
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = inner
            if made and ids is not None and os.geteuid() != 0:
                os.fchmod(dir_fd, SHARED_MODE)  # not root: a shared data directory's (its group inherited)
        name = parts[-1]
        if not replace:
            try:
                os.lstat(name, dir_fd=dir_fd)
                return data_dir / rel
            except FileNotFoundError:
                pass
        tmp = f".{name}.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w", closefd=False) as fh:
                fh.write(text)
            if ids is not None and os.geteuid() == 0:
                os.fchown(fd, *ids)
            elif ids is not None:  # not root: the shared data directory's group, inherited
                os.fchmod(fd, 0o660)
        finally:
            os.close(fd)
        if replace:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            try:
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                pass
            os.unlink(tmp, dir_fd=dir_fd)
        return data_dir / rel
    finally:
        os.close(dir_fd)


def read_private(data_dir: Path, rel: str, limit: int = 1 << 20) -> str | None:
    """The text of the regular file `data_dir/rel` as the service may read it in the hook's directory (no link
    followed at its name, nothing that blocks, at most `limit` bytes), or None."""
    try:
        fd = os.open(data_dir / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
        return data.decode("utf-8", "replace") if len(data) <= limit else None
    finally:
        os.close(fd)
