"""Loaded as a pytest plugin (-p) before Django reads its settings: every test run gets its own LIBREFANG_HOME,
its own Redis key prefix and its own database file, so runs never touch ~/.librefang or each other."""

import ctypes
import os
import sys
import tempfile
import uuid

_root = tempfile.mkdtemp(prefix="librefang-tests-")
os.environ["LIBREFANG_HOME"] = os.path.join(_root, "home")
os.environ["LIBREFANG_REDIS_PREFIX"] = f"lftest-{uuid.uuid4().hex[:8]}"
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-" + uuid.uuid4().hex)
os.environ["LIBREFANG_TEST_ROOT"] = _root
os.makedirs(os.environ["LIBREFANG_HOME"], exist_ok=True)


def _own_mount_namespace() -> None:
    """As root, the run gets a mount namespace of its own, shared by every process it starts (services, workers,
    their hooks): the plugins' data disks its tests mount (engine/process/data_disks.py) are never seen by the host's
    other processes, so none of them can hold one after the run, and whatever a crashed run left mounted goes away
    with its last process. Tests still release each disk with its home (tests/conftest.py)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux") or os.environ.get("LIBREFANG_TEST_MOUNT_NS"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS (pytest has no other thread yet)
        return
    # MS_REC | MS_SLAVE: nothing mounted here reaches the host
    libc.mount(None, b"/", None, 16384 | (1 << 19), None)
    os.environ["LIBREFANG_TEST_MOUNT_NS"] = os.readlink("/proc/self/ns/mnt")


_own_mount_namespace()


# Containment tests skip where the OS refuses namespaces; a green run that did not test containment must not look
# like one that did, so such skips are repeated in a banner at the end of the run.
_CONTAINMENT_WORDS = ("refuses", "namespace", "cgroup", "needs root")


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = []
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if any(word in reason for word in _CONTAINMENT_WORDS):
            reasons.append(f"{report.nodeid}: {reason.removeprefix('Skipped: ')}")
    if reasons:
        terminalreporter.section("CONTAINMENT NOT FULLY TESTED HERE", sep="!", red=True, bold=True)
        for line in sorted(set(reasons)):
            terminalreporter.line(line, red=True)
