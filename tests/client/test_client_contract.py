"""The client's models (clients/python/librefang_client/models.py) agree with /api/openapi.json: for every named
component the hook and memory routes use, the same field names, types and required fields; and each hook's request
and reply is the model the client sends and reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from librefang_client import models as client_models
from pydantic.json_schema import models_json_schema

from engine.hooks import ALL_HOOKS

REF = "#/components/schemas/{model}"


@pytest.fixture(scope="module")
def spec():
    from plugins_app.api import api

    return json.loads(json.dumps(api.get_openapi_schema()))


def refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            found |= {value.rsplit("/", 1)[-1]} if key == "$ref" else refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def agent_components(spec) -> set[str]:
    """The components the hook and memory routes use, and the ones those use."""
    todo = set()
    for path, ops in spec["paths"].items():
        if "/context-engine/hooks/" in path or path.startswith("/api/memories"):
            todo |= refs(ops)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo |= refs(spec["components"]["schemas"][name])
    return seen


def shape(schema: dict[str, Any]) -> Any:
    """A property's type, without titles, descriptions, defaults or bounds."""
    if "$ref" in schema:
        return ("ref", schema["$ref"].rsplit("/", 1)[-1])
    if "anyOf" in schema:
        return ("anyOf", frozenset(shape(s) for s in schema["anyOf"]))
    if "enum" in schema:
        return ("enum", frozenset(schema["enum"]))
    kind = schema.get("type")
    if kind == "array":
        return ("array", shape(schema.get("items", {})))
    if kind == "object":
        return ("object",)
    return (kind or "any", schema.get("format"))


def fields(schema: dict[str, Any]) -> dict[str, Any]:
    return {"properties": {name: shape(p) for name, p in schema.get("properties", {}).items()},
            "required": sorted(schema.get("required", []))}


@pytest.fixture(scope="module")
def client_schemas(spec):
    names = agent_components(spec)
    missing = sorted(n for n in names if not hasattr(client_models, n))
    assert not missing, f"no client model for {missing}"
    _, top = models_json_schema([(getattr(client_models, n), "validation") for n in sorted(names)],
                                ref_template=REF)
    return top["$defs"]


def test_it_has_a_client_model_for_every_component_agents_use(spec, client_schemas):
    names = agent_components(spec)
    assert {"IngestRequest", "AfterTurnAccepted", "MemoryIn", "MemoryListOut", "ErrorEnvelope",
            "OpenAIChatMessage"} <= names
    assert names <= set(client_schemas)


def test_it_agrees_on_each_components_fields_types_and_required(spec, client_schemas):
    disagree = {}
    for name in sorted(agent_components(spec)):
        server, client = fields(spec["components"]["schemas"][name]), fields(client_schemas[name])
        if server != client:
            disagree[name] = {"server": server, "client": client}
    assert not disagree, json.dumps(disagree, indent=1, default=sorted)[:4000]


def test_it_sends_and_reads_each_hooks_own_models(spec):
    for hook in ALL_HOOKS:
        op = spec["paths"][f"/api/context-engine/hooks/{hook}"]["post"]
        request = refs(op["requestBody"])
        reply = refs(op["responses"]["202" if hook in ("after_turn", "on_event") else "200"])
        assert request == {client_models.HOOK_REQUESTS[hook].__name__}, hook
        assert reply == {client_models.HOOK_REPLIES[hook].__name__}, hook


def test_it_notices_a_field_that_differs(spec, client_schemas):
    """The comparison itself: a renamed field and a changed type are both differences."""
    server = fields(spec["components"]["schemas"]["MemoryOut"])
    renamed = dict(client_schemas["MemoryOut"], properties={
        ("text" if k == "content" else k): v for k, v in client_schemas["MemoryOut"]["properties"].items()})
    retyped = dict(client_schemas["MemoryOut"], properties={
        **client_schemas["MemoryOut"]["properties"], "id": {"type": "string"}})
    assert fields(client_schemas["MemoryOut"]) == server
    assert fields(renamed) != server and fields(retyped) != server
