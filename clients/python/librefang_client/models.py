"""Typed models of the service's contract: each hook's request and reply, the messages of the four dialects and the
memory API's bodies, named as in the service's `/api/openapi.json` (`components/schemas`).

They mirror the service's own models field for field (a test in the service's repository compares them with the
document). Every reply model accepts fields it does not know, so a newer service never breaks an older client;
request models validate what is sent before it leaves the process.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Dialect = Literal["librefang", "openai", "openai_responses", "anthropic"]
Content = str | list[dict[str, Any]]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---- messages, in each dialect the service accepts ----

class LibreFangMessage(_Open):
    """LibreFang's message: what plugins receive."""

    role: Literal["system", "user", "assistant"]
    content: Content
    pinned: bool = False


class OpenAIFunctionCall(_Open):
    name: str
    arguments: str


class OpenAIToolCall(_Open):
    id: str
    type: str = "function"
    function: OpenAIFunctionCall


class OpenAIChatMessage(_Open):
    """An OpenAI Chat Completions message."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[OpenAIToolCall] | None = None
    tool_call_id: str | None = None
    pinned: bool = False


class OpenAIResponsesItem(_Open):
    """An OpenAI Responses input item (a message, a function_call, a function_call_output, ...)."""

    type: str | None = None
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: Content | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: Content | None = None
    pinned: bool = False


class AnthropicMessage(_Open):
    """An Anthropic Messages message (the system prompt is the request's `system`)."""

    role: Literal["user", "assistant"]
    content: Content
    pinned: bool = False


AgentMessage = LibreFangMessage | OpenAIChatMessage | OpenAIResponsesItem | AnthropicMessage
Id = Annotated[str, Field(max_length=200)]


# ---- hook requests ----

class IngestRequest(_Open):
    agent_id: Id
    message: str
    peer_id: Id | None = None
    session_id: Id | None = None


class _Conversation(_Open):
    dialect: Dialect | None = None
    system: str | list[dict[str, Any]] | None = None


class _Window(_Conversation):
    agent_id: Id = ""
    messages: list[AgentMessage]
    context_window_tokens: int = Field(200_000, gt=0)


class AssembleRequest(_Window):
    system_prompt: str = ""


class CompactRequest(_Window):
    model: str = ""


class AfterTurnRequest(_Conversation):
    agent_id: Id
    peer_id: Id | None = None
    session_id: Id | None = None
    messages: list[AgentMessage]


class BootstrapRequest(_Open):
    context_window_tokens: int = Field(200_000, gt=0)
    stable_prefix_mode: bool = False
    max_recall_results: int = Field(5, ge=0)


class SubagentRequest(_Conversation):
    parent_id: Id
    child_id: Id
    messages: list[AgentMessage] | None = None


class TransformToolResultRequest(_Open):
    agent_id: Id = ""
    tool_name: str
    tool_use_id: str = ""
    input: dict[str, Any] | None = None
    args: dict[str, Any] | None = None
    content: str | None = None
    result: str | None = None
    is_error: bool = False
    status: str | None = None


class OnEventRequest(_Open):
    event: dict[str, Any]


# ---- hook replies ----

class HookReply(_Open):
    """The chain's answer after stack and fallback: `source` names the plugin(s), or `default` (the built-in
    engine, with `fallback_reason` when it stood in for a plugin)."""

    type: str
    source: str
    fallback_reason: str | None = None
    trace_ids: list[str] | None = None
    warnings: list[str] | None = None
    elapsed_ms: float | None = None


class _MessagesReply(HookReply):
    messages: list[AgentMessage]
    dialect: Dialect | None = None
    system: str | None = None


class RecalledMemory(_Open):
    content: str
    scope: str | None = None
    source: str | None = None
    id: int | None = None
    key: str | None = None
    score: float | None = None
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None
    created_at: str | None = None
    updated_at: str | None = None


class IngestReply(HookReply):
    memories: list[RecalledMemory]


class AssembleReply(_MessagesReply):
    recovery_stage: str | None = None


class CompactReply(_MessagesReply):
    summary: str | None = None
    compacted_count: int | None = None
    used_fallback: bool | None = None


class BootstrapReply(HookReply):
    pass


class PrepareSubagentReply(HookReply):
    messages: list[AgentMessage] | None = None
    dialect: Dialect | None = None


class MergeSubagentReply(PrepareSubagentReply):
    pass


class TransformToolResultReply(HookReply):
    content: str | None = None
    result: str | None = None


class _Accepted(_Open):
    accepted: bool
    job_id: str
    hook: str


class AfterTurnAccepted(_Accepted):
    """after_turn's job is stored: a worker processes it at least once."""


class OnEventAccepted(_Accepted):
    pass


# ---- the memory API ----

ScopeId = Annotated[str, Field(min_length=1, max_length=200)]
MemoryKey = Annotated[str, Field(min_length=1, max_length=200)]
MemoryContent = Annotated[str, Field(min_length=1, max_length=20_000)]
Tag = Annotated[str, Field(min_length=1, max_length=64)]
Metadata = dict[Annotated[str, Field(max_length=64)], Any]


class MemoryIn(BaseModel):
    """A new memory; its scope is the agent, and the peer and session when given."""

    model_config = ConfigDict(extra="forbid")
    agent_id: ScopeId
    peer_id: ScopeId | None = None
    session_id: ScopeId | None = None
    key: MemoryKey | None = None
    content: MemoryContent
    tags: list[Tag] = Field(default_factory=list, max_length=16)
    metadata: Metadata = Field(default_factory=dict)
    expires_at: datetime | None = None


class MemoryPutIn(MemoryIn):
    """Put by key: replaces the memory with this key in this scope, or makes it."""

    key: MemoryKey


class MemoryPatchIn(BaseModel):
    """The fields given replace the memory's (`metadata` and `tags` whole)."""

    model_config = ConfigDict(extra="forbid")
    content: MemoryContent | None = None
    tags: list[Tag] | None = Field(None, max_length=16)
    metadata: Metadata | None = None
    expires_at: datetime | None = None


class MemoryOut(_Open):
    id: int
    agent_id: str
    peer_id: str | None
    session_id: str | None
    key: str | None
    content: str
    scope: str
    tags: list[str]
    metadata: dict[str, Any]
    source: str
    created_at: str
    updated_at: str
    expires_at: str | None
    score: float | None = None
    scores: dict[str, float | None] | None = None  # with a search: vector, text and fused, each 0..1


class MemoryListOut(_Open):
    items: list[MemoryOut]
    total: int
    offset: int
    limit: int
    query: str | None
    next_cursor: str | None
    recall: dict[str, str | None] | None = None  # with a search: mode (hybrid or text) and fallback (why)


class MemoryDeleteOut(_Open):
    deleted: int
    agent_id: str
    id: int | None = None
    peer_id: str | None = None
    session_id: str | None = None


class MemoryScopeOut(_Open):
    peer_id: str | None
    session_id: str | None
    count: int


class MemoryScopesOut(_Open):
    agent_id: str
    scopes: list[MemoryScopeOut]


# ---- errors ----

class ErrorBody(_Open):
    code: str
    message: str
    details: Any | None = None


class ErrorEnvelope(_Open):
    error: ErrorBody


HOOK_REQUESTS: dict[str, type[BaseModel]] = {
    "ingest": IngestRequest, "assemble": AssembleRequest, "compact": CompactRequest,
    "after_turn": AfterTurnRequest, "bootstrap": BootstrapRequest, "prepare_subagent": SubagentRequest,
    "merge_subagent": SubagentRequest, "transform_tool_result": TransformToolResultRequest,
    "on_event": OnEventRequest,
}
HOOK_REPLIES: dict[str, type[BaseModel]] = {
    "ingest": IngestReply, "assemble": AssembleReply, "compact": CompactReply, "after_turn": AfterTurnAccepted,
    "bootstrap": BootstrapReply, "prepare_subagent": PrepareSubagentReply, "merge_subagent": MergeSubagentReply,
    "transform_tool_result": TransformToolResultReply, "on_event": OnEventAccepted,
}
