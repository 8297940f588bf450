"""Monitoring in a real browser (Chromium) against the real service: charts and their time-range picker, the trace
explorer, the workers page, dark mode."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from playwright.sync_api import expect

from tests.plugin_factory import make_plugin, write_config

pytestmark = pytest.mark.browser
WAIT_MS = 30_000

SLOWISH_INGEST = """
import json, sys, time
req = json.loads(sys.stdin.read())
time.sleep(0.05)  # a duration worth charting: the time it takes is the point
print("ingesting " + req["message"], file=sys.stderr, flush=True)
print(json.dumps({"type": "ingest_result", "memories": [{"content": "kept " + req["message"]}]}))
"""


def _loaded_range(page, card: str = "[data-chart]") -> tuple[int, int]:
    page.wait_for_function(f"() => document.querySelector('{card}').hasAttribute('data-to')", timeout=WAIT_MS)
    return (int(page.get_attribute(card, "data-from")), int(page.get_attribute(card, "data-to")))


def test_it_changes_the_charts_time_range_with_the_picker(logged_in_page, live):
    make_plugin(live.home / "plugins", "charted", {"ingest": SLOWISH_INGEST})
    write_config(live.home, plugin="charted")
    for i in range(3):
        status, body = live.hook("ingest", {"agent_id": "chart-agent", "message": f"c{i}", "peer_id": "u1"})
        assert status == 200 and body["source"] == "charted", body
    page = logged_in_page
    page.goto(live.url + "/metrics/?plugin=charted&hook=ingest")
    card = page.locator("[data-chart]")
    start, end = _loaded_range(page)
    assert end - start == 3600  # the default range: one hour
    expect(card.locator("[data-chart-summary]")).to_contain_text("calls 3", timeout=WAIT_MS)
    expect(card.locator("[data-chart-summary]")).to_contain_text("p95")
    expect(card.locator("[data-chart-summary]")).not_to_contain_text("≤")
    assert card.locator("canvas").count() >= 2  # uPlot drew both charts
    for label, seconds in (("7 d", 7 * 86400), ("15 min", 900), ("24 h", 86400)):
        card.get_by_role("button", name=label).click()
        page.wait_for_function(f"() => (+document.querySelector('[data-chart]').dataset.to) - "
                               f"(+document.querySelector('[data-chart]').dataset.from) === {seconds}",
                               timeout=WAIT_MS)
        expect(card.get_by_role("button", name=label)).to_have_attribute("aria-pressed", "true")
        assert int(page.get_attribute("[data-chart]", "data-points")) <= 300
    # A custom range two to three hours ago: empty, and the summary says so.
    card.locator("summary", has_text="Custom").click()
    fmt = "%Y-%m-%dT%H:%M"
    now = dt.datetime.now()  # the browser's local time (same machine)
    card.locator("input[name=from]").fill((now - dt.timedelta(hours=3)).strftime(fmt))
    card.locator("input[name=to]").fill((now - dt.timedelta(hours=2)).strftime(fmt))
    card.get_by_role("button", name="Apply").click()
    page.wait_for_function("() => document.querySelector('[data-chart]').dataset.loadedRange === 'custom'",
                           timeout=WAIT_MS)
    start, end = _loaded_range(page)
    assert end - start == 3600
    expect(card.locator("[data-chart-summary]")).to_contain_text("calls 0")
    # Live: a new call shows up on a relative range without reloading the page.
    card.get_by_role("button", name="15 min").click()
    expect(card.locator("[data-chart-summary]")).to_contain_text("calls 3", timeout=WAIT_MS)
    live.hook("ingest", {"agent_id": "chart-agent", "message": "c-live", "peer_id": "u1"})
    expect(card.locator("[data-chart-summary]")).to_contain_text("calls 4", timeout=45_000)


def test_it_finds_a_trace_by_agent_and_text_and_opens_its_detail(logged_in_page, live):
    make_plugin(live.home / "plugins", "traced", {"ingest": SLOWISH_INGEST})
    write_config(live.home, plugin="traced")
    for agent, msg in (("trace-agent-1", "apples"), ("trace-agent-2", "the-zebra-needle"), ("trace-agent-1", "pears")):
        status, _ = live.hook("ingest", {"agent_id": agent, "message": msg, "peer_id": "u1"})
        assert status == 200
    page = logged_in_page
    page.goto(live.url + "/traces/")
    page.get_by_role("textbox", name="Agent", exact=True).fill("trace-agent-1")
    page.get_by_role("button", name="Search").click()
    results = page.locator("#trace-results")
    expect(results).to_contain_text("2 traces", timeout=WAIT_MS)
    expect(results).not_to_contain_text("the-zebra-needle")
    assert "agent=trace-agent-1" in page.url  # the search is in the address bar (shareable, back button)
    page.get_by_role("textbox", name="Agent", exact=True).fill("")
    page.get_by_role("searchbox", name="Text", exact=True).fill("zebra-needle")
    page.get_by_role("button", name="Search").click()
    expect(results).to_contain_text("1 trace", timeout=WAIT_MS)
    expect(results).to_contain_text("trace-agent-2")
    results.locator("a code").first.click()
    page.wait_for_url(re.compile(r".*/traces/[0-9a-f]{16}/$"), timeout=WAIT_MS)
    expect(page.locator("#trace-request")).to_contain_text("the-zebra-needle")
    expect(page.locator("#trace-reply")).to_contain_text("kept the-zebra-needle")
    expect(page.locator("#trace-stderr")).to_contain_text("ingesting the-zebra-needle")
    expect(page.locator("main")).to_contain_text("Duration")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.locator("[data-copy='#trace-request']").click()
    expect(page.locator("[data-copy='#trace-request']")).to_have_text("Copied")


def test_it_shows_the_live_worker_with_its_pid(logged_in_page, live):
    page = logged_in_page
    page.goto(live.url + "/workers/")
    pids = [str(p.pid) for p in live.workers]
    row = page.locator(f"[data-worker-pid='{pids[0]}']")
    expect(row).to_be_visible(timeout=WAIT_MS)
    expect(row).to_contain_text(pids[0])
    expect(page.locator("[data-queue=length]")).to_be_visible()
    expect(page.locator("[data-queue=lag]")).to_be_visible()
    # It refreshes itself: the last heartbeat keeps being recent.
    age = row.locator("[data-beat-age]")
    expect(age).not_to_have_text(age.inner_text(), timeout=WAIT_MS)  # shown again since
    expect(age).to_contain_text(re.compile(r"^[0-2]\.\d s ago$"), timeout=WAIT_MS)


def test_it_follows_the_system_color_scheme_and_flips_with_the_toggle(browser, live):
    for scheme, other in (("dark", "light"), ("light", "dark")):
        context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
        page = context.new_page()
        page.goto(live.url + "/login/")
        bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert page.evaluate("document.documentElement.dataset.effectiveTheme") == scheme
        assert _is_dark(bg) == (scheme == "dark"), bg
        page.locator("[data-theme-toggle]").click()
        assert page.evaluate("document.documentElement.dataset.effectiveTheme") == other
        assert _is_dark(page.evaluate("getComputedStyle(document.body).backgroundColor")) == (other == "dark")
        page.reload()  # the choice is remembered
        assert _is_dark(page.evaluate("getComputedStyle(document.body).backgroundColor")) == (other == "dark")
        expect(page.locator("[data-theme-toggle]")).to_have_attribute("aria-pressed",
                                                                      "true" if other == "dark" else "false")
        context.close()


def _is_dark(css_color: str) -> bool:
    r, g, b = (int(x) for x in re.findall(r"\d+", css_color)[:3])
    return (r + g + b) / 3 < 100


def test_it_keeps_the_phone_nav_on_one_row_with_a_menu_and_the_user_name(browser, live):
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.goto(live.url + "/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", live.password)
    page.click("button[type=submit]")
    page.wait_for_url(live.url + "/")
    header_h = page.evaluate("document.querySelector('.topbar').getBoundingClientRect().height")
    assert header_h < 70, header_h  # one row
    expect(page.locator(".topbar .who")).to_be_visible()
    expect(page.locator(".topbar .who")).to_have_text("admin")
    nav = page.locator("#main-nav")
    expect(nav).to_be_hidden()
    page.get_by_role("button", name="Menu").click()
    expect(nav).to_be_visible()
    nav.get_by_role("link", name="Traces").click()
    page.wait_for_url(live.url + "/traces/")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    context.close()


def test_it_counts_test_console_runs_apart_from_agent_calls(logged_in_page, live):
    make_plugin(live.home / "plugins", "consoled", {"ingest": SLOWISH_INGEST})
    page = logged_in_page
    page.goto(live.url + "/plugins/consoled/")
    page.get_by_role("button", name="Run hook").click()
    expect(page.locator("[data-test-reply]")).to_contain_text("kept", timeout=WAIT_MS)
    page.goto(live.url + "/metrics/?plugin=consoled&hook=ingest")
    summary = page.locator("[data-chart-summary]")
    expect(summary).to_contain_text("test console 1", timeout=WAIT_MS)
    expect(summary).to_contain_text("calls 0")
    _, metrics = live.request("GET", "/api/context-engine/metrics")
    stats = metrics["plugins"]["consoled"]["ingest"]
    assert stats["calls"] == 0 and stats["test_console"]["calls"] == 1
    page.goto(live.url + "/traces/?plugin=consoled")
    expect(page.locator("#trace-results")).to_contain_text("test console")
    page.goto(live.url + "/")
    expect(page.locator("#plugin-row-consoled [data-metric=calls]")).to_have_text(re.compile(r"^\s*0\b"))
    expect(page.locator("#plugin-row-consoled [data-metric=test-console-calls]")).to_have_text("+1 test")
