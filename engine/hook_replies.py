"""What an agent gets back from each hook: one pydantic model per hook, published in OpenAPI (plugins_app/api/
context_engine.py) and as the MCP tools' output schemas (plugins_app/mcp/tools.py).

An answer is the chain's result after stack and fallback (engine/stack.py, engine/default_engine.py) plus where it
came from. Plugins may add fields of their own: every model allows them. Messages come back in the dialect the
agent sent (engine/dialects.py), with `dialect` saying which when it was not LibreFang's.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine import dialects
from engine import hooks as H


class HookReplyBase(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = Field(description="the result's kind, e.g. ingest_result (not checked: plugins may omit it)")
    source: str = Field(description="the plugin(s) whose answer this is, or `default` (the built-in engine)")
    fallback_reason: str | None = Field(None, description="why the built-in engine answered, when it did")
    trace_ids: list[str] | None = None
    warnings: list[str] | None = Field(None, description="e.g. a pinned message a plugin dropped, put back")
    elapsed_ms: float | None = Field(None, description="when the web tier answered itself (no worker in time)")


class _Messages(HookReplyBase):
    messages: list[dialects.AgentMessage] = Field(description="in the dialect the agent sent")
    dialect: dialects.Dialect | None = Field(None, description="the messages' dialect, when not LibreFang's")
    system: str | None = Field(None, description="Anthropic dialect: system text a plugin added")


class RecalledMemory(BaseModel):
    """A memory ingest recalled. The built-in store's carry their id (for GET/PATCH/DELETE /api/memories/{id}),
    key, score and times; a plugin's carry what the plugin gave."""

    model_config = ConfigDict(extra="allow")
    content: str
    scope: str | None = Field(None, description="`default_recall` (the built-in store) or `hook` (a plugin)")
    source: str | None = None
    id: int | None = None
    key: str | None = None
    score: float | None = Field(None, description="relevance, 0..1")
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None
    created_at: str | None = None
    updated_at: str | None = None


class IngestReply(HookReplyBase):
    memories: list[RecalledMemory]


class AssembleReply(_Messages):
    recovery_stage: str | None = Field(None, description="which step of the overflow cascade trimmed the window")


class CompactReply(_Messages):
    summary: str | None = None
    compacted_count: int | None = None
    used_fallback: bool | None = Field(None, description="true: an extractive summary (no LLM answered)")


class BootstrapReply(HookReplyBase):
    pass


class PrepareSubagentReply(HookReplyBase):
    messages: list[dialects.AgentMessage] | None = None
    dialect: dialects.Dialect | None = None


class MergeSubagentReply(PrepareSubagentReply):
    pass


class TransformToolResultReply(HookReplyBase):
    content: str | None = Field(None, description="the tool result to use (unchanged when no plugin rewrote it)")
    result: str | None = Field(None, description="the same, under the docs' name")


class Accepted(BaseModel):
    """A fire-and-forget hook's job is stored: a worker processes it at least once."""

    accepted: bool
    job_id: str
    hook: str


class AfterTurnAccepted(Accepted):
    pass


class OnEventAccepted(Accepted):
    pass


HOOK_REPLY_MODELS: dict[str, type[BaseModel]] = {
    H.INGEST: IngestReply,
    H.ASSEMBLE: AssembleReply,
    H.COMPACT: CompactReply,
    H.AFTER_TURN: AfterTurnAccepted,
    H.BOOTSTRAP: BootstrapReply,
    H.PREPARE_SUBAGENT: PrepareSubagentReply,
    H.MERGE_SUBAGENT: MergeSubagentReply,
    H.TRANSFORM_TOOL_RESULT: TransformToolResultReply,
    H.ON_EVENT: OnEventAccepted,
}
