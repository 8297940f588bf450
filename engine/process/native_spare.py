"""The cold-hook spawner's prepared spare as a small static program (engine/process/native/spare.c, built by
`make setup` into engine/process/native/librefang-spare) instead of a fork of the python spawner: started with
posix_spawn (no page tables copied), it enters the call's namespaces ahead of the call as
engine/process/sandbox_spare.py `pre_enter` does, and its keeper, init and the hook before its exec are C processes of
a few pages instead of three forks of a python interpreter (each would copy the spawner's page tables).

Used by engine/process/zygote_serve.py in exec mode only (a warm hook runs python in its process, so it stays a fork
of the zygote), for spares whose sandbox shape is known. Without the program (no C compiler at setup, a stale build,
or LIBREFANG_NATIVE_SPARE=0 in the worker's environment) the python spare does the same work. Stdlib only, like
engine/process/sandbox.py.
"""

from __future__ import annotations

import os
import resource

from . import sandbox_userns
from .sandbox_plan import COVER, MASK, NAMESPACES, PRIVATE, READ_ONLY, SEAL

WIRE = "lfspare/4"  # the program refuses another (a build from other sources): the python spare is used then
READY = b"R"  # what the program says once the sandbox is prepared, before it waits for its call
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "native", "spare.c")
PROGRAM = os.path.join(_HERE, "native", "librefang-spare")
SWITCH = "LIBREFANG_NATIVE_SPARE"  # "0" turns it off; the spawner gets it from the worker's environment


def program(environ=None) -> str | None:
    """The program's path when it can be used: built, executable, and not older than its source. SWITCH set to a
    path names another build of it (tests use one that fails)."""
    switch = (os.environ if environ is None else environ).get(SWITCH, "1").strip()
    if switch.lower() in ("0", "false", "no", "off"):
        return None
    if switch not in ("1", "true", "yes", "on", ""):
        return switch if os.access(switch, os.X_OK) else None
    try:
        built = os.stat(PROGRAM)
        if not os.access(PROGRAM, os.X_OK) or built.st_mtime < os.stat(SOURCE).st_mtime:
            return None
    except OSError:
        return None
    return PROGRAM


def spawn(path: str, sock, shape: tuple, plan: tuple, absent: str | None, cgroups: tuple,
          seccomp: bytes | None) -> int:
    """Start a spare for `shape` (engine/process/sandbox_spare.py `shape_of`) on `sock` (its end of the socket pair),
    in a session of its own, joining `cgroups` first: it makes the view `plan` says (sandbox_spare.py `plan_view`),
    refuses its call if `absent` exists by then, and its hooks load `seccomp` (sandbox_seccomp.py). Returns its pid;
    raises OSError (a plan it cannot carry out included)."""
    user_ns, uid, gid, mapped = shape.user_ns, shape.uid, shape.gid, shape.mapped
    steps = encode_plan(plan)
    fd = sock.fileno()
    # a service that is not root: its kept user namespace (engine/process/sandbox_userns.py), which the program joins
    userns = sandbox_userns.kept(mapped, uid, gid) if user_ns and mapped else None
    inherited = (fd,) if userns is None else (fd, userns)
    for each in inherited:
        os.set_inheritable(each, True)
    try:
        argv = [path, WIRE, str(os.getpid()), str(fd), f"@{userns}" if userns is not None else "1" if user_ns else "0",
                str(uid), str(gid), str(NAMESPACES), absent or "", (seccomp or b"").hex(), str(len(steps)), *steps,
                *cgroups]
        return os.posix_spawn(path, argv, {}, setsid=True)
    finally:
        for each in inherited:
            os.set_inheritable(each, False)


_TAGS = {COVER: "C", MASK: "M", READ_ONLY: "R", PRIVATE: "T", SEAL: "S"}  # the steps the program carries out


def encode_plan(plan: tuple) -> list:
    """The view's steps (engine/process/sandbox_plan.py) as the program's argv items: a tag, then its fields. OSError
    for a step it does not carry out (a launcher bound ahead is a warm zygote's, never the spawner's)."""
    items = []
    for kind, *fields in plan:
        if kind not in _TAGS:
            raise OSError(f"the native spare does not carry out {kind} steps")
        items += [_TAGS[kind], *map(str, fields)]
    return items


def wait_ready(sock, timeout: float) -> bool:
    """Whether the spare on `sock` has prepared the sandbox (its READY byte), waiting up to `timeout` seconds: a
    spare made for a call that is already here can still fail, and the call must then go to a python child rather
    than to a spare that exits without running it."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == READY
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def encode_call(call: dict, netns_index: int | None) -> bytes:
    """The call as the program reads it: NUL-terminated strings, each tag followed by its fields. OSError for a
    string with a NUL byte (it would shift the fields: the call then goes to a python child, which refuses it)."""
    box = call["sandbox"]
    items = []
    for path, real, writable in call.get("kept", []):
        items += ["K", path, real, "1" if writable else "0"]
    if box.get("new_net"):
        items += ["N", str(-1 if netns_index is None else netns_index)]
    if box.get("hook_uid", -1) >= 0:
        items += ["U", str(box["hook_uid"]), str(box["hook_gid"])]
    if box.get("seccomp"):
        items.append("S")
    for name, soft, hard in box.get("rlimits", ()):
        items += ["L", str(getattr(resource, name)), str(soft), str(hard)]
    items += ["C", box["cwd"]]
    items += [x for arg in call["argv"] for x in ("A", arg)]
    items += [x for key, value in box.get("env", {}).items() for x in ("E", f"{key}={value}")]
    raw = [os.fsencode(item) for item in items]
    if any(b"\0" in item for item in raw):
        raise OSError("a NUL byte in the call")
    return b"".join(item + b"\0" for item in raw)
