"""The typed contract of /api/openapi.json: a valid OpenAPI document (openapi-spec-validator), one named reply model
per hook, the hook requests and memory bodies as named components, Retry-After declared, every route with a body
describing it. tests/e2e/test_agents_e2e.py generates a client from it and makes typed calls."""

from __future__ import annotations

import json

import pytest
from openapi_spec_validator import validate

from engine.hooks import ALL_HOOKS


@pytest.fixture(scope="module")
def spec():
    """The document as served (JSON: status codes are strings)."""
    from plugins_app.api import api

    return json.loads(json.dumps(api.get_openapi_schema()))


def test_it_is_a_valid_openapi_document(spec):
    validate(spec)


def test_it_names_each_hooks_request_and_reply(spec):
    components = spec["components"]["schemas"]
    replies = set()
    for hook in ALL_HOOKS:
        op = spec["paths"][f"/api/context-engine/hooks/{hook}"]["post"]
        body = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        assert body in components, hook
        ok = op["responses"]["202" if hook in ("after_turn", "on_event") else "200"]
        reply = ok["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        assert reply in components, hook
        replies.add(reply)
    assert len(replies) == len(ALL_HOOKS)  # one model per hook
    assert set(components["IngestReply"]["properties"]) >= {"memories", "source", "fallback_reason"}
    assert set(components["RecalledMemory"]["properties"]) >= {"id", "key", "score", "created_at", "updated_at"}
    assert set(components["CompactReply"]["properties"]) >= {"messages", "summary"}
    messages = components["AssembleRequest"]["properties"]["messages"]["items"]["anyOf"]
    assert {m["$ref"].rsplit("/", 1)[-1] for m in messages} == {"LibreFangMessage", "OpenAIChatMessage",
                                                                 "OpenAIResponsesItem", "AnthropicMessage"}


def test_it_declares_retry_after_and_every_body(spec):
    for hook in ("after_turn", "on_event"):
        unavailable = spec["paths"][f"/api/context-engine/hooks/{hook}"]["post"]["responses"]["503"]
        assert unavailable["headers"]["Retry-After"]["schema"]["type"] == "integer"
    execute = spec["paths"]["/api/tools/{tool_id}/execute"]["post"]
    assert execute["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ToolExecuteIn")
    for path, method in (("/api/memories", "post"), ("/api/memories", "put"), ("/api/memories/{memory_id}", "patch"),
                         ("/api/tokens", "post")):
        ref = spec["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[-1] in spec["components"]["schemas"], (path, method)


def test_it_serialises_each_status_code_once():
    # django-ninja keys statuses by int, a route's openapi_extra by string: served as JSON, both were "503" (or
    # "200"), a document Swagger UI refuses. json.loads would keep only the last, so look at the pairs themselves.
    from plugins_app.api import api

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
        return dict(pairs)

    spec = json.loads(json.dumps(api.get_openapi_schema()), object_pairs_hook=no_duplicates)
    after_turn = spec["paths"]["/api/context-engine/hooks/after_turn"]["post"]["responses"]["503"]
    assert "Retry-After" in after_turn["headers"] and "content" in after_turn  # both entries' fields kept
    prometheus = spec["paths"]["/api/context-engine/metrics/prometheus"]["get"]["responses"]["200"]
    assert "Prometheus" in prometheus["description"]
