"""The memory API as MCP tools: the same checks, models and code as /api/memories (plugins_app/api/memories.py):
reads through plugins_app/selectors/memories.py, writes through plugins_app/services/memory.py, a token bound to
agents only for its agents (another agent's memory by id: not_found)."""

from __future__ import annotations

from typing import Any, Literal

from asgiref.sync import sync_to_async
from pydantic import BaseModel, ConfigDict, Field

from engine.errors import ServiceError
from plugins_app.auth import check_agents
from plugins_app.mcp import tokens
from plugins_app.mcp.tool_base import McpToolError, ToolDef, checked, schema_of
from plugins_app.models import ApiToken
from plugins_app.schemas import (
    MemoryDeleteOut,
    MemoryIn,
    MemoryListOut,
    MemoryOut,
    MemoryPatchIn,
    MemoryPutIn,
    Tags,
)
from plugins_app.selectors import memories as memory_selectors
from plugins_app.selectors import recall as recall_selectors
from plugins_app.services import memory as memory_service


def actor(token: ApiToken) -> str:
    """Who the audit trail says did it (as over REST: plugins_app/api/security.py `actor`)."""
    return f"token:{token.name}"


class MemoryListArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", title="MemoryListArgs")
    agent_id: str = Field(min_length=1, max_length=200)
    peer_id: str | None = Field(None, max_length=200)
    session_id: str | None = Field(None, max_length=200)
    include_shared: bool = Field(True, description="false: only the peer's and session's own memories")
    key: str | None = Field(None, max_length=200)
    tags: Tags = Field(default_factory=list, max_length=16)
    metadata: dict[str, str | int | float | bool | None] | None = Field(None, description="top-level metadata "
                                                                                         "values to match")
    query: str | None = Field(None, max_length=2000, description="what to recall: ranked by meaning and words, best first, with scores")
    order: Literal["newest", "oldest"] = "newest"
    cursor: str | None = Field(None, max_length=200)
    limit: int = Field(50, ge=1, le=200)


class MemoryIdArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", title="MemoryIdArgs")
    id: int = Field(ge=1, le=2**63 - 1)


class MemoryUpdateArgs(MemoryPatchIn):
    model_config = ConfigDict(extra="forbid", title="MemoryUpdateArgs")
    id: int = Field(ge=1, le=2**63 - 1)


class MemoryScopeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", title="MemoryScopeArgs")
    agent_id: str = Field(min_length=1, max_length=200)
    peer_id: str | None = Field(None, max_length=200, description="only this peer's memories")
    session_id: str | None = Field(None, max_length=200, description="only this session's memories")


class MemoryPutOut(MemoryOut):
    created: bool


def _sync(fn):
    """`fn(args, token)` on Django's thread, its refusals as tool errors."""
    async def run(args: dict[str, Any], token: ApiToken) -> dict[str, Any]:
        try:
            return await sync_to_async(fn)(args, token)
        except ServiceError as exc:
            raise McpToolError.of(exc) from exc
    return run


def add(args, token):
    body = checked(MemoryIn, "memory_add", args)
    check_agents(token, [body.agent_id])
    return memory_service.create_memory(body.model_dump(), actor(token))


def put(args, token):
    body = checked(MemoryPutIn, "memory_put", args)
    check_agents(token, [body.agent_id])
    memory, created = memory_service.put_memory(body.model_dump(), actor(token))
    return {**memory, "created": created}


def get(args, token):
    return memory_selectors.to_dict(memory_selectors.visible_memory(token, checked(MemoryIdArgs, "memory_get",
                                                                                   args).id))


def list_memories(args, token):
    a = checked(MemoryListArgs, "memory_list", args)
    check_agents(token, [a.agent_id])
    f = memory_selectors.MemoryFilter(a.agent_id, a.peer_id or None, a.session_id or None, a.include_shared, a.key,
                                      tuple(a.tags), memory_selectors.metadata_filter(a.metadata))
    try:
        return recall_selectors.list_memories(f, a.query, a.limit, cursor=a.cursor, oldest_first=a.order == "oldest")
    except ValueError as exc:
        raise ServiceError("invalid_cursor", str(exc), 400) from exc


def update(args, token):
    a = checked(MemoryUpdateArgs, "memory_update", args)
    m = memory_selectors.visible_memory(token, a.id)
    changes = a.model_dump(exclude_unset=True, exclude={"id"})
    if any(changes.get(k, "") is None for k in ("content", "tags", "metadata")):
        raise ServiceError("validation_error", "content, tags and metadata cannot be null", 400)
    return memory_service.update_memory(m, changes)


def delete(args, token):
    return memory_service.delete_memory(memory_selectors.visible_memory(token, checked(
        MemoryIdArgs, "memory_delete", args).id), actor(token))


def delete_scope(args, token):
    a = checked(MemoryScopeArgs, "memory_delete_scope", args)
    check_agents(token, [a.agent_id])
    return memory_service.delete_scope(a.agent_id, a.peer_id, a.session_id, actor(token))


def _tool(name: str, description: str, args: type[BaseModel], fn, out: type[BaseModel]) -> ToolDef:
    return ToolDef(name, description, schema_of(args), tokens.may_manage_memories, _sync(fn), schema_of(out))


MEMORY_TOOLS = [
    _tool("memory_add", "Remember something for an agent (and optionally one peer and session); a key already "
                        "used in that scope is refused (memory_put replaces).", MemoryIn, add, MemoryOut),
    _tool("memory_put", "Put by key: replace the memory with this key in this scope, or make it.", MemoryPutIn, put,
          MemoryPutOut),
    _tool("memory_get", "One memory by id.", MemoryIdArgs, get, MemoryOut),
    _tool("memory_list", "An agent's memories for a peer and session, newest first, a page at a time; with a query, "
                         "recalled by meaning and words (docs/recall.md). Filters: key, tags, metadata.",
          MemoryListArgs, list_memories, MemoryListOut),
    _tool("memory_update", "Change a memory's content, tags, metadata or expiry.", MemoryUpdateArgs, update,
          MemoryOut),
    _tool("memory_delete", "Forget one memory.", MemoryIdArgs, delete, MemoryDeleteOut),
    _tool("memory_delete_scope", "Forget everything an agent remembers, or only about one peer and/or in one "
                                 "session.", MemoryScopeArgs, delete_scope, MemoryDeleteOut),
]
