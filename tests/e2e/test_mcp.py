"""/mcp driven by the official SDK's own client against a live service (daphne + worker + Redis): initialize, the
tool list (with a WASM tool installed mid-session and the list-changed notification), recall answered by a python
plugin, remember processed by the worker, a WASM tool call, resources, and the refusals."""

import asyncio
import json
import time
import urllib.error
import urllib.request

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from engine.home import Home
from engine.wasm import tools as T
from tests.fixtures.wasm.wat import fixture_wasm, tool_manifest
from tests.plugin_factory import make_plugin, write_config
from tests.waiting import wait_until, wait_until_async

RECALL_INGEST = """
import json, sys
req = json.loads(sys.stdin.read())
print(json.dumps({"type": "ingest_result", "memories": [{"content": "mcp recalled " + req["message"]}]}))
"""
MARKER_AFTER_TURN = """
import json, os, sys
req = json.loads(sys.stdin.read())
with open(os.environ["MCP_MARKER"], "a") as out:
    out.write(req["messages"][-1]["content"] + "\\n")
print(json.dumps({"type": "ok"}))
"""


def token(live, role: str) -> str:
    return live.manage("token", "create", "--role", role, "--name", f"mcp-{role}-{time.time_ns()}"
                       ).stdout.strip().splitlines()[-1]


def structured(result: types.CallToolResult) -> dict:
    return result.structured_content or json.loads(result.content[0].text)


async def session_run(url: str, bearer: str, scenario, notes: list | None = None):
    async def on_message(message):
        if notes is not None:
            notes.append(message)

    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=60) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write, message_handler=on_message) as session):
        init = await session.initialize()
        return await scenario(session, init)


def is_list_changed(message) -> bool:
    return isinstance(message, types.ToolListChangedNotification)


def raw_post(live, headers: dict) -> tuple[int, dict]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
    req = urllib.request.Request(live.url + "/mcp", data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_it_refuses_mcp_without_a_valid_token(live):
    status, headers = raw_post(live, {})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    status, headers = raw_post(live, {"Authorization": "Bearer lf_not_a_token"})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")


def test_it_serves_recall_remember_and_wasm_tools_over_mcp(live):
    marker = Home(live.home).data_dir("mcp-recaller") / "after_turn.txt"  # the one place a hook may write
    make_plugin(live.home / "plugins", "mcp-recaller", {"ingest": RECALL_INGEST,
                                                        "after_turn": MARKER_AFTER_TURN.replace(
                                                            'os.environ["MCP_MARKER"]', repr(str(marker)))})
    write_config(live.home, plugin="mcp-recaller")
    notes: list = []

    async def scenario(session: ClientSession, init):
        assert init.capabilities.tools is not None and init.capabilities.tools.list_changed
        names = [t.name for t in (await session.list_tools()).tools]
        assert {"recall", "remember", "assemble", "compact", "plugins", "doctor"} <= set(names)
        assert "echo-mcp" not in names

        recall = await session.call_tool("recall", {"agent_id": "mcp-a1", "query": "kafka", "peer_id": "u1"})
        assert not recall.is_error, recall
        body = structured(recall)
        assert body["source"] == "mcp-recaller" and {"content": "mcp recalled kafka", "scope": "hook"} in body[
            "memories"]

        remember = await session.call_tool("remember", {"agent_id": "mcp-a1", "messages": [
            {"role": "user", "content": "remember me over mcp"}]})
        assert not remember.is_error, remember
        assert structured(remember)["accepted"] is True and structured(remember)["job_id"]

        assemble = await session.call_tool("assemble", {"agent_id": "mcp-a1", "messages": [
            {"role": "user", "content": "fit me"}], "context_window_tokens": 4096})
        assert not assemble.is_error, assemble
        assert structured(assemble)["messages"][-1]["content"] == "fit me"

        # a WASM tool installed while the session is open: list-changed arrives, then the tool is listed
        wasm = fixture_wasm("echo")
        status, info = await asyncio.to_thread(
            live.request, "POST", "/api/tools/install", raw=T.package(tool_manifest("echo-mcp", wasm), wasm),
            headers={"Content-Type": "application/x-tar"})
        assert status == 201, info
        await wait_until_async(lambda: notes, 20, "the tool list-changed notification",
                               until=lambda got: any(map(is_list_changed, got)))
        assert any(map(is_list_changed, notes)), notes
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert "echo-mcp" in tools and tools["echo-mcp"].input_schema["type"] == "object"

        echo = await session.call_tool("echo-mcp", {"task": "hello"})
        assert not echo.is_error, echo
        assert structured(echo)["output"] == "echo:ok"

        resources = [str(r.uri) for r in (await session.list_resources()).resources]
        assert "librefang://plugins/mcp-recaller/manifest" in resources
        manifest = await session.read_resource("librefang://plugins/mcp-recaller/manifest")
        assert 'name = "mcp-recaller"' in manifest.contents[0].text
        return body

    asyncio.run(session_run(live.url + "/mcp", live.token, scenario, notes))
    wait_until(lambda: marker.exists() and marker.read_text(), 20, "the worker to run after_turn",
               until=lambda text: text and "remember me over mcp" in text)
    assert marker.read_text().strip() == "remember me over mcp"  # the worker ran after_turn

    async def traces(session: ClientSession, init):
        got = await session.read_resource("librefang://plugins/mcp-recaller/traces")
        return json.loads(got.contents[0].text)["traces"]

    # the MCP calls are traces of the plugin, marked as MCP (recorded by the worker in batches)
    found = wait_until(lambda: asyncio.run(session_run(live.url + "/mcp", live.token, traces)), 15,
                       "traces of ingest and after_turn", until=lambda got: {t["hook"] for t in got} == {
                           "ingest", "after_turn"})
    assert {(t["hook"], t["origin"]) for t in found} == {("ingest", "mcp"), ("after_turn", "mcp")}, found


@pytest.mark.parametrize("role", ["viewer"])
def test_it_refuses_recall_to_a_viewer_token_and_lists_only_what_it_may_call(live, role):
    bearer = token(live, role)

    async def scenario(session: ClientSession, init):
        names = {t.name for t in (await session.list_tools()).tools}
        assert names == {"plugins", "doctor"}
        refused = await session.call_tool("recall", {"agent_id": "a1", "query": "x"})
        assert refused.is_error and structured(refused)["error"]["code"] == "forbidden"
        plugins = await session.call_tool("plugins", {})
        assert not plugins.is_error and "plugins" in structured(plugins)
        return True

    assert asyncio.run(session_run(live.url + "/mcp", bearer, scenario))


def test_it_stops_answering_a_session_whose_token_was_revoked(live):
    from plugins_app.mcp.tokens import TOKEN_CACHE_SECS

    name = f"mcp-revoked-{time.time_ns()}"
    bearer = live.manage("token", "create", "--role", "agent", "--name", name).stdout.strip().splitlines()[-1]

    async def scenario(session: ClientSession, init):
        assert "recall" in {t.name for t in (await session.list_tools()).tools}
        await asyncio.to_thread(live.manage, "token", "revoke", name)
        await asyncio.sleep(TOKEN_CACHE_SECS + 0.5)  # the per-process token cache forgets it
        with pytest.raises(MCPError, match="error response"):  # the client's error for the HTTP 401 reply
            await asyncio.wait_for(session.list_tools(), 30)
        return True

    assert asyncio.run(session_run(live.url + "/mcp", bearer, scenario))
    status, _ = raw_post(live, {"Authorization": f"Bearer {bearer}"})
    assert status == 401
