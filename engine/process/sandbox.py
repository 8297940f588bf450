"""What a hook gets, described once (`SandboxSpec`), and the one function that applies it in the child (`enter`).

Every spawn path applies the same description: the warm-start zygote calls `enter` in its forked child right before
running the script, the cold-hook spawner right before exec'ing the hook (engine/process/warmstart_zygote.py and
engine/process/hook_spawner.py receive the spec as JSON and load these files outside the engine package), and the
worker itself, as a preexec function, when neither is available (engine/process/runner.py). So this module and its
siblings below are stdlib only, import nothing from the engine but each other (relatively) and run on any
CPython >= 3.9.

Where the OS allows namespaces (root, or an unprivileged user namespace), `enter` gives every hook:
- its own PID namespace with a fresh /proc: it sees no service process. The child that called `enter` stays outside
  as a *keeper* the caller waits on; inside, a tiny init (pid 1) reaps orphans and the hook is pid 2 (init's child,
  or in a warm zygote with the native program the keeper's, beside init: engine/process/sandbox_tree.py). When the
  hook ends, the namespace ends with it and the kernel kills everything left in it: detached, double-forked or
  pipe-holding descendants cannot outlive the call. When the keeper is killed (timeout), init gets PDEATHSIG and the
  namespace dies the same way. The keeper mirrors the hook's exit status (signal included).
- a private mount namespace, every mount read-only: `$LIBREFANG_HOME` and what else the caller conceals (the code
  tree, /root, /home, /run, credential files; with `allow_filesystem = false` every non-system top-level directory)
  covered, the plugin's own directory (read-only) and its data directory (writable) bound back at the same paths,
  a private tmpfs on /tmp and /dev/shm (engine/process/sandbox_mounts.py).
- its own IPC and UTS namespaces; an empty network namespace when `allow_network = false`.
- a host identity of its own (`hook_uid`/`hook_gid`: a root service, or one that is not root but has subordinate
  ids, whose hooks' namespaces are made inside the user namespace it keeps with them mapped,
  engine/process/sandbox_userns.py), no capabilities, no_new_privs and the seccomp filter
  (engine/process/sandbox_seccomp.py), all before it runs anything.
- rlimits (RLIMIT_AS, RLIMIT_CPU, and RLIMIT_NPROC inside a user namespace, where it counts only the hook's own
  processes) and, where a writable cgroup is available, a per-call cgroup with memory and pids limits (the caller
  creates it with `Cgroups.create`; `enter` moves the hook in before anything else), or one the zygote's spare
  child joined ahead of its call (`Cgroups.prepare`, then `Cgroups.limit` when the call arrives).

A zygote's spare child may also apply it in two steps, `pre_enter` ahead of its call and the rest when the call
arrives (then the hook may enter its plugin's kept network namespace, `make_netns`, instead of a new one): same
namespaces, same view, same limits, less on the call's path. Either way the namespaces and the view come from one
plan (engine/process/sandbox_plan.py, `plan_view` for a spare), which the native spare carries out too.

Where namespaces are refused, `probe()` says why once per process (`degraded_reasons()`); hooks still run with
rlimits, PDEATHSIG and their own process group, and every affected call is labelled by the caller.

This module is the one its callers import: the probing is here, the rest is named here from its siblings
(sandbox_*.py; each in docs/architecture.md, "Module map").
"""

from __future__ import annotations

import os
import sys
import threading

from . import sandbox_seccomp, sandbox_userns
from .sandbox_cgroups import Cgroups, cgroups
from .sandbox_enter import SandboxSpec, enter
from .sandbox_libc import SetupError, has_mount_setattr, libc
from .sandbox_plan import kept_dirs
from .sandbox_spare import absent_at_call, enter_hook, make_netns, plan_view, pre_enter, rehearse, shape_of
from .sandbox_tree import HOOK_DONE, SETUP_FAILED, use_native_init

__all__ = [
    "HOOK_DONE", "SETUP_FAILED", "Cgroups", "SandboxSpec", "SetupError", "absent_at_call", "as_owner", "cgroups",
    "degraded_reasons", "enter", "enter_hook", "forget_probe", "has_mount_setattr", "kept_dirs", "kept_userns_fds",
    "libc", "make_netns", "mapped_ids", "mode", "network_isolation_available", "plan_view", "pre_enter", "probe",
    "rehearse", "seccomp_filter", "shape_of", "uid_drop", "use_native_init",
]


# ---- in the service: what this OS allows, probed once -----------------------------------------------------------

_probe_lock = threading.Lock()
# [(mode, reasons, ranges)]: mode "root", "subids" (not root, its hooks' ids mapped from its subordinate ranges),
# "userns" (not root, hooks as the service's own user) or None (degraded); ranges: the subordinate ids of "subids".
_probed: list = []


def probe() -> tuple:
    """("root" | "subids" | "userns" | None, reasons): how hooks are isolated here. Runs a real child once per
    process."""
    if not _probed:
        with _probe_lock:
            if not _probed:
                _probed.append(_probe())
    return _probed[0][:2]


def _probe() -> tuple:
    if not sys.platform.startswith("linux"):
        return None, [f"no namespaces on {sys.platform}: hooks can see the service's files and processes"], ()
    if os.environ.get("LIBREFANG_SANDBOX_NAMESPACES", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, ["namespaces disabled by LIBREFANG_SANDBOX_NAMESPACES=0: hooks can see the service's files "
                      "and processes, and processes they detach outlive them"], ()
    if libc() is None:
        return None, ["libc cannot be loaded: no namespaces"], ()
    uid, gid = os.getuid(), os.getgid()
    problems, missing = [], "the service is root but was refused namespaces outside a user namespace"
    if os.geteuid() == 0:
        error = _try(SandboxSpec(cwd="/", isolate=True, uid=uid, gid=gid))
        if error is None:
            return "root", [], ()
        problems.append(f"namespaces: {error}")
    else:
        ranges, missing = sandbox_userns.service_ranges(uid, gid)
        if ranges is not None:
            missing = _try_subids(ranges, uid, gid)
            if missing is None:
                return "subids", [], ranges
    error = _try(SandboxSpec(cwd="/", isolate=True, user_ns=True, uid=uid, gid=gid))
    if error is None:
        return "userns", [f"hooks have no host identity of their own: {missing}; they run as the service's own "
                          "user (mapped into a user namespace) and the files they write are the service user's "
                          "(docs/security.md, \"A service that is not root\")"], ()
    problems.append(f"user namespace: {error}")
    return None, ["this OS refuses namespaces to the service (" + "; ".join(problems) + "): hooks can see the "
                  "service's files and processes, and processes they detach outlive them"], ()


def _try_subids(ranges: tuple, uid: int, gid: int) -> str | None:
    """None if a hook runs here as the first identity of `ranges`, inside the kept user namespace; else why not."""
    try:
        sandbox_userns.kept(ranges, uid, gid)  # made here: the children below (and every later one) inherit it
    except (SetupError, OSError) as exc:
        return f"the service is not root and its hooks' user namespace could not be made ({exc})"
    error = _try(SandboxSpec(cwd="/", isolate=True, user_ns=True, mapped=ranges, uid=uid, gid=gid,
                             hook_uid=ranges[0][0], hook_gid=ranges[1][0]))
    return None if error is None else (f"the service is not root and a hook could not run as {ranges[0][0]} in its "
                                       f"user namespace ({error})")


def _try(spec: SandboxSpec) -> str | None:
    """Run `/bin/sh -c 'exit 7'` inside `spec`; None if it ran there, else why not."""
    import subprocess

    parent = os.getpid()

    def child() -> None:
        try:
            enter(spec, parent)
        except BaseException as exc:  # noqa: BLE001 - reported through the exit status and stderr
            os.write(2, str(exc).encode())
            os._exit(SETUP_FAILED)

    try:
        proc = subprocess.run(["/bin/sh", "-c", "exit 7"], preexec_fn=child, capture_output=True, timeout=10,
                              close_fds=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if proc.returncode == 7:
        return None
    return proc.stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"


def forget_probe() -> None:
    """Probe again on next use (tests that switch LIBREFANG_SANDBOX_NAMESPACES)."""
    with _probe_lock:
        _probed.clear()
        _net_state.clear()


def mode() -> str | None:
    return probe()[0]


def mapped_ids() -> tuple:
    """((uid start, count), (gid start, count)): the subordinate ids the hooks' identities come from, where the service
    is not root ("subids"); () elsewhere."""
    probe()
    return _probed[0][2]


def kept_userns_fds() -> tuple:
    """Descriptors of the user namespaces this process keeps (`mapped_ids`), which a child must keep until it joined."""
    return sandbox_userns.kept_fds()


def as_owner(fn, *args):
    """`fn(*args)` run as root of the kept user namespace (a service that is not root, "subids"), in a child: it may
    chown the service's files and its hooks' to their identities, and read or remove what they wrote. Returns what
    `fn` returned (JSON-serialisable); raises OSError."""
    return sandbox_userns.as_owner(mapped_ids(), os.getuid(), os.getgid(), fn, *args)


def degraded_reasons() -> list:
    """Why hooks run with less than the whole sandbox here ([] when they get all of it): no namespaces, no host
    identity of their own (the service is not root and has no subordinate ids: what is missing, and how to add it),
    no seccomp filter. For every trace, the doctor, /api/health and the dashboard banner."""
    found, reasons = probe()
    reasons = list(reasons)
    if found is not None and seccomp_filter() is None:
        reasons.append(f"no seccomp filter for hooks: {sandbox_seccomp.compiled()[1]}")
    from . import data_disks  # (in the service only: the helpers never report)

    return reasons + data_disks.degraded_reasons()


def uid_drop() -> bool:
    """Whether hooks drop to a host uid of their own here (the service is root, or has subordinate ids)."""
    return mode() in ("root", "subids")


def seccomp_filter() -> bytes | None:
    """The hooks' seccomp filter (BPF), or None where libseccomp is missing. Compiled once per process."""
    return sandbox_seccomp.compiled()[0]


def network_isolation_available() -> bool:
    """Whether hooks can get an empty network namespace (within their own namespaces, or alone)."""
    if mode() is not None:
        return True
    return _net_only()


_net_state: list = []


def _net_only() -> bool:
    if not _net_state:
        with _probe_lock:
            if not _net_state:
                _net_state.append(sys.platform.startswith("linux") and libc() is not None
                                  and _try(SandboxSpec(cwd="/", new_net=True)) is None)
    return _net_state[0]
