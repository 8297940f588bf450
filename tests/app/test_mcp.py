"""The /mcp server's parts with real Redis, the real engine and the real database: which tools each role sees, the
"mcp" origin from the queued job to the trace (counted with agent traffic), refusals as tool errors, resources."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from engine.wasm import tools as T
from plugins_app import bus
from plugins_app.auth import headers_bearer
from plugins_app.mcp import resources, tokens
from plugins_app.mcp import tools as mcp_tools
from plugins_app.models import HookMetric, HookTrace, JobRecord
from plugins_app.services import jobs
from plugins_app.services.tokens import create_token
from tests.app.recording_fixtures import _flush_recording, _release_writer_connection  # noqa: F401
from tests.fixtures.wasm.wat import fixture_wasm, tool_manifest
from tests.plugin_factory import make_plugin, write_config

RECALL = """
import json, sys
req = json.loads(sys.stdin.read())
print(json.dumps({"type": "ingest_result", "memories": [{"content": "got " + req["message"]}]}))
"""
HOOKS = {"recall", "remember", "assemble", "compact", "bootstrap", "prepare_subagent", "merge_subagent",
         "transform_tool_result", "on_event"}
MEMORY = {"memory_add", "memory_put", "memory_get", "memory_list", "memory_update", "memory_delete",
          "memory_delete_scope"}
READS = {"plugins", "doctor"}


@pytest.fixture
def prefix(settings):
    settings.LIBREFANG_REDIS_PREFIX = name = f"lfmcp-{uuid.uuid4().hex[:8]}"
    r = bus.client()
    yield name
    for key in r.scan_iter(match=name + ":*"):
        r.delete(key)


@pytest.fixture
def echo_tool(home):
    wasm = fixture_wasm("echo")
    T.install(home, T.package(tool_manifest("echo", wasm), wasm))
    return "echo"


@pytest.mark.parametrize(("role", "expected"), [
    ("agent", HOOKS | MEMORY | {"echo"}), ("owner", HOOKS | MEMORY | READS | {"echo"}),
    ("admin", HOOKS | MEMORY | READS),
    ("viewer", READS)])
async def test_it_lists_only_the_tools_a_role_may_call(home, echo_tool, role, expected):
    assert {t.name for t in await mcp_tools.available(role)} == expected


async def test_it_gives_a_wasm_tool_named_like_a_builtin_a_prefix(home):
    wasm = fixture_wasm("echo")
    T.install(home, T.package(tool_manifest("recall", wasm), wasm))
    names = [t.name for t in await mcp_tools.available("agent")]
    assert names.count("recall") == 1 and "wasm_recall" in names


async def test_it_leaves_a_disabled_tool_out_and_changes_the_listing_stamp(home, echo_tool):
    before = mcp_tools.listing_stamp()
    T.set_enabled(home, "echo", False)
    assert mcp_tools.listing_stamp() != before
    assert "echo" not in {t.name for t in await mcp_tools.available("agent")}


@pytest.fixture
def agent_token(db):
    from plugins_app.models import ApiToken

    return ApiToken(name="mcp-agent", role="agent")  # unbound: every agent


async def call(name: str, args: dict, token):
    tool = await mcp_tools.find(name)
    return await tool.run(args, token)


async def test_it_answers_remember_with_a_retryable_tool_error_when_redis_is_down(prefix, settings, home,
                                                                                  agent_token):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    with pytest.raises(mcp_tools.McpToolError) as refused:
        await call("remember", {"agent_id": "a", "messages": [{"role": "user", "content": "hi"}]}, agent_token)
    error = refused.value.body["error"]
    assert error["code"] == "bus_unavailable" and error["details"]["http_status"] == 503
    assert error["details"]["retry_after_secs"] > 0


async def test_it_refuses_arguments_the_rest_route_would_refuse(home, agent_token):
    with pytest.raises(mcp_tools.McpToolError) as refused:
        await call("remember", {"agent_id": "a"}, agent_token)  # no messages
    error = refused.value.body["error"]
    assert error["code"] == "validation_error" and error["details"] == [
        {"loc": ["messages"], "msg": "Field required", "type": "missing"}]


@pytest.mark.django_db(transaction=True)
def test_it_details_a_refused_memory_exactly_as_rest_does(home, client):
    from asgiref.sync import async_to_sync

    token, raw = create_token("both-ways", "agent")
    bad = {"agent_id": "a", "content": "", "tags": "not-a-list", "expires_at": "soon"}
    with pytest.raises(mcp_tools.McpToolError) as refused:
        async_to_sync(call)("memory_add", bad, token)
    rest = client.post("/api/memories", data=bad, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {raw}").json()["error"]
    assert rest["code"] == refused.value.body["error"]["code"] == "validation_error"
    assert len(rest["details"]) >= 2 and rest["details"] == refused.value.body["error"]["details"]


async def test_it_refuses_recall_in_the_tools_own_terms(home, agent_token):
    # recall takes `query` (ingest's `message`): a missing query is named as such, as a structured detail
    with pytest.raises(mcp_tools.McpToolError) as refused:
        await call("recall", {}, agent_token)
    error = refused.value.body["error"]
    assert error["code"] == "validation_error"
    assert {tuple(d["loc"]) for d in error["details"]} == {("agent_id",), ("query",)}
    assert all(set(d) == {"loc", "msg", "type"} for d in error["details"])


async def test_it_gives_every_tool_an_exact_input_and_an_output_schema(home):
    import jsonschema

    for tool in await mcp_tools.available("owner"):
        assert tool.input_schema["type"] == "object", tool.name
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
        jsonschema.validators.validator_for(tool.input_schema).check_schema(tool.input_schema)
        jsonschema.validators.validator_for(tool.output_schema).check_schema(tool.output_schema)
    by_name = {t.name: t for t in await mcp_tools.available("owner")}
    assert set(by_name["recall"].input_schema["required"]) == {"agent_id", "query"}
    assert by_name["recall"].input_schema["properties"].keys() >= {"agent_id", "query", "peer_id", "session_id"}
    # the hook tools' schemas are the REST routes' request models, messages in any dialect
    assemble = by_name["assemble"].input_schema
    assert {d.get("$ref", "").rsplit("/", 1)[-1] for d in assemble["properties"]["messages"]["items"]["anyOf"]} == {
        "LibreFangMessage", "OpenAIChatMessage", "OpenAIResponsesItem", "AnthropicMessage"}


def test_it_queues_jobs_with_the_mcp_origin_signed(prefix):
    token = bus.JOB_ORIGIN.set("mcp")
    try:
        _, fields = bus.job_fields("hook", "ingest", {"agent_id": "a"}, 5, True)
    finally:
        bus.JOB_ORIGIN.reset(token)
    job = bus.parse_job("1-0", fields)
    assert job.signed and job.origin == "mcp"
    _, plain = bus.job_fields("hook", "ingest", {"agent_id": "a"}, 5, True)
    assert "origin" not in plain and bus.parse_job("1-1", plain).origin == ""


@pytest.mark.django_db(transaction=True)
def test_it_traces_an_mcp_job_as_mcp_and_counts_it_with_agent_calls(home, prefix):
    from plugins_app.services.engine import invocation_sink

    make_plugin(home.plugins_dir, "recaller", {"ingest": RECALL})
    write_config(home.root, plugin="recaller")
    stream = bus.JobStream(consumer=f"test-{uuid.uuid4().hex[:6]}")
    stream.ensure_group()
    for origin in ("mcp", ""):
        job = bus.Job(id=uuid.uuid4().hex, entry_id="0-1", kind="hook", hook="ingest",
                      request={"agent_id": "a", "message": "kafka"}, deadline=time.time() + 60, wants_reply=True,
                      origin=origin)
        assert jobs.process(job, stream) == JobRecord.State.DONE
    invocation_sink().flush()
    assert sorted(HookTrace.objects.filter(plugin="recaller").values_list("origin", flat=True)) == ["agent", "mcp"]
    metric = HookMetric.objects.get(plugin="recaller", hook="ingest")
    assert metric.calls == 2 and metric.console_calls == 0
    # the traces resource shows the origin
    mime, text = resources.read("librefang://plugins/recaller/traces")
    assert mime == "application/json"
    assert sorted(t["origin"] for t in json.loads(text)["traces"]) == ["agent", "mcp"]
    assert resources.read("librefang://plugins/nope/manifest") is None


@pytest.mark.django_db(transaction=True)
def test_it_marks_every_layer_of_a_stack_run_concurrently_as_mcp(home, prefix):
    from plugins_app.services.engine import invocation_sink

    for name in ("layer-a", "layer-b"):
        make_plugin(home.plugins_dir, name, {"ingest": RECALL})
    write_config(home.root, stack=["layer-a", "layer-b"])
    stream = bus.JobStream(consumer=f"test-{uuid.uuid4().hex[:6]}")
    stream.ensure_group()
    job = bus.Job(id=uuid.uuid4().hex, entry_id="0-1", kind="hook", hook="ingest",
                  request={"agent_id": "a", "message": "kafka"}, deadline=time.time() + 60, wants_reply=True,
                  origin="mcp")
    assert jobs.process(job, stream) == JobRecord.State.DONE
    invocation_sink().flush()
    traces = HookTrace.objects.filter(job_id=job.id)
    assert sorted(traces.values_list("plugin", "origin")) == [("layer-a", "mcp"), ("layer-b", "mcp")]


@pytest.mark.django_db(transaction=True)
def test_it_resolves_a_token_and_its_role(home):
    from asgiref.sync import async_to_sync

    _, raw = create_token("mcp-viewer", "viewer")
    found = async_to_sync(tokens.resolve)(raw)
    assert found is not None and found.role == "viewer"
    assert async_to_sync(tokens.resolve)("lf_unknown") is None and async_to_sync(tokens.resolve)("") is None
    assert headers_bearer([(b"authorization", f"Bearer {raw}".encode())]) == raw
    assert headers_bearer({"Authorization": "Basic abc"}) == ""
