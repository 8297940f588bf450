"""What an agent may send to each hook, and what a plugin receives: one pydantic model per hook.

The fields are the API's contract (checked by the HTTP API, plugins_app/api/hook_asgi.py and
plugins_app/api/context_engine.py, and by the MCP tools and the CLI; published in OpenAPI). Extra fields are allowed
everywhere: agents may send more than the docs list and plugins receive it all.

`for_plugin` is the engine's side (`normalise`, used by engine/stack.py): the request as the plugin
receives it, lenient as LibreFang is (docs/compatibility.md "Hooks"): malformed parts are normalised (non-list
messages -> [], non-object messages dropped, a bad window -> the configured one) instead of failing, and what the
agent left out is filled in. The agent's own values are passed on untouched: never a dump of the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import hooks as H

__all__ = ["HOOK_REQUEST_MODELS", "Normalising", "ValidationError", "check", "error_details", "for_plugin",
           "normalise"]
DEFAULT_AFTER_TURN_MAX_CHARS = 500


@dataclass(frozen=True)
class Normalising:
    """The service's settings that shape what a plugin receives ([context_engine] in config.toml)."""

    context_window_tokens: int = 200_000
    after_turn_max_chars: int | None = None  # None: the docs' 500; 0: whole messages


class HookRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    @classmethod
    def reshape(cls, req: dict[str, Any], how: Normalising) -> dict[str, Any]:
        """The plugin's view of `req` (a copy of the agent's dict with "type" set): per hook, below."""
        return req


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]
    pinned: bool = False


class IngestRequest(HookRequest):
    agent_id: str = Field(max_length=200)
    message: str
    peer_id: str | None = None

    @classmethod
    def reshape(cls, req, how):
        req["agent_id"] = _text(req.get("agent_id"))
        req["message"] = _text(req.get("message"))
        req.setdefault("peer_id", None)
        return req


class _Conversation(HookRequest):
    """The hooks that carry the conversation (assemble, compact, after_turn)."""

    @classmethod
    def reshape(cls, req, how):
        req.setdefault("agent_id", "")
        messages = req.get("messages")
        req["messages"] = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
        return req


class _Window(_Conversation):
    """The hooks that fit the conversation into the model's context window (assemble, compact)."""

    agent_id: str = Field("", max_length=200)
    messages: list[Message]
    context_window_tokens: int = Field(200_000, gt=0)

    @classmethod
    def reshape(cls, req, how):
        req = super().reshape(req, how)
        req["context_window_tokens"] = _positive_int(req.get("context_window_tokens"), how.context_window_tokens)
        return req


class AssembleRequest(_Window):
    system_prompt: str = ""

    @classmethod
    def reshape(cls, req, how):
        req = super().reshape(req, how)
        req.setdefault("system_prompt", "")
        return req


class CompactRequest(_Window):
    model: str = ""

    @classmethod
    def reshape(cls, req, how):
        from engine.default_engine import token_pressure  # the default engine's measure, as plugins see it

        req = super().reshape(req, how)
        req.setdefault("model", "")
        req.setdefault("token_pressure", token_pressure(req["messages"], int(req["context_window_tokens"])))
        return req


class AfterTurnRequest(_Conversation):
    agent_id: str = Field(max_length=200)
    peer_id: str | None = None
    messages: list[Message]

    @classmethod
    def reshape(cls, req, how):
        req = super().reshape(req, how)
        limit = DEFAULT_AFTER_TURN_MAX_CHARS if how.after_turn_max_chars is None else how.after_turn_max_chars
        if limit:  # the docs' truncation (LibreFang's code sends it whole): docs/compatibility.md
            req["messages"] = [truncate_message(m, limit) for m in req["messages"]]
        return req


class BootstrapRequest(HookRequest):
    context_window_tokens: int = Field(200_000, gt=0)
    stable_prefix_mode: bool = False
    max_recall_results: int = Field(5, ge=0)

    @classmethod
    def reshape(cls, req, how):
        req["context_window_tokens"] = _positive_int(req.get("context_window_tokens"), how.context_window_tokens)
        req.setdefault("stable_prefix_mode", False)
        req.setdefault("max_recall_results", 5)
        return req


class SubagentRequest(HookRequest):
    parent_id: str = Field(max_length=200)
    child_id: str = Field(max_length=200)

    @classmethod
    def reshape(cls, req, how):
        req.setdefault("parent_id", "")
        req.setdefault("child_id", "")
        return req


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

    @classmethod
    def reshape(cls, req, how):
        # Both contracts: the code's (input/content) and the docs' (args/result).
        if "content" not in req and "result" in req:
            req["content"] = req["result"]
        if "result" not in req and "content" in req:
            req["result"] = req["content"]
        if "input" not in req and "args" in req:
            req["input"] = req["args"]
        if "args" not in req and "input" in req:
            req["args"] = req["input"]
        req.setdefault("agent_id", "")
        req.setdefault("tool_name", "")
        req.setdefault("tool_use_id", "")
        req.setdefault("input", {})
        req.setdefault("args", req["input"])
        req.setdefault("content", "")
        req.setdefault("result", req["content"])
        req.setdefault("is_error", False)
        req.setdefault("status", "error" if req["is_error"] else "success")
        return req


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


def for_plugin(hook: str, request: Any, how: Normalising = Normalising()) -> dict[str, Any]:
    """The request exactly as a plugin receives it (see the module docstring). Never fails."""
    req = dict(request) if isinstance(request, dict) else {}
    if hook == H.ON_EVENT:  # the event itself, whatever else came with it
        return {"event": req.get("event", req)}
    req["type"] = hook
    model = HOOK_REQUEST_MODELS.get(hook)
    return model.reshape(req, how) if model is not None else req


def normalise(hook: str, request: dict[str, Any], *, after_turn_max_chars: int | None = None,
              context_window_tokens: int = 200_000) -> dict[str, Any]:
    """`for_plugin` with the [context_engine] settings as keywords. Unknown extra fields are passed through."""
    return for_plugin(hook, request, Normalising(context_window_tokens, after_turn_max_chars))


def check(hook: str, data: Any) -> dict[str, Any]:
    """`data` unchanged if it is a valid `hook` request, else a ValidationError. The agent's own dict goes on to the
    worker (not the model's dump): defaults and normalisation are the engine's, applied once where the hook runs."""
    HOOK_REQUEST_MODELS[hook].model_validate(data)
    return data


def error_details(exc: ValidationError) -> list[dict[str, Any]]:
    """The API envelope's `details` for a request that failed check()."""
    return [{"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _positive_int(value: Any, default: int) -> int:
    """Agents send numbers; anything else (missing, text, negative, bool) becomes the configured default."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return int(value)


def truncate_message(message: Any, limit: int) -> Any:
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, str) and len(content) > limit:
        return {**message, "content": content[:limit]}
    if isinstance(content, list):
        blocks = []
        for b in content:
            if isinstance(b, dict):
                for key in ("text", "content", "thinking"):
                    if isinstance(b.get(key), str) and len(b[key]) > limit:
                        b = {**b, key: b[key][:limit]}
            blocks.append(b)
        return {**message, "content": blocks}
    return message
