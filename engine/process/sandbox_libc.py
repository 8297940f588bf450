"""The kernel calls the sandbox makes through libc (unshare, mount, prctl, capset) and their constants. Stdlib only,
like every engine/process/sandbox*.py module (the zygote and the spawner load them outside the engine package).
"""

from __future__ import annotations

import ctypes
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


class SetupError(Exception):
    pass


_libc_handle: list = []


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


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(lib, source, target, fstype, flags, data=None) -> None:
    def enc(value):
        return None if value is None else os.fsencode(value)

    _check(lib.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")
