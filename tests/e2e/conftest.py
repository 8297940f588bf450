import os
from pathlib import Path

import pytest

from tests.e2e.live import running_service


@pytest.fixture(scope="session")
def live(tmp_path_factory):
    """One real service (daphne + 1 worker + Redis) shared by the e2e tests; each test uses its own plugins."""
    with running_service(tmp_path_factory.mktemp("live")) as service:
        yield service


@pytest.fixture
def live_home(live) -> Path:
    return live.home


@pytest.fixture
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=chromium_path, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        yield b
        b.close()


@pytest.fixture
def logged_in_page(browser, live):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(live.url + "/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", live.password)
    page.click("button[type=submit]")
    page.wait_for_url(live.url + "/")
    yield page
    context.close()


SCREENSHOTS = Path(__file__).resolve().parents[1] / "screenshots"


@pytest.fixture
def screenshot_dir() -> Path:
    SCREENSHOTS.mkdir(exist_ok=True)
    return SCREENSHOTS


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)
