"""The default engine's memory store over HTTP: what agents remember, scoped by agent, peer and session.

Roles: agent, admin and owner tokens (the store is the agents': the default engine writes every turn into it, and
ingest reads it back); viewers do not read memories, they are the users' conversations. A token bound to agents
(plugins_app/auth.py) reaches only its agents' memories: naming another agent is a 403, another agent's memory by
id is a 404, as if it did not exist. An agent may delete a whole scope of its own memories.

Reads: plugins_app/selectors/memories.py; writes: plugins_app/services/memory.py.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from ninja import Path, Query, Schema
from pydantic import Field

from plugins_app.api.contract import body_of
from plugins_app.api.errors import ApiError, json_body, json_response
from plugins_app.api.security import ActionRouter, actor
from plugins_app.auth import check_agents
from plugins_app.schemas import (
    ErrorEnvelope,
    MemoryDeleteOut,
    MemoryIn,
    MemoryListOut,
    MemoryOut,
    MemoryPatchIn,
    MemoryPutIn,
    MemoryScopesOut,
)
from plugins_app.selectors import memories as memory_selectors
from plugins_app.selectors import recall as recall_selectors
from plugins_app.services import memory as memory_service

router = ActionRouter(tags=["memories"], action="memories_manage")
E = {400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope, 404: ErrorEnvelope}
MEMORY_ID = Path(..., ge=1, le=2**63 - 1)
MAX_OFFSET = 1_000_000


class ScopeQuery(Schema):
    agent_id: str = Field(min_length=1, max_length=200)
    peer_id: str | None = Field(None, max_length=200)
    session_id: str | None = Field(None, max_length=200)


class MemoryQuery(ScopeQuery):
    peer_id: str | None = Field(None, max_length=200, description="that peer's memories and (include_shared) the "
                                                                 "agent's peer-less ones; absent: every peer's")
    session_id: str | None = Field(None, max_length=200, description="that session's memories and "
                                                                    "(include_shared) the session-less ones; absent: "
                                                                    "every session's")
    include_shared: bool = Field(True, description="false: only the peer's and session's own memories")
    key: str | None = Field(None, max_length=200)
    tags: list[str] = Field(default_factory=list, max_length=16, description="memories carrying every one of them")
    metadata: str | None = Field(None, max_length=4000, description='a JSON object, e.g. {"kind": "preference"}: '
                                                                    "memories whose metadata has these top-level "
                                                                    "values")
    q: str | None = Field(None, max_length=2000, description="search words; results ranked best first, with a score")
    order: Literal["newest", "oldest"] = "newest"
    cursor: str | None = Field(None, max_length=200, description="the `next_cursor` of the previous page")
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    limit: int = Field(50, ge=1, le=200)


def _metadata_filter(raw: str | None) -> tuple[tuple[str, Any], ...]:
    if not raw:
        return ()
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, "validation_error", f"metadata is not JSON: {exc}", {"loc": ["query", "metadata"]}) \
            from exc
    return memory_selectors.metadata_filter(value)


def _refuse_unknown_query(request, allowed: set[str]) -> None:
    unknown = sorted(set(request.GET) - allowed)
    if unknown:
        raise ApiError(400, "validation_error", f"unknown query parameters: {', '.join(unknown)}",
                       {"unknown": unknown, "allowed": sorted(allowed)})


@router.post("", response={201: MemoryOut, 409: ErrorEnvelope, **E}, operation_id="memories_create",
             openapi_extra=body_of(MemoryIn))
def create(request):
    """Remember something for an agent (and optionally one peer and session); ingest recalls it when relevant.
    A `key` already used in the scope is a 409 (PUT replaces)."""
    body = json_body(request, MemoryIn)
    check_agents(request.auth, [body.agent_id])
    return json_response(memory_service.create_memory(body.model_dump(), actor(request)), 201)


@router.put("", response={200: MemoryOut, 201: MemoryOut, **E}, operation_id="memories_put",
            openapi_extra=body_of(MemoryPutIn))
def put(request):
    """Put by key: the memory with this `key` in this scope (agent, peer, session) is replaced, or made (201)."""
    body = json_body(request, MemoryPutIn)
    check_agents(request.auth, [body.agent_id])
    memory, created = memory_service.put_memory(body.model_dump(), actor(request))
    return json_response(memory, 201 if created else 200)


@router.get("", response={200: MemoryListOut, **E}, operation_id="memories_list")
def list_memories(request, query: Query[MemoryQuery]):
    """The memories an agent recalls for a peer and session, newest (or oldest) first, a page at a time
    (`next_cursor`); with `q`, recall by meaning and full text (fused, 0..1). Filters: key, tags, metadata."""
    _refuse_unknown_query(request, set(MemoryQuery.model_fields))
    check_agents(request.auth, [query.agent_id])
    if query.cursor and query.offset:
        raise ApiError(400, "validation_error", "use cursor or offset, not both")
    f = memory_selectors.MemoryFilter(query.agent_id, query.peer_id or None, query.session_id or None,
                                      query.include_shared, query.key, tuple(query.tags),
                                      _metadata_filter(query.metadata))
    try:
        page = recall_selectors.list_memories(f, query.q, query.limit, query.offset, query.cursor,
                                              oldest_first=query.order == "oldest")
    except ValueError as exc:
        raise ApiError(400, "invalid_cursor", str(exc)) from exc
    return json_response(page)


@router.delete("", response={200: MemoryDeleteOut, **E}, operation_id="memories_delete_agent")
def delete_scope(request, query: Query[ScopeQuery]):
    """Forget everything an agent remembers, or only what it remembers about one peer and/or in one session. An
    agent token may do this for its own agents."""
    check_agents(request.auth, [query.agent_id])
    return json_response(memory_service.delete_scope(query.agent_id, query.peer_id, query.session_id,
                                                     actor(request)))


@router.get("/scopes", response={200: MemoryScopesOut, **E}, operation_id="memories_scopes")
def scopes(request, agent_id: str = Query(..., min_length=1, max_length=200)):
    """The peers and sessions an agent has memories for, with how many in each."""
    check_agents(request.auth, [agent_id])
    return json_response({"agent_id": agent_id, "scopes": memory_selectors.scopes(agent_id)})


@router.get("/{memory_id}", response={200: MemoryOut, **E}, operation_id="memories_get")
def get(request, memory_id: int = MEMORY_ID):
    return json_response(memory_selectors.to_dict(memory_selectors.visible_memory(request.auth, memory_id)))


@router.patch("/{memory_id}", response={200: MemoryOut, **E}, operation_id="memories_update",
              openapi_extra=body_of(MemoryPatchIn))
def update(request, memory_id: int = MEMORY_ID):
    """Change a memory's content, tags, metadata or expiry (the fields given replace the memory's)."""
    m = memory_selectors.visible_memory(request.auth, memory_id)
    body = json_body(request, MemoryPatchIn)
    changes = body.model_dump(exclude_unset=True)
    if any(changes.get(k, "") is None for k in ("content", "tags", "metadata")):
        raise ApiError(400, "validation_error", "content, tags and metadata cannot be null")
    return json_response(memory_service.update_memory(m, changes))


@router.delete("/{memory_id}", response={200: MemoryDeleteOut, **E}, operation_id="memories_delete")
def delete(request, memory_id: int = MEMORY_ID):
    return json_response(memory_service.delete_memory(memory_selectors.visible_memory(request.auth, memory_id), actor(request)))
