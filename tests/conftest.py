import os
import shutil
from pathlib import Path

import pytest

from engine.home import Home
from engine.process import data_disks


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A test's homes go away with it: the plugins' data disks mounted under its tmp_path (by the engine in this
    process or by a service it started) are released once its fixtures are torn down (engine/process/data_disks.py)."""
    tmp_path = (getattr(item, "funcargs", None) or {}).get("tmp_path")
    yield
    if tmp_path is not None:
        data_disks.release_all(tmp_path)


_RUN_ROOTS: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _the_runs_temporary_directories(tmp_path_factory):
    _RUN_ROOTS.append(tmp_path_factory.getbasetemp())


def pytest_sessionfinish(session):
    """Whatever a service or a test left mounted, released once everything is torn down: no mount of ours stays on
    the machine after a run (tests/mount_namespace.py keeps them out of the host's view meanwhile)."""
    roots = [*_RUN_ROOTS, *([Path(os.environ["LIBREFANG_TEST_ROOT"])] if os.environ.get("LIBREFANG_TEST_ROOT") else [])]
    left = [point for root in roots for point in data_disks.release_all(root)]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if left and reporter is not None:
        reporter.write_line(f"data disks still mounted at the end of the run, released now: {left}", yellow=True)


@pytest.fixture
def home(tmp_path, settings):
    """A fresh LIBREFANG_HOME for in-process (Django) tests; the process-wide engine is rebuilt around it."""
    from plugins_app.services.engine import reset_engine

    root = tmp_path / "home"
    (root / "plugins").mkdir(parents=True)
    settings.LIBREFANG_HOME = root
    reset_engine()
    yield Home(root)
    reset_engine()


@pytest.fixture
def chromium_path():
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if not path:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); .ci/run installs it")
    return path
