"""Loaded as a pytest plugin (-p) before Django reads its settings: every test run gets its own LIBREFANG_HOME,
its own Redis key prefix and its own database file, so runs never touch ~/.librefang or each other."""

import os
import tempfile
import uuid

from tests import mount_namespace

_root = tempfile.mkdtemp(prefix="librefang-tests-")
os.environ["LIBREFANG_HOME"] = os.path.join(_root, "home")
os.environ["LIBREFANG_REDIS_PREFIX"] = f"lftest-{uuid.uuid4().hex[:8]}"
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-" + uuid.uuid4().hex)
os.environ["LIBREFANG_TEST_ROOT"] = _root
os.makedirs(os.environ["LIBREFANG_HOME"], exist_ok=True)


# As root, the run's mounts (the plugins' data disks its tests make) stay in a namespace of its own; tests still
# release each disk with its home (tests/conftest.py).
mount_namespace.enter()


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
