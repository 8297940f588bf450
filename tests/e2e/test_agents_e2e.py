"""Agents against a live service (daphne + worker + Redis): histories recorded from real frameworks through a stack of
real plugins (each plugin sees LibreFang's format, the agent gets its own format back, tool calls intact, pinned
kept), two bound agent tokens over the official MCP SDK client, and a client generated from /api/openapi.json with
openapi-python-client making typed calls."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.plugin_factory import make_plugin, write_config
from tests.waiting import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
VENV_BIN = Path(sys.executable).parent

# Layer 1 writes what it received, then gives no usable assemble/compact answer (the next layer answers).
RECORDER = """
import json, os, sys
req = json.loads(sys.stdin.read())
with open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], req["type"] + ".json"), "w") as out:
    json.dump(req, out)
print(json.dumps({"type": req["type"] + "_result", "messages": []} if req["type"] != "after_turn" else {"type": "ok"}))
"""
# Layer 2 answers: assemble keeps everything but the first message (the engine puts a pinned one back); compact
# keeps the last two messages and adds a summary message of its own.
TRIMMER_ASSEMBLE = """
import json, sys
req = json.loads(sys.stdin.read())
print(json.dumps({"type": "assemble_result", "messages": req["messages"][1:]}))
"""
TRIMMER_COMPACT = """
import json, sys
req = json.loads(sys.stdin.read())
summary = {"role": "user", "content": [{"type": "text", "text": "Summary: earlier turns."}]}
print(json.dumps({"type": "compact_result", "summary": "earlier turns", "messages": [summary] + req["messages"][-2:]}))
"""


@pytest.fixture
def stack(live):
    make_plugin(live.home / "plugins", "dialect-recorder", {h: RECORDER for h in ("assemble", "compact",
                                                                                   "after_turn")})
    make_plugin(live.home / "plugins", "dialect-trimmer", {"assemble": TRIMMER_ASSEMBLE, "compact": TRIMMER_COMPACT})
    write_config(live.home, stack=["dialect-recorder", "dialect-trimmer"])
    yield live.home / "plugin_data" / "dialect-recorder"
    write_config(live.home)


def seen_by_plugin(data_dir: Path, hook: str, deadline_secs: float = 20) -> dict:
    path = data_dir / f"{hook}.json"
    # not there yet, or being written
    return wait_until(lambda: json.loads(path.read_text()), deadline_secs, f"the plugin to receive {hook}",
                      until=lambda _: True, ignoring=(OSError, ValueError))


def assert_librefang_with_pairs(messages: list[dict]) -> None:
    uses = {}
    for i, m in enumerate(messages):
        assert m["role"] in ("system", "user", "assistant") and isinstance(m["content"], str | list), m
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b["type"] == "tool_use":
                uses[b["id"]] = i
            if b["type"] == "tool_result":
                assert uses[b["tool_use_id"]] == i - 1 and b["tool_name"], b  # its call just before it
    assert uses, "the recorded histories all hold a tool call"


@pytest.mark.parametrize("fixture", sorted(p.stem for p in FIXTURES.glob("*.json")))
def test_it_runs_real_histories_through_a_stack_of_plugins_in_the_agents_dialect(live, stack, fixture):
    recorded = json.loads((FIXTURES / f"{fixture}.json").read_text())
    request = {**recorded["request"], "agent_id": f"dialects-{fixture}"}
    request["messages"] = [{**request["messages"][0], "pinned": True}, *request["messages"][1:]]
    for f in stack.glob("*.json") if stack.exists() else []:
        f.unlink()

    status, assembled = live.request("POST", "/api/context-engine/hooks/assemble",
                                     {**request, "context_window_tokens": 100_000})
    assert status == 200 and assembled["source"] == "dialect-trimmer", assembled
    seen = seen_by_plugin(stack, "assemble")
    assert_librefang_with_pairs(seen["messages"])
    assert seen["messages"][0]["pinned"] is True
    # the trimmer dropped the pinned first message: put back, and everything goes back exactly as sent
    assert assembled["messages"] == request["messages"] and assembled["dialect"] == recorded["dialect"]
    assert any("pinned" in w for w in assembled["warnings"])

    status, compacted = live.request("POST", "/api/context-engine/hooks/compact", request)
    assert status == 200 and compacted["source"] == "dialect-trimmer", compacted
    assert_librefang_with_pairs(seen_by_plugin(stack, "compact")["messages"])
    # the plugin's summary, the pinned message put back after it, then the kept tail exactly as the agent sent it
    summary, pinned, *kept = compacted["messages"]
    assert pinned == request["messages"][0]
    assert kept and kept == request["messages"][-len(kept):]
    expected = "Summary: earlier turns."
    assert summary["content"] == expected or summary["content"] == [{"type": "text", "text": expected}]

    status, accepted = live.request("POST", "/api/context-engine/hooks/after_turn", request)
    assert status == 202, accepted
    turn = seen_by_plugin(stack, "after_turn")
    assert_librefang_with_pairs(turn["messages"])


def _token(live, name: str, *agents: str) -> str:
    args = [a for agent in agents for a in ("--agent", agent)]
    return live.manage("token", "create", "--role", "agent", "--name", f"{name}-{time.time_ns()}", *args
                       ).stdout.strip().splitlines()[-1]


def test_it_keeps_two_bound_agents_apart_over_the_mcp_sdk(live):
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    alice, bob = _token(live, "mcp-alice", "mcp-alice"), _token(live, "mcp-bob", "mcp-bob")
    status, made = live.request("POST", "/api/memories", {"agent_id": "mcp-bob", "content": "bob's locker is 42"},
                                token=bob)
    assert status == 201, made

    async def scenario():
        async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {alice}"}, timeout=60) as http,
                    streamable_http_client(live.url + "/mcp", http_client=http) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert all(t.output_schema for t in tools.values())
            for name, args in (("recall", {"agent_id": "mcp-bob", "query": "locker"}),
                               ("memory_list", {"agent_id": "mcp-bob"}),
                               ("memory_delete_scope", {"agent_id": "mcp-bob"})):
                result = await session.call_tool(name, args)
                assert result.is_error and result.structured_content["error"]["code"] == "agent_forbidden", name
            got = await session.call_tool("memory_get", {"id": made["id"]})
            assert got.is_error and got.structured_content["error"]["code"] == "not_found"
            added = await session.call_tool("memory_add", {"agent_id": "mcp-alice", "content": "alice likes chess",
                                                           "key": "hobby"})
            assert not added.is_error, added
            recalled = await session.call_tool("recall", {"agent_id": "mcp-alice", "query": "chess hobby"})
            assert not recalled.is_error, recalled
            memory = recalled.structured_content["memories"][0]
            assert memory["id"] == added.structured_content["id"] and memory["key"] == "hobby"
            invalid = await session.call_tool("recall", {})
            assert invalid.is_error and {tuple(d["loc"]) for d in invalid.structured_content["error"]["details"]} \
                == {("agent_id",), ("query",)}

    asyncio.run(scenario())
    status, still = live.request("GET", f"/api/memories/{made['id']}", token=bob)
    assert status == 200 and still["content"] == "bob's locker is 42"


def test_it_serves_a_client_generated_from_its_openapi_document(live, tmp_path):
    status, spec = live.request("GET", "/api/openapi.json")
    assert status == 200
    (tmp_path / "openapi.json").write_text(json.dumps(spec))
    # the service's gzip export is binary content: say so, as the generator's docs suggest
    (tmp_path / "config.yml").write_text("content_type_overrides:\n  application/gzip: application/octet-stream\n")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([str(VENV_BIN / "openapi-python-client"), "generate", "--path", "openapi.json",
                           "--config", "config.yml", "--output-path", "client", "--meta", "none"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        _typed_calls(live, importlib.import_module("client"))
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "client" or m.startswith("client.")]:
            del sys.modules[name]


def _typed_calls(live, client_pkg) -> None:
    from client.api.context_engine import hook_assemble, hook_ingest  # type: ignore[import-not-found]
    from client.api.memories import memories_create, memories_get, memories_update  # type: ignore[import-not-found]
    from client.models import (  # type: ignore[import-not-found]
        AssembleReply,
        AssembleRequest,
        IngestReply,
        IngestRequest,
        LibreFangMessage,
        LibreFangMessageRole,
        MemoryIn,
        MemoryOut,
        MemoryPatchIn,
    )

    api = client_pkg.AuthenticatedClient(base_url=live.url, token=live.token, timeout=60)
    made = memories_create.sync(client=api, body=MemoryIn(agent_id="gen-client", content="the VPN needs MFA"))
    assert isinstance(made, MemoryOut) and made.agent_id == "gen-client"
    got = memories_get.sync(made.id, client=api)
    assert isinstance(got, MemoryOut) and got.content == "the VPN needs MFA"
    changed = memories_update.sync(made.id, client=api, body=MemoryPatchIn(content="the VPN needs MFA and a key"))
    assert isinstance(changed, MemoryOut) and changed.content.endswith("a key")

    recalled = hook_ingest.sync(client=api, body=IngestRequest(agent_id="gen-client", message="how does the VPN work"))
    assert isinstance(recalled, IngestReply), recalled
    assert recalled.memories[0].id == made.id and 0 < recalled.memories[0].score <= 1
    assembled = hook_assemble.sync(client=api, body=AssembleRequest(
        agent_id="gen-client", messages=[LibreFangMessage(role=LibreFangMessageRole.USER, content="hello")]))
    assert isinstance(assembled, AssembleReply), assembled
    assert assembled.source == "default" and assembled.messages[0].content == "hello"
