"""Issue 6 end to end: a wasm ingest hook answers a REST call through the real worker, its az_log line arrives on the
stderr websocket; a WASM tool is installed and executed over REST by a worker."""

import asyncio
import json
import time
import urllib.parse

import websockets

from engine import wasm as W
from engine.wasm import tools as T
from tests.fixtures.wasm.wat import compile_wat, fixture_wasm, tool_manifest
from tests.plugin_factory import write_config
from tests.waiting import wait_until

REPLY = {"type": "ingest_result", "memories": [{"content": "remembered by wasm"}]}


async def _first_line(url: str, timeout: float, connected: asyncio.Event) -> dict | None:
    async with websockets.connect(url) as ws:
        connected.set()  # accepted: the consumer joined its group before accepting (plugins_app/consumers.py)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = json.loads(await asyncio.wait_for(ws.recv(), timeout=end - time.monotonic()))
            except TimeoutError:
                return None
            if "line" in msg:
                return msg
    return None


def hook_stats(live, plugin: str) -> dict | None:
    return live.request("GET", "/api/context-engine/metrics")[1]["plugins"].get(plugin, {}).get("ingest")


def test_it_answers_ingest_from_a_wasm_hook_and_streams_its_az_log_line(live):
    pdir = live.home / "plugins" / "wasm-e2e"
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "hooks" / "ingest.wasm").write_bytes(compile_wat(W.hook_wat("wasm-e2e: ingest says hi", REPLY)))
    (pdir / "plugin.toml").write_text('name = "wasm-e2e"\nversion = "0.1.0"\n[hooks]\nruntime = "wasm"\n'
                                      'ingest = "hooks/ingest.wasm"\n')
    write_config(live.home, plugin="wasm-e2e")
    url = f"{live.ws_url}/ws/stderr/wasm-e2e/?format=json&token={urllib.parse.quote(live.token)}"

    async def scenario():
        connected = asyncio.Event()
        collector = asyncio.create_task(_first_line(url, 20, connected))
        await asyncio.wait_for(connected.wait(), 20)  # live lines only: the websocket joins its group first
        result = await asyncio.to_thread(live.hook, "ingest", {"agent_id": "a1", "message": "hello"})
        return result, await collector

    (status, body), line = asyncio.run(scenario())
    assert status == 200, body
    assert body["source"] == "wasm-e2e" and "fallback_reason" not in body
    assert {"content": "remembered by wasm", "scope": "hook"} in body["memories"]
    assert line is not None, "no stderr line arrived on the websocket"
    assert line["line"] == "[INFO] wasm-e2e: ingest says hi"
    assert line["plugin"] == "wasm-e2e" and line["hook"] == "ingest"
    # metrics are written by the worker's recording thread
    stats = wait_until(lambda: hook_stats(live, "wasm-e2e"), 20, "a success in wasm-e2e's ingest metrics",
                       until=lambda stats: stats and stats["successes"])
    assert stats and stats["successes"] >= 1


def test_it_falls_back_when_a_wasm_hook_loops_and_keeps_serving(live):
    pdir = live.home / "plugins" / "wasm-spin"
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "hooks" / "ingest.wasm").write_bytes(fixture_wasm("loop"))
    (pdir / "plugin.toml").write_text('name = "wasm-spin"\n[hooks]\nruntime = "wasm"\nhook_timeout_secs = 0.3\n'
                                      'ingest = "hooks/ingest.wasm"\n')
    write_config(live.home, plugin="wasm-spin")
    status, body = live.hook("ingest", {"agent_id": "a1", "message": "hello"})
    # "timeout" from the worker, or "deadline_exceeded" if a loaded machine made the reply later than the deadline.
    assert status == 200 and body["source"] == "default" and body["fallback_reason"]
    stats = wait_until(lambda: hook_stats(live, "wasm-spin"), 20, "a failure in wasm-spin's ingest metrics",
                       until=lambda stats: stats and stats["failures"])
    assert stats["failures"] >= 1 and "time limit" in json.dumps(stats.get("last_error"))
    status, health = live.request("GET", "/api/health")
    assert status == 200 and health["workers"]


def test_it_installs_and_executes_a_wasm_tool_over_rest(live):
    wasm = fixture_wasm("echo")
    data = T.package(tool_manifest("echo-e2e", wasm), wasm)
    status, body = live.request("POST", "/api/tools/install", raw=data, headers={"Content-Type": "application/x-tar"})
    assert status == 201, body
    status, body = live.request("POST", "/api/tools/echo-e2e/execute", {"input": '{"task":"hello"}'})
    assert status == 200, body
    assert body["output"] == "echo:ok" and body["error"] is None and body["ok"] is True
    status, listing = live.request("GET", "/api/tools")
    assert "echo-e2e" in [t["id"] for t in listing["tools"]]


def test_it_stops_a_looping_tool_within_the_policy_limit(live):
    wasm = fixture_wasm("loop")
    data = T.package(tool_manifest("spin-e2e", wasm), wasm)
    assert live.request("POST", "/api/tools/install", raw=data,
                        headers={"Content-Type": "application/x-tar"})[0] == 201
    (live.home / "config.toml").write_text('[runtime.wasm]\nmax_execution_ms = 200\n')
    try:
        status, body = live.request("POST", "/api/tools/spin-e2e/execute", {"input": "x"})
        assert status == 200, body
        assert body["ok"] is False and body["kind"] == "timeout" and "exceeded time limit (200 ms)" in body["error"]
    finally:
        (live.home / "config.toml").unlink()


def test_it_runs_a_tool_from_the_dashboard_console(live, logged_in_page, screenshot_dir):
    wasm = fixture_wasm("echo")
    data = T.package(tool_manifest("echo-ui", wasm, description="echo from the dashboard"), wasm)
    live.request("POST", "/api/tools/install", raw=data, headers={"Content-Type": "application/x-tar"})
    # the install queued a describe job: a worker reads the module's own name
    tool = wait_until(lambda: live.request("GET", "/api/tools/echo-ui")[1], 20, "the tool's module name",
                      until=lambda tool: tool.get("module_name"))
    assert tool["module_name"] == "echo_plugin"
    page = logged_in_page
    page.goto(live.url + "/tools/")
    page.get_by_role("link", name="WASM tools").wait_for()
    row = page.locator("#tool-echo-ui")
    assert "echo_plugin" in row.inner_text() and "enabled" in row.inner_text()
    page.select_option("#id_tool", "echo-ui")
    page.fill("#id_input", '{"task": "from the browser"}')
    page.get_by_role("button", name="Run").click()
    output = page.locator("[data-tool-output]")
    output.wait_for(timeout=20_000)
    assert output.inner_text() == "echo:ok"
    assert page.locator(".test-result").get_attribute("data-ok") == "true"
    page.screenshot(path=str(screenshot_dir / "wasm-tools-console.png"), full_page=True)
