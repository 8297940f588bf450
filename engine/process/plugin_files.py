"""What the service does with the files a plugin's hooks (or its install-deps build) wrote: they are the plugin's
identity's (engine/process/identity.py). A root service reaches them anyway. A service that is not root, whose hooks
have identities of their own from its subordinate ids, may not enter a directory a hook kept to itself: it does
this as root of its user namespace instead (`privileged`: a child, engine/process/sandbox_userns.py). Nothing here
follows a link the hooks may have put in place.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from engine.process import sandbox


def privileged() -> Callable | None:
    """What runs `fn(*args)` with the privilege over the plugins' identities where the service is not root (their
    files are not its own), returning what `fn` returned; None where the service needs nothing more (root, or hooks
    that run as the service's own user)."""
    return sandbox.as_owner if sandbox.mode() == "subids" else None


def _run(fn, *args):
    runner = privileged()
    return fn(*args) if runner is None else runner(fn, *args)


def discard(path: Path) -> None:
    """Remove `path` whatever it is, a link removed, never followed, with all a plugin's identity wrote below it.
    Raises OSError."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink(missing_ok=True)
    elif path.is_dir():
        _run(_remove_tree, str(path))


def _remove_tree(path: str) -> None:
    try:
        shutil.rmtree(path)  # (refuses a link: OSError)
    except FileNotFoundError:
        pass


def wipe(root: Path, keep: frozenset) -> dict:
    """Remove everything in `root` but the names in `keep`: {"files_removed", "bytes_freed"} (regular files and
    links counted). Raises OSError for what could not be removed."""
    if not root.is_dir() or root.is_symlink():
        return {"files_removed": 0, "bytes_freed": 0}
    return _run(_wipe, str(root), sorted(keep))


def _wipe(root: str, keep: list) -> dict:
    removed, freed, failed = 0, 0, []
    with os.scandir(root) as entries:
        children = [e for e in entries if e.name not in keep]
    for child in children:
        if child.is_dir(follow_symlinks=False):
            for _dir, _dirs, files, fd in os.fwalk(child.path, follow_symlinks=False):
                for name in files:
                    try:
                        freed += os.lstat(name, dir_fd=fd).st_size
                        removed += 1
                    except OSError:
                        pass
            shutil.rmtree(child.path, onerror=lambda _f, p, exc: failed.append(f"{p}: {exc[1]}"))
        else:
            try:
                size = child.stat(follow_symlinks=False).st_size
                os.unlink(child.path)
                removed, freed = removed + 1, freed + size
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(f"{child.path}: {exc}")
    if failed:
        raise OSError(f"could not remove {len(failed)} entries, e.g. {failed[0]}")
    return {"files_removed": removed, "bytes_freed": freed}


def listing(root: Path, skip: frozenset, max_files: int) -> dict:
    """What is in `root` (the names in `skip` left out at its top, links not followed): {"files": the first
    `max_files` by path with size and mtime, "file_count", "size_bytes", "agents_with_state"}."""
    if not root.is_dir() or root.is_symlink():
        return {"files": [], "file_count": 0, "size_bytes": 0, "agents_with_state": []}
    return _run(_listing, str(root), sorted(skip), max_files)


def _listing(root: str, skip: list, max_files: int) -> dict:
    files, total, count = [], 0, 0
    for dirpath, dirnames, filenames in os.walk(root):
        top = dirpath == root
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                             and not (top and d in skip))
        for f in sorted(filenames):
            if top and f in skip:
                continue
            full = os.path.join(dirpath, f)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            count += 1
            total += st.st_size
            if len(files) < max_files:
                files.append({"path": os.path.relpath(full, root), "size_bytes": st.st_size,
                              "modified": dt.datetime.fromtimestamp(st.st_mtime, dt.UTC).isoformat()})
    agents_dir = os.path.join(root, "agents")
    agents = []
    if os.path.isdir(agents_dir) and not os.path.islink(agents_dir):
        agents = sorted(name for name in os.listdir(agents_dir)
                        if stat.S_ISREG(_mode(os.path.join(agents_dir, name, "state.json"))))
    return {"files": files, "file_count": count, "size_bytes": total, "agents_with_state": agents}


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0
