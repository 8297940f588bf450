"""Whether a process id still names a running process. Stdlib only: the web tier asks (the supervisor panel), and
so does engine/process/sandbox_cgroups.py, also in the zygote and the spawner, which load engine/process/ outside the
engine package."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while `pid` runs. A zombie (exited, not yet reaped by its parent) counts as dead; a process of another
    user (kill answers EPERM) as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) is all we have
