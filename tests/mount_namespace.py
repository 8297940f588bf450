"""A test run or a bench in a mount namespace of its own (as root), shared by every process it starts (services,
workers, their hooks): the plugins' data disks it mounts (engine/process/data_disks.py) are never seen by the
host's other processes, so none of them can hold one afterwards, and whatever a run killed midway left mounted
goes away with its last process. Call `enter` first thing, before any thread is started."""

from __future__ import annotations

import ctypes
import os
import sys

_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_SLAVE = 1 << 14, 1 << 19
MARK = "LIBREFANG_OWN_MOUNT_NS"  # set once entered: the processes it starts are in it already


def enter() -> bool:
    """Whether this process is now in a mount namespace of the run's own (False: not root, or refused)."""
    if os.environ.get(MARK):
        return True
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        return False
    libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None)  # nothing mounted here reaches the host
    os.environ[MARK] = os.readlink("/proc/self/ns/mnt")
    return True
