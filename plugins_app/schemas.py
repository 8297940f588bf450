"""Request and response schemas of the HTTP API (pydantic, via django-ninja). Extra fields are allowed on hook
requests: agents may send more than the docs list and plugins receive it all."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field


class ErrorBody(Schema):
    code: str
    message: str
    details: Any | None = None


class ErrorEnvelope(Schema):
    error: ErrorBody


class Message(Schema):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]
    pinned: bool = False


class HookRequest(Schema):
    model_config = ConfigDict(extra="allow")


class IngestRequest(HookRequest):
    agent_id: str = Field(max_length=200)
    message: str
    peer_id: str | None = None


class AssembleRequest(HookRequest):
    agent_id: str = Field("", max_length=200)
    system_prompt: str = ""
    messages: list[Message]
    context_window_tokens: int = Field(200_000, gt=0)


class CompactRequest(HookRequest):
    agent_id: str = Field("", max_length=200)
    messages: list[Message]
    model: str = ""
    context_window_tokens: int = Field(200_000, gt=0)


class AfterTurnRequest(HookRequest):
    agent_id: str = Field(max_length=200)
    peer_id: str | None = None
    messages: list[Message]


class BootstrapRequest(HookRequest):
    context_window_tokens: int = Field(200_000, gt=0)
    stable_prefix_mode: bool = False
    max_recall_results: int = Field(5, ge=0)


class SubagentRequest(HookRequest):
    parent_id: str = Field(max_length=200)
    child_id: str = Field(max_length=200)


class TransformToolResultRequest(HookRequest):
    agent_id: str = Field("", max_length=200)
    tool_name: str
    tool_use_id: str = ""
    input: dict[str, Any] | None = None
    args: dict[str, Any] | None = None
    content: str | None = None
    result: str | None = None
    is_error: bool = False
    status: str | None = None


class OnEventRequest(HookRequest):
    event: dict[str, Any]


HOOK_REQUEST_SCHEMAS: dict[str, type[HookRequest]] = {
    "ingest": IngestRequest,
    "assemble": AssembleRequest,
    "compact": CompactRequest,
    "after_turn": AfterTurnRequest,
    "bootstrap": BootstrapRequest,
    "prepare_subagent": SubagentRequest,
    "merge_subagent": SubagentRequest,
    "transform_tool_result": TransformToolResultRequest,
    "on_event": OnEventRequest,
}


class HookReply(Schema):
    """The final result after stack and fallback: the hook's result fields plus where it came from."""

    model_config = ConfigDict(extra="allow")
    type: str
    source: str
    fallback_reason: str | None = None


class Accepted(Schema):
    accepted: bool
    job_id: str
    hook: str


class HookMetricOut(Schema):
    model_config = ConfigDict(extra="allow")
    calls: int
    successes: int
    failures: int
    latency_ms_total: float


class MetricsOut(Schema):
    plugins: dict[str, dict[str, HookMetricOut]]


class HealthOut(Schema):
    model_config = ConfigDict(extra="allow")
    status: Literal["ok", "degraded"]
    web: bool
    redis: bool
    database: bool
    workers: list[dict[str, Any]]
