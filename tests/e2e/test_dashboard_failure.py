"""The dashboard under failure, in real Chromium against the real service: a plugin that fails every call is shown
failing wherever it is named, pages survive Redis going away, a SIGKILLed worker is shown dead."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.plugin_factory import make_plugin, write_config

pytestmark = pytest.mark.browser
WAIT_MS = 30_000
CRASHING_INGEST = """
import sys
sys.stdin.read()
print("no database for you", file=sys.stderr)
sys.exit(1)
"""
OK_AFTER_TURN = """
import json, sys
sys.stdin.read()
print(json.dumps({"type": "ok"}))
"""


def _shot(page, screenshot_dir, name: str) -> None:
    page.screenshot(path=str(screenshot_dir / f"failure-{name}.png"), full_page=True)


def test_it_shows_the_crashing_engine_plugin_failing_on_every_panel(live, logged_in_page, screenshot_dir):
    name = f"crashy-{uuid.uuid4().hex[:6]}"
    make_plugin(live.home / "plugins", name, {"ingest": CRASHING_INGEST, "after_turn": OK_AFTER_TURN})
    write_config(live.home, plugin=name)
    try:
        for i in range(6):
            status, reply = live.hook("ingest", {"agent_id": "fails", "message": f"m{i}", "peer_id": "u"})
            assert status == 200 and reply["source"] == "default" and "script_error" in reply["fallback_reason"]
            assert live.hook("after_turn", {"agent_id": "fails", "messages": [{"role": "user", "content": "x"}]})[0] == 202
        end = time.monotonic() + 30  # traces are written in the background
        while time.monotonic() < end:
            body = live.request("GET", "/api/health", auth=False)[1]
            if (body.get("failing") or {}).get(name, {}).get("ingest", {}).get("failures", 0) >= 6:
                break
            time.sleep(0.3)
        failing = body["failing"][name]
        assert set(failing) == {"ingest"} and failing["ingest"]["last_error_kind"] == "script_error", body
        page = logged_in_page
        page.goto(f"{live.url}/?q={name}")
        state = page.locator(f"#plugin-row-{name} td[data-label=State]")
        assert "failing ingest" in state.inner_text() and "serving agents" not in state.inner_text()
        rates = page.locator(f"#plugin-row-{name} [data-hook-rate=ingest]").inner_text()
        assert "100" in rates, rates
        _shot(page, screenshot_dir, "crashing-plugin-list")
        page.goto(f"{live.url}/?errors=1")
        assert page.locator(f"#plugin-row-{name}").count() == 1
        page.goto(f"{live.url}/plugins/{name}/")
        assert "failing ingest" in page.inner_text("#plugin-state")
        notice = page.inner_text("[data-failing-notice]")
        assert "agent calls of ingest failed" in notice and "script_error" in notice
        _shot(page, screenshot_dir, "crashing-plugin-page")
        page.click("[data-failing-notice] a")
        page.wait_for_url(f"**/traces/?plugin={name}&hook=ingest&outcome=failed")
        assert page.locator("[data-trace-id]").count() >= 6
        page.goto(f"{live.url}/engine/")
        assert "failing ingest" in page.inner_text(f"[data-layer={name}]")
        page.wait_for_selector("#engine-health [data-health-failing]", timeout=WAIT_MS)
        assert "degraded" in page.inner_text("#engine-health")
        _shot(page, screenshot_dir, "crashing-engine-page")
        page.goto(f"{live.url}/doctor/")
        doctor = page.inner_text(f"#doctor-{name}")
        assert "problems" in doctor and "failing its ingest hook" in doctor
    finally:
        write_config(live.home)
