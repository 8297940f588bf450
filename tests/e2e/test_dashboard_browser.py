"""The dashboard in a real browser (Debian's Chromium via Playwright) against real daphne + worker + Redis."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading

import pytest
import redis
from playwright.sync_api import expect

from tests.plugin_factory import make_plugin, write_config
from tests.waiting import wait_until

pytestmark = pytest.mark.browser
WAIT_MS = 30_000  # generous: the machine is shared and may be under load

# Says it started, then finishes once the test says so (a file in its data directory).
STREAMING_INGEST = """
import json, os, sys, time
req = json.loads(sys.stdin.read())
print(f"started {req['message']}", file=sys.stderr, flush=True)
go = os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "go")
end = time.monotonic() + 20
while not os.path.exists(go) and time.monotonic() < end:
    time.sleep(0.01)
print(f"finished {req['message']}", file=sys.stderr, flush=True)
print(json.dumps({"type": "ingest_result", "memories": [{"content": "seen " + req["message"]}]}))
"""

CONSOLE_INGEST = """
import json, sys
req = json.loads(sys.stdin.read())
print("console says hi to " + req["peer_id"], file=sys.stderr, flush=True)
print(json.dumps({"type": "ingest_result", "memories": [{"content": "echo: " + req["message"]}]}))
"""

PACED_AFTER_TURN = """
import json, sys, time
req = json.loads(sys.stdin.read())
tag = req["messages"][0]["content"]
for i in range(12):
    print(f"{tag} line {i}", file=sys.stderr, flush=True)
    time.sleep(0.5)  # paced: lines keep coming while the web server restarts, the point of the test
print(json.dumps({"type": "ok"}))
"""


def _lines(page) -> list[str]:
    return page.eval_on_selector_all("#stderr-lines .ln .text", "els => els.map(e => e.textContent)")


def _wait_ws(page, count: int = 1) -> None:
    page.wait_for_function(f"() => (parseInt(document.body.getAttribute('data-ws-open')) || 0) >= {count}",
                           timeout=WAIT_MS)


def test_it_logs_in_and_creates_plugins_in_python_node_and_bash(logged_in_page, live):
    page = logged_in_page
    expect(page.get_by_role("link", name="Create plugin").first).to_be_visible()
    expect(page.get_by_role("link", name="Install").first).to_be_visible()
    for runtime in ("python", "node", "bash"):
        name = f"made-{runtime}"
        page.goto(live.url + "/create/")
        page.fill("#id_name", name)
        expect(page.locator("#name-check")).to_contain_text("is available", timeout=WAIT_MS)
        page.select_option("#id_runtime", runtime)
        page.get_by_role("button", name="Create plugin").click()
        page.wait_for_url(f"{live.url}/plugins/{name}/", timeout=WAIT_MS)
        expect(page.locator("#hook-row-ingest")).to_be_visible()
        expect(page.locator("#hook-row-after_turn")).to_be_visible()
    page.goto(live.url + "/create/")
    page.fill("#id_name", "made-python")  # taken now
    expect(page.locator("#name-check")).to_contain_text("already exists", timeout=WAIT_MS)
    page.fill("#id_name", "bad name!")
    expect(page.locator("#name-check")).to_contain_text("letters, digits", timeout=WAIT_MS)
    page.goto(live.url + "/")
    for runtime in ("python", "node", "bash"):
        row = page.locator(f"#plugin-row-made-{runtime}")
        expect(row).to_be_visible()
        expect(row).to_contain_text(runtime)


def test_it_runs_a_hook_from_the_test_console(logged_in_page, live):
    make_plugin(live.home / "plugins", "console", {"ingest": CONSOLE_INGEST})
    page = logged_in_page
    page.goto(live.url + "/plugins/console/")
    payload = page.locator("#test-payload").input_value()
    assert '"peer_id": "user-42"' in payload  # pre-filled with a valid example
    page.get_by_role("button", name="Run hook").click()
    result = page.locator("#test-result")
    expect(result.locator("[data-test-reply]")).to_contain_text("echo: Remember that the review moved to Thursday.",
                                                                timeout=WAIT_MS)
    expect(result.locator("[data-test-stderr]")).to_contain_text("console says hi to user-42")
    expect(result.locator("[data-test-elapsed]")).to_have_text(re.compile(r"[\d.]+ ms"))
    # a payload that is not JSON gets a clear error and runs nothing
    page.fill("#test-payload", "{not json")
    page.get_by_role("button", name="Run hook").click()
    expect(result).to_contain_text("Not valid JSON", timeout=WAIT_MS)


def test_it_reloads_and_disables_with_visible_effect(logged_in_page, live):
    pdir = make_plugin(live.home / "plugins", "toggler", {"ingest": CONSOLE_INGEST})
    page = logged_in_page
    page.goto(live.url + "/plugins/toggler/")
    _wait_ws(page, 2)
    expect(page.locator("#plugin-state")).to_contain_text("enabled")
    expect(page.locator("#hook-row-assemble")).to_have_count(0)
    page.get_by_role("button", name="Disable").click()
    expect(page.locator("#action-feedback")).to_contain_text("Disable: done", timeout=WAIT_MS)
    expect(page.locator("#plugin-state")).to_contain_text("disabled")
    assert (pdir / ".disabled").exists()
    # add a hook on disk, then Reload: the new hook's row appears without a page load
    (pdir / "hooks" / "assemble.py").write_text("print('{}')\n")
    toml = (pdir / "plugin.toml").read_text().replace("[hooks]\n", '[hooks]\nassemble = "hooks/assemble.py"\n')
    (pdir / "plugin.toml").write_text(toml)
    page.get_by_role("button", name="Reload").click()
    expect(page.locator("#action-feedback")).to_contain_text("Reload: done", timeout=WAIT_MS)
    expect(page.locator("#hook-row-assemble")).to_be_visible(timeout=WAIT_MS)
    page.get_by_role("button", name="Enable").click()
    expect(page.locator("#plugin-state")).to_contain_text("enabled", timeout=WAIT_MS)
    # the audit panel is refreshed by each action's answer, no page load needed
    expect(page.locator("#audit-rows")).to_contain_text("plugin.enable", timeout=WAIT_MS)
    expect(page.locator("#audit-rows")).to_contain_text("plugin.disable")
    expect(page.locator("#audit-rows")).to_contain_text("plugin.reload")
    page.once("dialog", lambda dialog: dialog.accept())  # the confirm step
    page.get_by_role("button", name="Uninstall").click()
    page.wait_for_url(live.url + "/", timeout=WAIT_MS)
    expect(page.locator("main")).to_contain_text("toggler was uninstalled")
    expect(page.locator("#plugin-row-toggler")).to_have_count(0)
    assert not pdir.exists()


def test_it_shows_stderr_lines_live_while_the_hook_runs(logged_in_page, live):
    """Also the walking-skeleton check: log in, open a plugin page, see a live stderr line appear."""
    make_plugin(live.home / "plugins", "livelog", {"ingest": STREAMING_INGEST})
    write_config(live.home, plugin="livelog")
    page = logged_in_page
    page.goto(live.url + "/plugins/livelog/")
    _wait_ws(page, 2)
    outcome: dict = {}
    call = threading.Thread(target=lambda: outcome.update(r=live.hook(
        "ingest", {"agent_id": "a1", "message": "kafka", "peer_id": "u1"})))
    call.start()
    expect(page.locator("#stderr-lines")).to_contain_text("started kafka", timeout=WAIT_MS)
    still_running = call.is_alive()  # the hook waits for the word below after its first line
    (live.home / "plugin_data" / "livelog" / "go").touch()
    call.join(60)
    assert still_running, "the first stderr line only arrived after the hook had finished"
    expect(page.locator("#stderr-lines")).to_contain_text("finished kafka", timeout=WAIT_MS)
    assert outcome["r"][0] == 200 and outcome["r"][1]["source"] == "livelog"
    # hook filter and text filter, then pause: held lines are shown on resume
    page.fill("[data-stderr-text]", "finished")
    expect(page.locator("#stderr-lines .ln:visible")).to_have_count(1)
    page.fill("[data-stderr-text]", "")
    expect(page.locator("#stderr-lines .ln:visible")).to_have_count(2)
    page.get_by_role("button", name="Pause").click()
    status, _ = live.hook("ingest", {"agent_id": "a1", "message": "held", "peer_id": "u1"})
    assert status == 200
    expect(page.locator("[data-stderr-status]")).to_contain_text("2 new line(s) held", timeout=WAIT_MS)
    assert "started held" not in page.locator("#stderr-lines").inner_text()
    page.get_by_role("button", name="Resume").click()
    expect(page.locator("#stderr-lines")).to_contain_text("finished held")
    page.get_by_role("button", name="Clear").click()
    expect(page.locator("#stderr-lines .ln")).to_have_count(0)


def test_it_updates_metrics_after_rest_calls_without_reloading(logged_in_page, live):
    make_plugin(live.home / "plugins", "counted", {"ingest": CONSOLE_INGEST})
    write_config(live.home, plugin="counted")
    page = logged_in_page
    page.goto(live.url + "/")
    _wait_ws(page, 1)
    calls = page.locator("#plugin-row-counted [data-metric=calls]")
    expect(calls).to_have_text("0")
    page.evaluate("window.__sameDocument = true")
    for i in range(3):
        status, body = live.hook("ingest", {"agent_id": "a1", "message": f"m{i}", "peer_id": "u1"})
        assert status == 200 and body["source"] == "counted", body
    expect(calls).to_have_text("3", timeout=WAIT_MS)
    expect(page.locator("#plugin-row-counted [data-metric=p95]")).to_contain_text("ms")
    assert page.evaluate("window.__sameDocument") is True  # no reload happened


def _restart_web(live, kill: bool = True) -> None:
    if kill:
        os.killpg(live.web.pid, signal.SIGKILL)
        live.web.wait(timeout=30)
    live.web = live._spawn("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(live.port),
                                   "librefang_site.web:application"])
    live.wait_healthy(1, timeout=60)


def test_it_neither_loses_nor_repeats_lines_across_a_websocket_reconnect(logged_in_page, live):
    make_plugin(live.home / "plugins", "paced", {"after_turn": PACED_AFTER_TURN})
    write_config(live.home, plugin="paced")
    # lines from before the page is opened are shown too
    status, _ = live.hook("after_turn", {"agent_id": "a1", "messages": [{"role": "user", "content": "early"}]})
    assert status == 202
    page = logged_in_page
    page.goto(live.url + "/plugins/paced/")
    _wait_ws(page, 2)
    expect(page.locator("#stderr-lines")).to_contain_text("early line 11", timeout=WAIT_MS)
    status, _ = live.hook("after_turn", {"agent_id": "a1", "messages": [{"role": "user", "content": "late"}]})
    assert status == 202
    expect(page.locator("#stderr-lines")).to_contain_text("late line 1", timeout=WAIT_MS)
    # the web server dies mid-stream (the browser sees an abnormal close, 1006) and comes back; the worker keeps
    # writing lines meanwhile; htmx reconnects on its own and the page asks for lines after the last it has
    _restart_web(live)
    expect(page.locator("#stderr-lines")).to_contain_text("late line 11", timeout=60_000)
    _wait_ws(page, 3)  # really a second stderr connection (2 sockets at load + at least 1 reconnect)
    lines = _lines(page)
    expected = [f"early line {i}" for i in range(12)] + [f"late line {i}" for i in range(12)]
    assert [ln for ln in lines if ln.startswith(("early", "late"))] == expected
    seqs = page.eval_on_selector_all("#stderr-lines .ln", "els => els.map(e => +e.dataset.seq)")
    assert seqs == sorted(set(seqs))


FLOOD_AFTER_TURN = """
import json, os, sys, time
tag = json.loads(sys.stdin.read())["messages"][0]["content"]
if tag == "flood":
    go = os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "go")
    end = time.monotonic() + 20
    while not os.path.exists(go) and time.monotonic() < end:  # until the test has killed the web server
        time.sleep(0.01)
    for i in range(600):
        print(f"flood line {i}", file=sys.stderr)
else:
    print(f"{tag} line 0", file=sys.stderr)
print(json.dumps({"type": "ok"}))
"""


def _page_with_first_line(page, live, plugin: str):
    """A plugin with FLOOD_AFTER_TURN serving, its page open and showing the line of one call; and a Redis client."""
    make_plugin(live.home / "plugins", plugin, {"after_turn": FLOOD_AFTER_TURN})
    write_config(live.home, plugin=plugin)
    page.goto(live.url + f"/plugins/{plugin}/")
    _wait_ws(page, 2)
    live.hook("after_turn", {"agent_id": "a1", "messages": [{"role": "user", "content": "first"}]})
    expect(page.locator("#stderr-lines")).to_contain_text("first line 0", timeout=WAIT_MS)
    return redis.Redis.from_url(live.env.get("REDIS_URL", "redis://127.0.0.1:6379/0"))


def test_it_says_which_lines_it_missed_when_more_arrived_than_the_tail_keeps(logged_in_page, live):
    page = logged_in_page
    r = _page_with_first_line(page, live, "flood")
    first = page.eval_on_selector("#stderr-lines .ln", "e => +e.dataset.seq")
    # 600 lines while the page's server is down: the plugin's tail keeps the last 500, so 100 are gone for good
    status, _ = live.hook("after_turn", {"agent_id": "a1", "messages": [{"role": "user", "content": "flood"}]})
    assert status == 202
    os.killpg(live.web.pid, signal.SIGKILL)
    live.web.wait(timeout=30)
    (live.home / "plugin_data" / "flood" / "go").touch()  # the flood comes while the web server is down
    tail = f"{live.env['LIBREFANG_REDIS_PREFIX']}:stderr:tail:flood"
    wait_until(lambda: r.lindex(tail, -1), 60, "the worker to publish the flood",
               until=lambda last: last and b"flood line 599" in last)
    _restart_web(live, kill=False)
    expect(page.locator("#stderr-lines")).to_contain_text("flood line 599", timeout=60_000)
    notice = page.locator("#stderr-lines .missed")
    expect(notice).to_have_count(1)
    expect(notice).to_contain_text(f"Lines after #{first} up to #{first + 100}")
    lines = [ln for ln in _lines(page) if ln.startswith(("first", "flood"))]
    assert lines == ["first line 0"] + [f"flood line {i}" for i in range(100, 600)]
    # the notice sits where the hole is: right after the last line the page had
    texts = page.eval_on_selector_all("#stderr-lines > .ln, #stderr-lines > .missed", "els => els.map(e => "
                                      "e.classList.contains('missed') ? 'MISSED' : e.querySelector('.text').textContent)")
    at = texts.index("MISSED")
    assert texts[at - 1] == "first line 0" and texts[at + 1] == "flood line 100"


def test_it_keeps_showing_lines_when_redis_loses_its_line_counter(logged_in_page, live):
    page = logged_in_page
    r = _page_with_first_line(page, live, "renum")
    prefix = live.env["LIBREFANG_REDIS_PREFIX"]
    r.delete(f"{prefix}:stderr:seq", f"{prefix}:stderr:epoch")  # as a Redis that came back without its data
    live.hook("after_turn", {"agent_id": "a1", "messages": [{"role": "user", "content": "second"}]})
    # numbered from 1 again: shown after a notice, not dropped as a repeat of the first line's number
    expect(page.locator("#stderr-lines")).to_contain_text("second line 0", timeout=WAIT_MS)
    expect(page.locator("#stderr-lines .renumbered")).to_have_count(1)
    assert [ln for ln in _lines(page) if ln.endswith("line 0")] == ["first line 0", "second line 0"]


PAGES = [("plugins", "/"), ("create", "/create/"), ("install", "/install/"), ("plugin", "/plugins/shown/"),
         ("engine", "/engine/"), ("doctor", "/doctor/"), ("tokens", "/tokens/"), ("metrics", "/metrics/"),
         ("metrics-hook", "/metrics/?plugin=shown&hook=ingest"), ("traces", "/traces/"), ("trace", None),
         ("workers", "/workers/"), ("tools", "/tools/"), ("not-found", "/no/such/page/")]


def test_it_screenshots_every_page_at_desktop_and_phone_widths_in_both_color_schemes(browser, live, screenshot_dir):
    make_plugin(live.home / "plugins", "shown", {"ingest": CONSOLE_INGEST, "assemble": "print('{}')"},
                top_extra='description = "A plugin that shows every panel"'.replace("description", "homepage"))
    make_plugin(live.home / "plugins", "broken-one", {"compact": "import sys; sys.exit(3)"})
    write_config(live.home, stack=["shown", "broken-one"])
    for i in range(4):
        live.hook("ingest", {"agent_id": "a1", "message": f"screenshot {i}", "peer_id": "u1"})
    live.hook("compact", {"agent_id": "a1", "messages": [{"role": "user", "content": "x"}]})
    _, listed = live.request("GET", "/api/context-engine/traces?plugin=shown&limit=1")
    trace_path = f"/traces/{listed['traces'][0]['trace_id']}/"
    for scheme in ("light", "dark"):
        for label, width, height in (("1280", 1280, 900), ("390", 390, 844)):
            context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
            page = context.new_page()
            suffix = f"{label}-{scheme}"
            page.goto(live.url + "/login/")
            page.screenshot(path=str(screenshot_dir / f"login-{suffix}.png"), full_page=True)
            page.fill("#id_username", "admin")
            page.fill("#id_password", live.password)
            page.click("button[type=submit]")
            page.wait_for_url(live.url + "/")
            for name, path in PAGES:
                page.goto(live.url + (path or trace_path))
                if name == "plugin":
                    page.get_by_role("button", name="Run hook").click()
                    expect(page.locator("[data-test-reply]")).to_contain_text("echo:", timeout=WAIT_MS)
                if name == "engine":
                    expect(page.locator("#engine-health")).to_contain_text("Redis", timeout=WAIT_MS)
                if name.startswith("metrics") or name == "workers":
                    page.wait_for_function("() => document.querySelector('[data-chart]').hasAttribute('data-to')",
                                           timeout=WAIT_MS)
                no_overflow = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
                page.screenshot(path=str(screenshot_dir / f"{name}-{suffix}.png"), full_page=True)
                assert no_overflow, f"{name} scrolls sideways at {width} px ({scheme})"
            if label == "390":
                page.goto(live.url + "/")
                page.get_by_role("button", name="Menu").click()
                page.screenshot(path=str(screenshot_dir / f"menu-open-{suffix}.png"))
            context.close()
