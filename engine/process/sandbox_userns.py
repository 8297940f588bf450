"""The user namespace a service that is not root keeps for its hooks (docs/security.md, "A service that is not root").

It is made once per process (the worker, each zygote, the spawner) by newuidmap and newgidmap (Debian `uidmap`,
setuid root), which map the service's own uid and gid to 0 and the service user's first subordinate range
(/etc/subuid, /etc/subgid) to itself. Each hook's other namespaces are then made inside it (setns, then unshare: no
setuid helper on a call's path), and the hook drops to its plugin's identity from that range as a root service's
hook drops to its uid (engine/process/identity.py). As root of this namespace, the service also holds CAP_CHOWN and
CAP_DAC_OVERRIDE over its own files and the range's: `as_owner` runs what hands a hook's directories to its identity.

Ranges are ((uid start, uid count), (gid start, gid count)), the slots of the plugins' identities. Stdlib only, like
engine/process/sandbox.py (the zygote and the spawner load it outside the engine package).
"""

from __future__ import annotations

import json
import os

from .sandbox_libc import CLONE_NEWUSER, SetupError, check, libc
from .sandbox_tree import fork_child, wait_for

# Where the setuid helpers are looked for (the system's own: never the service's PATH).
HELPER_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin")
SUBUID, SUBGID = "/etc/subuid", "/etc/subgid"


def helpers() -> tuple[str, str] | None:
    """(newuidmap, newgidmap), or None when either is not installed."""
    found = []
    for name in ("newuidmap", "newgidmap"):
        path = next((os.path.join(d, name) for d in HELPER_DIRS if os.access(os.path.join(d, name), os.X_OK)), None)
        if path is None:
            return None
        found.append(path)
    return found[0], found[1]


def service_ranges(uid: int, gid: int) -> tuple[tuple | None, str | None]:
    """(ranges, None) when hooks can have identities of their own here, else (None, what is missing and how to fix
    it). The service user's first range in /etc/subuid and in /etc/subgid (by name or by uid, as newuidmap reads
    them)."""
    if helpers() is None:
        return None, "the service is not root and newuidmap and newgidmap are not installed (apt-get install uidmap)"
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return None, f"the service is not root and its uid {uid} has no user name (/etc/passwd), which newuidmap needs"
    ranges, missing = [], []
    for path in (SUBUID, SUBGID):
        found = first_range(path, name, uid)
        if found is None:
            missing.append(path)
        ranges.append(found)
    if missing:
        return None, (f"the service is not root and its user {name} has no range in {' and '.join(missing)} "
                      f"(add `{name}:<start>:<count>` to /etc/subuid and /etc/subgid, a range no other user has, "
                      f"e.g. `usermod --add-subuids 1800000000-1800065535 --add-subgids 1800000000-1800065535 "
                      f"{name}` as root)")
    for (start, count), own, path in ((ranges[0], uid, SUBUID), (ranges[1], gid, SUBGID)):
        if start <= own < start + count or start == 0:
            return None, (f"the service is not root and the range of its user {name} in {path} ({start}:{count}) holds "
                          "root's or the service's own id")
    return (ranges[0], ranges[1]), None


def first_range(path: str, name: str, uid: int) -> tuple[int, int] | None:
    """The first `name:start:count` (or `uid:start:count`) line of `path`, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (name, str(uid)) and parts[1].isdigit() and parts[2].isdigit():
            if int(parts[2]) > 0:
                return int(parts[1]), int(parts[2])
    return None


_kept: dict = {}  # (ranges, uid, gid) -> descriptor of the kept user namespace (inherited by forks)


def kept(ranges, uid: int, gid: int) -> int:
    """A descriptor on this process's user namespace for `ranges` (the service's `uid`/`gid` as 0 in it), made on
    first use. Raises SetupError (with what newuidmap said)."""
    key = (tuple(tuple(r) for r in ranges), uid, gid)
    fd = _kept.get(key)
    if fd is None:
        fd = _kept[key] = _make(key[0], uid, gid)
    return fd


def kept_fds() -> tuple:
    """The descriptors `kept` holds in this process (kept open by a zygote's child until it has entered)."""
    return tuple(_kept.values())


def enter(lib, ranges, uid: int, gid: int) -> None:
    """In a single-threaded child: join the kept user namespace, as its root (every capability in it, none outside).
    The descriptor is closed: the hook must not hold it."""
    fd = kept(ranges, uid, gid)
    check(lib.setns(fd, CLONE_NEWUSER), "setns(CLONE_NEWUSER)")
    os.close(fd)


def as_owner(ranges, uid: int, gid: int, fn, *args):
    """`fn(*args)` run in a child that is root of the kept user namespace: it may chown and read or write any file of
    the service's user and of the range (but no other). Returns what it returned (JSON-serialisable); raises OSError
    with what went wrong there."""
    fd = kept(ranges, uid, gid)
    lib = libc()
    out_r, out_w = os.pipe()
    pid = fork_child()
    if pid == 0:
        code = 0
        try:
            os.close(out_r)
            check(lib.setns(fd, CLONE_NEWUSER), "setns(CLONE_NEWUSER)")
            said = b"R" + json.dumps(fn(*args)).encode()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            code, said = 1, f"E{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:4096]
        try:
            while said:
                said = said[os.write(out_w, said):]
        except OSError:
            code = 1
        os._exit(code)
    os.close(out_w)
    said, status = _outcome(out_r, pid)
    if status != 0 or not said.startswith(b"R"):
        raise OSError(said[1:].decode("utf-8", "replace") or f"exit status {status}")
    return json.loads(said[1:])


def _make(ranges: tuple, uid: int, gid: int) -> int:
    """A child unshares a user namespace, newuidmap and newgidmap map it from outside, we keep a descriptor on it,
    the child exits."""
    programs = helpers()
    if programs is None:
        raise SetupError("newuidmap and newgidmap are not installed (apt-get install uidmap)")
    lib = libc()
    if lib is None:
        raise SetupError("no libc")
    (uid_start, uid_count), (gid_start, gid_count) = ranges
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = fork_child()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(hold_w)
            os.write(ready_w, b"1" if lib.unshare(CLONE_NEWUSER) == 0 else b"0")
            os.read(hold_r, 1)  # until the parent holds the namespace (or died)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise SetupError("unshare(CLONE_NEWUSER) refused")
        _run([programs[0], str(pid), "0", str(uid), "1", str(uid_start), str(uid_start), str(uid_count)])
        _run([programs[1], str(pid), "0", str(gid), "1", str(gid_start), str(gid_start), str(gid_count)])
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(hold_w)
        wait_for(pid)


def _run(argv: list) -> None:
    """Run a setuid helper; SetupError with its message when it fails."""
    err_r, err_w = os.pipe()
    try:
        pid = os.posix_spawn(argv[0], argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, err_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2)])
    except OSError as exc:
        os.close(err_r)
        os.close(err_w)
        raise SetupError(f"{os.path.basename(argv[0])}: {exc}") from None
    os.close(err_w)
    said, status = _outcome(err_r, pid)
    if status != 0:
        text = said.decode("utf-8", "replace").strip() or f"exit status {os.waitstatus_to_exitcode(status)}"
        raise SetupError(f"{os.path.basename(argv[0])} {' '.join(argv[2:])}: {text}")


def _outcome(fd: int, pid: int) -> tuple[bytes, int]:
    """What child `pid` wrote on `fd` until it closed it (then closed here), and its wait status."""
    try:
        said = _read_all(fd)
    finally:
        os.close(fd)
    return said, wait_for(pid)


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
