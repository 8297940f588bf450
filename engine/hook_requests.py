"""What an agent may send to each hook, and what a plugin receives: one pydantic model per hook.

The fields are the API's contract (checked by the HTTP API, plugins_app/api/hook_asgi.py and
plugins_app/api/context_engine.py, and by the MCP tools and the CLI; published in OpenAPI). Extra fields are allowed
everywhere: agents may send more than the docs list and plugins receive it all. The hooks that carry messages take
them in any of engine/dialects.py's dialects: `accept` checks a request against its dialect's model and converts it
to LibreFang's format, which is what plugins receive.

`for_plugin` is the engine's side (`normalise`, used by engine/stack.py): the request as the plugin
receives it, lenient as LibreFang is (docs/compatibility.md "Hooks"): malformed parts are normalised (non-list
messages -> [], non-object messages dropped, a bad window -> the configured one) instead of failing, and what the
agent left out is filled in. The agent's own values are passed on untouched: never a dump of the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from engine import dialects
from engine import hooks as H

__all__ = ["HOOK_REQUEST_MODELS", "AgentRequest", "Normalising", "ValidationError", "accept", "agent_ids", "check",
           "for_plugin", "normalise"]
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


Message = dialects.LibreFangMessage
AgentMessages = list[dialects.AgentMessage]
ID = Field(None, max_length=200)


class IngestRequest(HookRequest):
    agent_id: str = Field(max_length=200)
    message: str
    peer_id: str | None = Field(None, max_length=200, description="recall this peer's memories and the agent's "
                                                                 "peer-less ones; absent: every peer's")
    session_id: str | None = Field(None, max_length=200, description="recall this session's memories and the "
                                                                    "agent's session-less ones; absent: every "
                                                                    "session's")

    @classmethod
    def reshape(cls, req, how):
        req["agent_id"] = _text(req.get("agent_id"))
        req["message"] = _text(req.get("message"))
        req.setdefault("peer_id", None)
        return req


class _Conversation(HookRequest):
    """The hooks that carry the conversation (assemble, compact, after_turn), in any dialect."""

    dialect: dialects.Dialect | None = Field(None, description="the messages' format; absent: detected from them "
                                                               "(engine/dialects.py)")
    system: str | list[dict[str, Any]] | None = Field(None, description="Anthropic's system prompt (the assemble "
                                                                        "request's system_prompt)")

    @classmethod
    def reshape(cls, req, how):
        req.setdefault("agent_id", "")
        messages = req.get("messages")
        req["messages"] = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
        return req


class _Window(_Conversation):
    """The hooks that fit the conversation into the model's context window (assemble, compact)."""

    agent_id: str = Field("", max_length=200)
    messages: AgentMessages
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
    peer_id: str | None = Field(None, max_length=200)
    session_id: str | None = Field(None, max_length=200, description="the session the turn's memory belongs to")
    messages: AgentMessages

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


class SubagentRequest(_Conversation):
    parent_id: str = Field(max_length=200)
    child_id: str = Field(max_length=200)
    messages: AgentMessages | None = Field(None, description="optional: the conversation handed to or back from "
                                                             "the sub-agent")

    @classmethod
    def reshape(cls, req, how):
        req.setdefault("parent_id", "")
        req.setdefault("child_id", "")
        if "messages" in req:
            req = super().reshape(req, how)
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
    event: dict[str, Any] = Field(description="the event; its `agent_id`, when it has one, names the agent")


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


# The hooks whose messages may come in any dialect, and their model per dialect (each checks the messages against
# that dialect's message model, so a refusal says what is wrong in the agent's own terms).
CONVERSATION_HOOKS = frozenset(h for h, m in HOOK_REQUEST_MODELS.items() if issubclass(m, _Conversation))


def _per_dialect(model: type[HookRequest]) -> dict[str, type[HookRequest]]:
    out = {}
    for dialect, message in dialects.MESSAGE_MODELS.items():
        optional = model.model_fields["messages"].default is None
        annotation = list[message] | None if optional else list[message]  # type: ignore[valid-type]
        out[dialect] = create_model(model.__name__, __base__=model,
                                    messages=(annotation, None if optional else ...))
    return out


DIALECT_MODELS = {hook: _per_dialect(HOOK_REQUEST_MODELS[hook]) for hook in CONVERSATION_HOOKS}


@dataclass
class AgentRequest:
    """An agent's checked hook request: `request` in LibreFang's format (what goes to the worker) and, when the
    agent used another dialect, the conversion that turns the answer back (engine/dialects.py)."""

    hook: str
    request: dict[str, Any]
    conversion: dialects.Conversion | None = None

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        return body if self.conversion is None else self.conversion.reply(body)


def accept(hook: str, data: Any) -> AgentRequest:
    """The agent's request checked (a ValidationError otherwise) and in LibreFang's format. A LibreFang request is
    passed on as it is: one scan of its messages to see it is one, no conversion."""
    if hook not in CONVERSATION_HOOKS or not isinstance(data, dict):
        HOOK_REQUEST_MODELS[hook].model_validate(data)
        return AgentRequest(hook, data)
    dialect = dialects.detect(data)
    DIALECT_MODELS[hook][dialect].model_validate(data)
    if dialect == dialects.LIBREFANG and "dialect" not in data and "system" not in data:
        return AgentRequest(hook, data)
    request, conversion = dialects.to_librefang(data, dialect)
    return AgentRequest(hook, request, conversion)


def check(hook: str, data: Any) -> dict[str, Any]:
    """`data` unchanged if it is a valid `hook` request, else a ValidationError. The agent's own dict goes on to the
    worker (not the model's dump): defaults and normalisation are the engine's, applied once where the hook runs."""
    accept(hook, data)
    return data


def agent_ids(hook: str, request: dict[str, Any]) -> list[str] | None:
    """The agents a request names (a token bound to agents may make it only for its own); None for a call that
    concerns every agent (bootstrap, an event naming no agent)."""
    if hook in (H.PREPARE_SUBAGENT, H.MERGE_SUBAGENT):
        return [str(request.get("parent_id") or ""), str(request.get("child_id") or "")]
    if hook == H.BOOTSTRAP:
        return None
    if hook == H.ON_EVENT:
        event = request.get("event")
        named = event.get("agent_id") if isinstance(event, dict) else None
        return [str(named)] if named is not None else None
    return [str(request.get("agent_id") or "")]


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
