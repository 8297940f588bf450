"""The default engine's memory store over HTTP: what agents remember, scoped by agent and peer.

Roles: agents write and read memories (the store is theirs: the default engine writes every turn into it, and ingest
reads it back) and may forget one memory; wiping an agent's memories is an operator's act (admin). Viewers do not
read memories: they are the users' conversations.
"""

from __future__ import annotations

from ninja import Path, Query, Router, Schema
from pydantic import Field

from plugins_app.api.errors import ApiError, json_response
from plugins_app.api.security import ADMIN, AGENT, actor
from plugins_app.schemas import ErrorEnvelope, MemoryDeleteOut, MemoryIn, MemoryListOut, MemoryOut
from plugins_app.services import memory as memory_service

router = Router(tags=["memories"])
E = {400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope, 404: ErrorEnvelope}


class MemoryQuery(Schema):
    agent_id: str = Field(min_length=1, max_length=200)
    peer_id: str | None = Field(None, max_length=200)
    q: str | None = Field(None, max_length=2000, description="search words; results ranked best first, with a score")
    offset: int = Field(0, ge=0)
    limit: int = Field(50, ge=1, le=200)


class AgentScope(Schema):
    agent_id: str = Field(min_length=1, max_length=200)
    peer_id: str | None = Field(None, max_length=200, description="only this peer's memories")


@router.post("", auth=AGENT, response={201: MemoryOut, **E}, operation_id="memories_create")
def create(request, body: MemoryIn):
    """Remember something for an agent (and optionally one peer); ingest recalls it when relevant."""
    return json_response(memory_service.create_memory(body.agent_id, body.peer_id, body.content, body.tags,
                                                      actor(request)), 201)


@router.get("", auth=AGENT, response={200: MemoryListOut, **E}, operation_id="memories_list")
def list_memories(request, query: Query[MemoryQuery]):
    """The memories an agent recalls for a peer (that peer's and the agent's peer-less ones), newest first; with
    `q`, the full-text search ranked by relevance (0..1)."""
    return json_response(memory_service.list_memories(query.agent_id, query.peer_id, query.q, query.offset,
                                                      query.limit))


@router.delete("", auth=ADMIN, response={200: MemoryDeleteOut, **E}, operation_id="memories_delete_agent")
def delete_agent(request, query: Query[AgentScope]):
    """Forget everything an agent remembers (or only what it remembers about one peer)."""
    return json_response(memory_service.delete_agent_memories(query.agent_id, query.peer_id, actor(request)))


@router.delete("/{memory_id}", auth=AGENT, response={200: MemoryDeleteOut, **E}, operation_id="memories_delete")
def delete(request, memory_id: int = Path(..., ge=1)):
    result = memory_service.delete_memory(memory_id, actor(request))
    if result is None:
        raise ApiError(404, "not_found", f"memory {memory_id} does not exist")
    return json_response(result)
