"""The sandbox's policy turned into a plan for this host as it is now: the namespaces every hook gets, and the steps of
its view of the filesystem (what is covered, masked, made private, bound back), in order. Computed here once and
carried out as given by every executor: engine/process/sandbox_mounts.py `prepare_view` (for `enter` and a python
spare's `pre_enter`) and engine/process/native/spare.c, which receives the steps in its argv
(engine/process/native_spare.py): a policy change is made here, never in an executor.

What is concealed and bound back for a call is decided before, in the service (engine/process/hook_view.py, the
SandboxSpec of engine/process/runner.py `sandbox_spec`, docs/security.md); this module resolves it against the
filesystem (what exists, what is a directory or a file, what lies below what). How a step is done (one
mount_setattr(2) or a remount of each mount, descriptors on what a cover hides) is the executor's. Stdlib only,
like engine/process/sandbox.py.
"""

from __future__ import annotations

import os
import stat

from .sandbox_libc import CLONE_NEWIPC, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUTS, kernel_real_path

# Every isolated hook's own namespaces (and its network's when it has no network): PID (nothing outlives it), mount
# (its view), IPC (no SysV IPC shared with anyone, none left after it) and UTS.
NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
PRIVATE_DIRS = ("/tmp", "/dev/shm")  # the hook's own tmpfs, writable, gone with the call

# The steps of a view, each a tuple whose first item is its kind:
COVER = "cover"  # (COVER, directory): an empty read-only tmpfs over it
MASK = "mask"  # (MASK, file, directory): an unreadable empty file, made in `directory` (a tmpfs of the view still
#                writable), bound over `file`
MOUNT_POINT = "mount_point"  # (MOUNT_POINT, path): made in its cover while the cover is still writable
READ_ONLY = "read_only"  # every mount read-only, the covers and masks made so far included (sealed)
PRIVATE = "private"  # (PRIVATE, directory, size in MB): a private tmpfs the hook may write
SEAL = "seal"  # (SEAL, path): a mask made after READ_ONLY, made read-only
BIND = "bind"  # (BIND, path, real path, writable): `real` as it is under the covers, bound at `path`


def view_plan(hide: str | None, conceal, tmp_mb: int, launcher=()) -> tuple:
    """The steps of a hook's view: `hide` ($LIBREFANG_HOME, when it exists) and what `conceal` names covered, /tmp
    and /dev/shm private tmpfs of `tmp_mb` each (none at 0), the launcher's installation bound back (`launcher`:
    real paths, a warm zygote's interpreter, the same for all its calls). The call's own directories are bound after
    these (`kept_dirs`)."""
    dirs, files = covers_of(hide, conceal, tmp_mb > 0)
    ahead = launcher_kept(launcher)
    steps = [(COVER, path) for path in dirs]
    if dirs:
        steps += [(MASK, path, dirs[0]) for path in files]
    steps += [(MOUNT_POINT, path) for path, _real, _writable in ahead if _deepest(path, dirs) is not None]
    steps.append((READ_ONLY,))
    steps += [(PRIVATE, path, tmp_mb) for path in PRIVATE_DIRS if tmp_mb > 0 and os.path.isdir(path)]
    if files and not dirs:  # nothing covered to make the mask in: the private /tmp
        steps += [(MASK, path, PRIVATE_DIRS[0]) for path in files] + [(SEAL, path) for path in files]
    steps += [(BIND, *entry) for entry in ahead]
    return tuple(steps)


def covers_of(hide: str | None, covers, private: bool) -> tuple:
    """(directories, files) to cover, as they are now: existing ones (never a link), none below another (or below a
    private tmpfs), the home among them unless a wider cover hides it already."""
    named = (*covers, hide) if hide else tuple(covers)
    kinds = {p: _kind(p) for p in named}
    dirs = list(dict.fromkeys(p for p in named if kinds[p] == stat.S_IFDIR))
    files = [p for p in covers if kinds[p] == stat.S_IFREG]
    outer = (*(PRIVATE_DIRS if private else ()), *dirs)
    prefixes = tuple(o.rstrip("/") + "/" for o in outer)
    dirs = [p for p in dirs if not _below_another(p, outer, prefixes)]
    files = [p for p in files if not p.startswith(prefixes)]
    return dirs, files


def _below_another(path: str, outer: tuple, prefixes: tuple) -> bool:
    """Whether `path` lies below one of `outer` (each with its prefix, its path and "/") other than itself."""
    if not path.endswith("/"):  # (no path starts with its own prefix)
        return path.startswith(prefixes)
    return any(o != path and path.startswith(prefix) for o, prefix in zip(outer, prefixes))  # noqa: B905


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


def launcher_kept(paths) -> list:
    """`kept_dirs` entries of the launcher's installation (real paths already: engine/process/hook_view.py)."""
    return [[path, path, False] for path in paths if os.path.isdir(path)]


def _real_path(path: str) -> str | None:
    """The real path of an existing `path` (None: there is none), asked of the kernel (sandbox_libc.py)."""
    return kernel_real_path(path) or (os.path.realpath(path) if os.path.exists(path) else None)


def _kind(path: str) -> int | None:
    """The file type (stat.S_IFDIR, S_IFREG, ...) of `path` itself (a link is not followed), or None."""
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except OSError:
        return None


def _deepest(path: str, tops) -> str | None:
    found = [t for t in tops if under(path, t)]
    return max(found, key=len) if found else None


def under(path: str, top: str) -> bool:
    """Whether `path` is `top` or lies below it."""
    return path == top or path.startswith(top.rstrip("/") + "/")
