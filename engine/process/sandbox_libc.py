"""The kernel calls the sandbox makes through libc (unshare, mount, mount_setattr, prctl, capset) and their constants.
Stdlib only, like every engine/process/sandbox*.py module (the zygote and the spawner load them outside the engine
package).
"""

from __future__ import annotations

import ctypes
import errno
import os

# linux/sched.h, linux/mount.h, linux/prctl.h, linux/capability.h
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
# linux/mount.h: mount_setattr(2) (Linux >= 5.12), the same number on every architecture the service runs on
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
_SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442, "i686": 442, "riscv64": 442}.get(os.uname().machine)


class SetupError(Exception):
    pass


_libc_handle: list = []


def kernel_real_path(path) -> str | None:
    """The real path of `path` as the kernel names it: open it O_PATH (no I/O, no side effect) and read back the
    descriptor's name, three system calls where os.path.realpath lstat()s every component. None when it cannot be
    opened or the kernel's name will not do (not absolute, or "(deleted)"): the caller decides what then."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    finally:
        os.close(fd)
    return name if name.startswith("/") and not name.endswith(" (deleted)") else None


def libc():
    if not _libc_handle:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
            lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        except (OSError, AttributeError):
            lib = None
        _libc_handle.append(lib)
    return _libc_handle[0]


def check(rc: int, what: str) -> None:
    """SetupError naming `what` and errno when a libc call returned non-zero: no sandbox step fails silently."""
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def mount_setattr(lib, path: str, attr_set: int, attr_clr: int = 0, recursive: bool = False) -> int:
    """Set and clear mount attributes (MOUNT_ATTR_*) of the mount at `path` (with `recursive`, of every mount below it
    too, all or none). Only the attributes named change: unlike a bind remount, no other flag needs restating (the
    flags a user namespace locks included). 0, or the errno (ENOSYS where the kernel or architecture has no such
    call: the caller then remounts the old way)."""
    if _SYS_MOUNT_SETATTR is None:
        return errno.ENOSYS
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    rc = lib.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), os.fsencode(path),
                     ctypes.c_uint(AT_RECURSIVE if recursive else 0), ctypes.byref(attr),
                     ctypes.c_size_t(ctypes.sizeof(attr)))
    return 0 if rc == 0 else ctypes.get_errno()


_setattr_works: list = []


def has_mount_setattr(lib) -> bool:
    """Whether this kernel has mount_setattr(2): a call that changes nothing, asked once per process (a helper asks
    before it forks, so that its children know)."""
    if not _setattr_works:
        _setattr_works.append(mount_setattr(lib, "/", 0) == 0)
    return _setattr_works[0]


def mount(lib, source, target, fstype, flags, data=None) -> None:
    """mount(2) with str arguments; SetupError when it fails."""
    def enc(value):
        return None if value is None else os.fsencode(value)

    check(lib.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")
