import shutil
from pathlib import Path

import pytest

from engine.home import Home


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
