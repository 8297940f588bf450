"""Charts with a real time axis, in Chromium against the real service: the range is in the URL and survives a
reload, and a chart left open under traffic moves its axis with the clock and shows the newest bucket."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config

pytestmark = pytest.mark.browser
WAIT_MS = 30_000
OPEN_SECS = 120


def _attr(page, name: str) -> int:
    page.wait_for_function(f"() => document.querySelector('[data-chart]').getAttribute('{name}')", timeout=WAIT_MS)
    return int(page.get_attribute("[data-chart]", name))


def test_it_keeps_the_range_in_the_url_and_after_a_reload(live, logged_in_page):
    page = logged_in_page
    page.goto(live.url + "/metrics/")
    card = page.locator("[data-chart]")
    card.get_by_role("button", name="24 h").click()
    page.wait_for_function("() => document.querySelector('[data-chart]').dataset.loadedRange === '24h'",
                           timeout=WAIT_MS)
    assert "range=24h" in page.url
    axis = _attr(page, "data-axis-to") - _attr(page, "data-axis-from")
    assert abs(axis - 86400) <= 2, axis  # the axis spans the range, not the last hour
    page.reload()
    page.wait_for_function("() => document.querySelector('[data-chart]').dataset.loadedRange === '24h'",
                           timeout=WAIT_MS)
    assert card.get_by_role("button", name="24 h").get_attribute("aria-pressed") == "true"
    page.goto(live.url + "/engine/?range=7d")  # a shared link opens on its range, on any page with a chart
    page.wait_for_function("() => document.querySelector('[data-chart]').dataset.loadedRange === '7d'",
                           timeout=WAIT_MS)


@pytest.mark.timeout(400)
def test_it_moves_an_open_chart_with_the_clock_and_draws_new_buckets_under_traffic(live, logged_in_page,
                                                                                    screenshot_dir):
    name = f"ticking-{uuid.uuid4().hex[:6]}"
    make_plugin(live.home / "plugins", name, {"ingest": PY_ECHO_INGEST})
    write_config(live.home, plugin=name)
    stop = threading.Event()
    sent = []

    def agent() -> None:
        while not stop.is_set():
            status, _ = live.hook("ingest", {"agent_id": "tick", "message": "m", "peer_id": "u"})
            sent.append((time.time(), status))
            stop.wait(0.5)

    thread = threading.Thread(target=agent, daemon=True)
    page = logged_in_page
    try:
        thread.start()
        page.goto(f"{live.url}/metrics/?plugin={name}&hook=ingest&range=15m")
        first_axis = _attr(page, "data-axis-to")
        first_data = _attr(page, "data-to")
        page.wait_for_timeout(OPEN_SECS * 1000)  # the page stays open: no reload, no click
        last_axis = _attr(page, "data-axis-to")
        now = time.time()
        page.wait_for_function("() => document.querySelector('[data-chart]').dataset.newestBucket", timeout=WAIT_MS)
        newest = _attr(page, "data-newest-bucket")
        last_data = _attr(page, "data-to")
        page.screenshot(path=str(screenshot_dir / "charts-open-two-minutes.png"), full_page=True)
    finally:
        stop.set()
        thread.join(timeout=30)
        write_config(live.home)
    assert sum(1 for _, s in sent if s == 200) > 100, len(sent)
    assert last_axis - first_axis >= OPEN_SECS - 5, (first_axis, last_axis)  # the axis followed the clock
    assert abs(last_axis - now) <= 5, (last_axis, now)
    assert last_data > first_data  # the data was fetched again meanwhile
    assert newest >= now - 120, (newest, now)  # the minute being filled now is drawn (1-minute buckets)
