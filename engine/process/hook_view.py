"""What a hook's filesystem view conceals and binds back, decided in the service (engine/process/runner.py
`sandbox_spec` puts it in the call's SandboxSpec; engine/process/sandbox_mounts.py and native/spare.c apply it). The
policy in words, with what allow_filesystem = true adds, is the table in docs/security.md:

- always concealed: the service's own code tree (this checkout) and the directories and files below that hold
  other people's or the host's secrets; `$LIBREFANG_HOME` is concealed too (SandboxSpec.hide), but the plugin's own
  directories;
- concealed as well with allow_filesystem = false: every top-level directory but the system's (`SYSTEM_DIRS`);
- bound back read-only through those covers: the hook's launcher installation (a python under /root/.pyenv, say)
  and, for a hook with network, the file /etc/resolv.conf points to.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from engine.filecache import real_path

CODE_TREE = str(Path(__file__).resolve().parents[2])  # the service's checkout (engine/process/ is two levels down)
CONCEALED_DIRS = ("/root", "/home", "/run", "/var/run", "/etc/ssh", "/etc/sudoers.d", "/var/spool/cron",
                  "/var/lib/sss", "/etc/ssl/private")
CONCEALED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
                   "/etc/security/opasswd", "/etc/krb5.keytab")
# What a hook with allow_filesystem = false still sees of /: the system (programs, libraries, /etc), its devices,
# /proc and /sys (read-only) and its private /tmp. allow_filesystem = true adds the rest (/var, /opt, /srv, /mnt,
# ...), read-only; never anything to write.
SYSTEM_DIRS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "sys", "tmp"})


@functools.lru_cache(maxsize=1)
def concealed() -> tuple[str, ...]:
    """Real paths concealed from every hook on this host (those that exist), the code tree first."""
    paths = (CODE_TREE, *CONCEALED_DIRS, *CONCEALED_FILES)
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.lexists(p)))


@functools.lru_cache(maxsize=1)
def narrowed() -> tuple[str, ...]:
    """The top-level directories concealed as well from a hook with allow_filesystem = false."""
    try:
        entries = sorted(os.listdir("/"))
    except OSError:
        return ()
    hidden = set(concealed())
    return tuple(path for path in (f"/{name}" for name in entries if name not in SYSTEM_DIRS)
                 if path not in hidden and os.path.isdir(path) and not os.path.islink(path))


def covers(allow_filesystem: bool) -> tuple[str, ...]:
    return concealed() if allow_filesystem else concealed() + narrowed()


def bound_back(argv0: str | None, covered: tuple[str, ...], network: bool) -> list[str]:
    """Paths under the covers a hook needs read-only: its launcher's installation, and resolv.conf's target."""
    return launcher_dirs(argv0, covered) + resolver_files(covered, network)


def launcher_dirs(argv0: str | None, covered: tuple[str, ...]) -> list[str]:
    """The launcher's installation (its prefix, or its bin directory) when a cover hides it: real paths."""
    if not argv0:
        return []
    real = real_path(argv0)
    if not _covered(real, covered):
        return []
    bindir = os.path.dirname(real)
    prefix = os.path.dirname(bindir) if os.path.basename(bindir) == "bin" else bindir
    for candidate in (prefix, bindir):
        if not any(_under(c, candidate) for c in covered):  # never a cover itself, nor above one
            return [candidate]
    return []


def resolver_files(covered: tuple[str, ...], network: bool) -> list[str]:
    """For a hook with network: the file /etc/resolv.conf points to, when a cover hides it."""
    if not network:
        return []
    resolv = os.path.realpath("/etc/resolv.conf")
    return [resolv] if _covered(resolv, covered) and os.path.isfile(resolv) else []


def _covered(path: str, covered: tuple[str, ...]) -> bool:
    return any(_under(path, c) for c in covered)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
