"""What an agent may send to each hook: one pydantic model per hook, shared by the HTTP API (validation and OpenAPI,
plugins_app/api/context_engine.py and plugins_app/api/hook_asgi.py), the MCP tools and the CLI.

Extra fields are allowed everywhere: agents may send more than the docs list and plugins receive it all. What a
plugin finally receives (defaults filled in, malformed parts normalised) is engine/requests.py's `normalise`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import hooks as H


class HookRequest(BaseModel):
    model_config = ConfigDict(extra="allow")


class Message(HookRequest):
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]
    pinned: bool = False


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


HOOK_REQUEST_MODELS: dict[str, type[HookRequest]] = {
    H.INGEST: IngestRequest,
    H.ASSEMBLE: AssembleRequest,
    H.COMPACT: CompactRequest,
    H.AFTER_TURN: AfterTurnRequest,
    H.BOOTSTRAP: BootstrapRequest,
    H.PREPARE_SUBAGENT: SubagentRequest,
    H.MERGE_SUBAGENT: SubagentRequest,
    H.TRANSFORM_TOOL_RESULT: TransformToolResultRequest,
    H.ON_EVENT: OnEventRequest,
}


__all__ = ["HOOK_REQUEST_MODELS", "ValidationError", "check", "error_details"]


def check(hook: str, data: Any) -> dict[str, Any]:
    """`data` unchanged if it is a valid `hook` request, else a ValidationError. The agent's own dict goes on to the
    worker (not the model's dump): defaults and normalisation are the engine's, applied once where the hook runs."""
    HOOK_REQUEST_MODELS[hook].model_validate(data)
    return data


def error_details(exc: ValidationError) -> list[dict[str, Any]]:
    """The API envelope's `details` for a request that failed check()."""
    return [{"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
