"""The plugin page's benchmark and state controls (plugins_app/views/parity.py) in a real browser against a real
daphne + worker + Redis: the benchmark runs on the worker, the wipe goes through the confirm dialog."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from engine.home import Home
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin

pytestmark = pytest.mark.browser
WAIT_MS = 60_000  # generous: the machine is shared and may be under load


def test_it_benchmarks_on_a_worker_and_wipes_state_through_the_confirm(logged_in_page, live, screenshot_dir):
    page = logged_in_page
    make_plugin(live.home / "plugins", "bench-ui", {"ingest": PY_ECHO_INGEST})
    data = Home(live.home).data_dir("bench-ui")
    (data / "agents" / "a1").mkdir(parents=True)
    (data / "agents" / "a1" / "state.json").write_text('{"turns": 3}')
    page.goto(live.url + "/plugins/bench-ui/")

    page.fill("#parity-runs", "3")
    page.click("#parity-benchmark-run")
    p50 = page.locator('#parity-benchmark-table tr[data-hook="ingest"] td[data-q="p50"]')
    expect(p50).to_contain_text("ms", timeout=WAIT_MS)
    assert float(p50.inner_text().split()[0]) > 0
    expect(page.locator('#parity-benchmark-table tr[data-hook="ingest"] td[data-label="OK"]')).to_have_text("3")

    expect(page.locator("#parity-state-count")).to_have_text("1", timeout=WAIT_MS)
    dialogs = []

    def accept(dialog):
        dialogs.append(dialog.message)
        dialog.accept()
    page.on("dialog", accept)
    page.screenshot(path=str(screenshot_dir / "parity_plugin_1280.png"), full_page=True)
    page.locator("#parity-ops").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "parity_plugin_1280_controls.png"))
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(screenshot_dir / "parity_plugin_390.png"), full_page=True)
    page.locator("#parity-ops").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "parity_plugin_390_controls.png"))
    page.set_viewport_size({"width": 1280, "height": 900})
    page.click("#parity-wipe")
    expect(page.locator("#parity-wiped")).to_be_visible(timeout=WAIT_MS)
    assert dialogs and "Wipe the state of bench-ui? 1 file" in dialogs[0]
    expect(page.locator("#parity-state-count")).to_have_text("0")
    assert not (data / "agents").exists()
