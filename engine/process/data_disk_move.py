"""What a data directory held, moved into the filesystem mounted on it (engine/process/data_disks.py): copied with
owners, modes and times, symbolic links as links, hard links among its files as links, fifos; then the originals
removed. The directory is a hook's: nothing is followed through a link, directories are walked by descriptor, and a
file that also has a link elsewhere is not copied (its copy, alone in the new filesystem, would be handed to the
plugin's identity, engine/process/hook_dirs.py `hand_over`). Sockets and device nodes stay where they are. Stdlib
only."""

from __future__ import annotations

import errno
import os
import stat


class Move:
    """What the directory held under the mount point (`under`, a descriptor opened before the mount), moved into
    the filesystem mounted on it (`target`): `copy`, then `remove_originals`. A fresh image takes everything or
    nothing (ENOSPC when it does not fit); a mounted image of before keeps its own entry where both have one, and
    the other stays under the mount point (`kept`)."""

    def __init__(self, under: int, target: str, fresh: bool):
        self.under, self.target, self.fresh = under, target, fresh
        self.links: dict[tuple[int, int], str] = {}  # a file with several links inside: where its first copy is
        self.inside: dict[tuple[int, int], int] = {}  # links found inside, of each file that has several
        self.skip: set[str] = set()  # relative paths not copied
        self.kept, self.kept_names = 0, []

    def copy(self) -> None:
        """Everything into the image (raises OSError; nothing is removed yet)."""
        if not os.listdir(self.under):
            return
        root = os.open(self.target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            blocks, entries = _usage(self.under, self.inside)
            if self.fresh:
                fs = os.fstatvfs(root)
                if blocks * 512 > fs.f_bavail * fs.f_frsize or entries > fs.f_favail:
                    raise OSError(errno.ENOSPC, f"the directory holds {blocks * 512 >> 20} MB in {entries} entries, "
                                  f"more than its image of {(fs.f_blocks * fs.f_frsize) >> 20} MB takes "
                                  "([limits] max_disk_mb)")
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


class _opened:
    """A directory entry opened as a directory, following no link."""

    def __init__(self, name: str, dir_fd: int):
        self.fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


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
