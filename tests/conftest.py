import os
import shutil
import warnings
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


@pytest.fixture(scope="session", autouse=True)
def _no_data_disk_outlives_the_run(tmp_path_factory):
    """Whatever a module's or the session's service mounted (and anything a test left), released at the very end:
    no mount of ours stays on the machine after a run."""
    yield
    for root in (tmp_path_factory.getbasetemp(), os.environ.get("LIBREFANG_TEST_ROOT")):
        left = data_disks.release_all(Path(root)) if root else []
        if left:
            warnings.warn(f"data disks still mounted at the end of the run, released now: {left}", stacklevel=1)


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
