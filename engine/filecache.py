"""Files and paths: a file parsed once per change (one stat per read; a file that stops parsing keeps the last good
value), and confinement of relative paths to a directory."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from engine.process.sandbox_libc import kernel_real_path

T = TypeVar("T")


def file_stamp(path: Path) -> tuple:
    """Changes whenever the file changes on disk; () when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class FileCache(Generic[T]):
    def __init__(self, path: Path, parse: Callable[[str], T], default: T, label: str = "configuration"):
        self.path = path
        self.error: str | None = None
        self._parse = parse
        self._default = default
        self._label = label
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._value = default

    def get(self) -> T:
        stamp = file_stamp(self.path)
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                if not stamp:
                    self._value, self.error = self._default, None
                else:
                    try:
                        self._value = self._parse(self.path.read_text(encoding="utf-8"))
                        self.error = None
                    except (OSError, UnicodeDecodeError, ValueError) as exc:
                        self.error = f"{self.path} is invalid, keeping the previous {self._label}: {exc}"
            return self._value


def real_path(path: str | os.PathLike) -> str:
    """os.path.realpath(path), asked of the kernel when the path exists (engine/process/sandbox_libc.py
    kernel_real_path: three syscalls where realpath lstat()s and joins every component in Python; a hook call checks
    about nine paths this way). Anything else (a missing path, a name the kernel gives as "(deleted)" or not as an
    absolute path) goes to realpath itself."""
    return kernel_real_path(path) or os.path.realpath(path)


def confine(root: Path, rel: str, what: str = "path", where: str = "the directory") -> Path:
    """The real path of `rel` under `root`, refusing absolute paths, `..` components and symlinks that leave root.

    Raises ValueError. Checked on every use, not only at load time.
    """
    if not rel or "\x00" in rel:
        raise ValueError(f"{what} is empty")
    candidate = Path(rel)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise ValueError(f"{what} {rel!r} must be relative and must not contain '..'")
    real_root = Path(real_path(root))
    target = Path(real_path(real_root / candidate))
    if not target.is_relative_to(real_root):
        raise ValueError(f"{what} {rel!r} resolves outside {where}")
    return target


def tree_size(path: str | os.PathLike) -> int:
    """Bytes in the files below `path` (symlinks counted as links, unreadable files skipped)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total
