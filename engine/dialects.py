"""The message formats agents send, and LibreFang's, which plugins always receive.

Agents hold their conversation in their LLM provider's format; the API accepts four (`DIALECTS`) on every hook that
carries messages (assemble, compact, after_turn, prepare/merge_subagent). At the edge (plugins_app/api/hook_asgi.py,
plugins_app/api/context_engine.py, plugins_app/mcp/tools.py, through engine/hook_requests.py `accept`) the request is
converted to LibreFang's format once, and the messages of the answer are converted back to the agent's:

- `librefang`: `{role: system|user|assistant, content: str | [block], pinned?}`; blocks `text`, `image{media_type,
  data}`, `tool_use{id, name, input}`, `tool_result{tool_use_id, tool_name, content, is_error}`, `thinking`.
- `openai`: OpenAI Chat Completions: roles system, developer, user, assistant (`tool_calls`, `content` may be null)
  and tool (`tool_call_id`); content parts (`text`, `image_url`, ...).
- `openai_responses`: OpenAI Responses input items (what openai-agents keeps): `{role, content}` messages with
  `input_text`/`output_text` parts, `function_call{call_id, name, arguments}`, `function_call_output{call_id,
  output}`, `reasoning`.
- `anthropic`: Anthropic Messages: user/assistant with `tool_use`/`tool_result`/`image{source}`/`thinking` blocks,
  the system prompt apart (the request's `system`, which becomes `system_prompt`).

A tool call and its results stay together (one assistant message of `tool_use` blocks, then one user message of
their `tool_result` blocks), and `pinned: true` on any dialect's message is kept. Messages a plugin hands back
unchanged go back to the agent exactly as it sent them (every field, even ones this module does not know); new or
changed ones are converted. Detection (`detect`) looks only for shapes one dialect has; a request may name its
dialect (`"dialect": "openai"`), which also makes a plain-text history (the same in every dialect) come back
without LibreFang's fields. A LibreFang request costs one scan of its messages and no conversion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LIBREFANG = "librefang"
OPENAI = "openai"
OPENAI_RESPONSES = "openai_responses"
ANTHROPIC = "anthropic"
DIALECTS = (LIBREFANG, OPENAI, OPENAI_RESPONSES, ANTHROPIC)
Dialect = Literal["librefang", "openai", "openai_responses", "anthropic"]

# Shapes only one dialect has (detect).
OPENAI_ROLES = frozenset({"tool", "developer", "function"})
OPENAI_KEYS = ("tool_calls", "tool_call_id", "function_call")
OPENAI_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
RESPONSES_PARTS = frozenset({"input_text", "output_text", "input_image", "input_file", "input_audio"})
ANTHROPIC_BLOCKS = frozenset({"redacted_thinking", "document", "search_result", "server_tool_use",
                              "web_search_tool_result", "container_upload", "mcp_tool_use", "mcp_tool_result"})
# Responses items that belong to the model's turn (kept with the assistant message they follow or precede).
RESPONSES_CALLS = frozenset({"function_call", "reasoning", "custom_tool_call", "web_search_call", "file_search_call",
                             "computer_call", "code_interpreter_call", "image_generation_call", "local_shell_call",
                             "mcp_call", "mcp_list_tools", "mcp_approval_request"})
RESPONSES_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "computer_call_output",
                               "local_shell_call_output", "mcp_approval_response"})


# ---- what each dialect's messages look like (the request contract: engine/hook_requests.py) ----

class LibreFangMessage(BaseModel):
    """LibreFang's message: what plugins receive."""

    model_config = ConfigDict(extra="allow", title="LibreFangMessage")
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]
    pinned: bool = False


class OpenAIFunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str = Field(description="the arguments as JSON text")


class OpenAIToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: str = "function"
    function: OpenAIFunctionCall


class OpenAIChatMessage(BaseModel):
    """An OpenAI Chat Completions message."""

    model_config = ConfigDict(extra="allow", title="OpenAIChatMessage")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[OpenAIToolCall] | None = None
    tool_call_id: str | None = None
    pinned: bool = False

    @model_validator(mode="after")
    def _shape(self):
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self


class OpenAIResponsesItem(BaseModel):
    """An OpenAI Responses input item: a message (`role`, `content`), a `function_call`, a `function_call_output`,
    a `reasoning` item, ..."""

    model_config = ConfigDict(extra="allow", title="OpenAIResponsesItem")
    type: str | None = Field(None, description='"message" (or absent with a role), "function_call", '
                                               '"function_call_output", "reasoning", ...')
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: str | list[dict[str, Any]] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[dict[str, Any]] | None = None
    pinned: bool = False

    @model_validator(mode="after")
    def _shape(self):
        kind = self.type or "message"
        if kind == "message" and (self.role is None or self.content is None):
            raise ValueError("a message item needs role and content")
        if kind == "function_call" and (not self.call_id or self.name is None or self.arguments is None):
            raise ValueError("a function_call item needs call_id, name and arguments")
        if kind == "function_call_output" and (not self.call_id or self.output is None):
            raise ValueError("a function_call_output item needs call_id and output")
        return self


class AnthropicMessage(BaseModel):
    """An Anthropic Messages message (the system prompt is the request's `system`)."""

    model_config = ConfigDict(extra="allow", title="AnthropicMessage")
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]
    pinned: bool = False


MESSAGE_MODELS: dict[str, type[BaseModel]] = {LIBREFANG: LibreFangMessage, OPENAI: OpenAIChatMessage,
                                              OPENAI_RESPONSES: OpenAIResponsesItem, ANTHROPIC: AnthropicMessage}
AgentMessage = LibreFangMessage | OpenAIChatMessage | OpenAIResponsesItem | AnthropicMessage


# ---- which dialect ----

def detect(request: dict[str, Any]) -> str:
    """The request's dialect: the one it names, else the first shape only one dialect has, else LibreFang's."""
    named = request.get("dialect")
    if named is not None:
        return named if named in DIALECTS else LIBREFANG  # the model refuses an unknown name
    if "system" in request and isinstance(request["system"], str | list):
        return ANTHROPIC
    messages = request.get("messages")
    if not isinstance(messages, list):
        return LIBREFANG
    for m in messages:
        found = _dialect_of(m) if isinstance(m, dict) else None
        if found is not None:
            return found
    return LIBREFANG


def _dialect_of(m: dict[str, Any]) -> str | None:
    if "type" in m:
        return OPENAI_RESPONSES
    if m.get("role") in OPENAI_ROLES or "tool_calls" in m or "tool_call_id" in m or "function_call" in m:
        return OPENAI
    content = m.get("content")
    if content is None:
        return OPENAI
    if content.__class__ is list:
        for part in content:
            if part.__class__ is dict and (part.get("type") not in PLAIN_BLOCKS or "cache_control" in part):
                found = _part_dialect(part)
                if found is not None:
                    return found
    return None


PLAIN_BLOCKS = frozenset({"text", "tool_use"})  # the same in LibreFang's and Anthropic's formats (no cache_control)


def _part_dialect(part: dict[str, Any]) -> str | None:
    kind = part.get("type")
    if kind in OPENAI_PARTS:
        return OPENAI
    if kind in RESPONSES_PARTS:
        return OPENAI_RESPONSES
    if kind in ANTHROPIC_BLOCKS or "cache_control" in part:
        return ANTHROPIC
    if (kind == "tool_result" and isinstance(part.get("content"), list)) or (kind == "image" and "source" in part) \
            or (kind == "thinking" and "signature" in part):
        return ANTHROPIC
    return None


# ---- the conversion ----

def _key(message: dict[str, Any]) -> str:
    return json.dumps([message.get("role"), message.get("content")], sort_keys=True, default=str)


@dataclass
class Conversion:
    """One request's conversion: the dialect, and which of the agent's messages each LibreFang message came from
    (so that what a plugin hands back unchanged goes back exactly as the agent sent it)."""

    dialect: str
    originals: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def note(self, converted: dict[str, Any], sources: list[dict[str, Any]]) -> dict[str, Any]:
        self.originals.setdefault(_key(converted), list(sources))
        return converted

    def messages(self, messages: list[Any]) -> tuple[list[Any], list[Any]]:
        """LibreFang messages back in the agent's dialect, and (Anthropic) the system text pulled out of them."""
        out: list[Any] = []
        system: list[str] = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            found = self.originals.get(_key(m))
            if found is not None:
                out.extend(found)
            elif self.dialect == ANTHROPIC and m.get("role") == "system":
                system.append(_text(m.get("content")))
            else:
                out.extend(TO_DIALECT[self.dialect](m))
        return out, system

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        """A hook's answer for the agent: its `messages` in the agent's dialect (and, for Anthropic, `system`
        when a plugin gave system messages)."""
        if not isinstance(body.get("messages"), list):
            return body
        messages, system = self.messages(body["messages"])
        out = {**body, "messages": messages, "dialect": self.dialect}
        if system:
            out["system"] = "\n\n".join(s for s in system if s)
        return out


def to_librefang(request: dict[str, Any], dialect: str) -> tuple[dict[str, Any], Conversion | None]:
    """The request as plugins receive it, and how to answer in the agent's dialect (None for LibreFang's own)."""
    req = {k: v for k, v in request.items() if k != "dialect"}
    if dialect == LIBREFANG:
        return req, None
    conversion = Conversion(dialect)
    if dialect == ANTHROPIC and "system" in req:
        system = _text(req.pop("system"))
        if system and not req.get("system_prompt"):
            req["system_prompt"] = system
    if isinstance(req.get("messages"), list):
        req["messages"] = FROM_DIALECT[dialect]([m for m in req["messages"] if isinstance(m, dict)], conversion)
    return req, conversion


def _text(content: Any) -> str:
    """The text of a content (a string, or the text of its text parts, whatever their dialect calls them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
                         and p.get("text"))
    return "" if content is None else str(content)


def _lf(role: str, content: Any, source: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": content}
    if source.get("pinned") is True:
        message["pinned"] = True
    return message


def _tool_input(arguments: Any) -> Any:
    """A tool call's arguments (JSON text) as LibreFang's `input`: the value they encode, else the text itself."""
    if not isinstance(arguments, str):
        return arguments if arguments is not None else {}
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def _arguments(tool_input: Any) -> str:
    return tool_input if isinstance(tool_input, str) else json.dumps(tool_input, ensure_ascii=False)


class _Results:
    """Consecutive tool results become one user message of tool_result blocks (as LibreFang and Anthropic keep
    them), remembering every message they came from."""

    def __init__(self, out: list[dict[str, Any]], conversion: Conversion):
        self.out, self.conversion = out, conversion
        self.blocks: list[dict[str, Any]] = []
        self.sources: list[dict[str, Any]] = []

    def add(self, block: dict[str, Any], source: dict[str, Any]) -> None:
        self.blocks.append(block)
        self.sources.append(source)

    def flush(self) -> None:
        if self.blocks:
            message = {"role": "user", "content": self.blocks}
            if any(s.get("pinned") is True for s in self.sources):
                message["pinned"] = True
            self.out.append(self.conversion.note(message, self.sources))
            self.blocks, self.sources = [], []


def _image_from_url(url: str) -> dict[str, Any] | None:
    """A base64 data URL as LibreFang's image block (other URLs stay as they are)."""
    if not url.startswith("data:") or ";base64," not in url:
        return None
    media_type, _, data = url[5:].partition(";base64,")
    return {"type": "image", "media_type": media_type, "data": data}


# ---- OpenAI Chat Completions ----

def _openai_parts(content: Any) -> str | list[dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    blocks = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            blocks.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "image_url" and isinstance(part.get("image_url"), dict):
            blocks.append(_image_from_url(str(part["image_url"].get("url", ""))) or part)
        else:
            blocks.append(part)
    return blocks


def _from_openai(messages: list[dict[str, Any]], conversion: Conversion) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    results = _Results(out, conversion)
    names: dict[str, str] = {}  # tool call id -> function name, for tool_result's tool_name
    for m in messages:
        role = m.get("role")
        if role in ("tool", "function"):
            call_id = str(m.get("tool_call_id") or "")
            results.add({"type": "tool_result", "tool_use_id": call_id,
                         "tool_name": names.get(call_id) or str(m.get("name") or ""),
                         "content": _text(m.get("content")), "is_error": False}, m)
            continue
        results.flush()
        if role == "assistant":
            message = _lf("assistant", _openai_assistant(m, names), m)
        else:
            message = _lf("system" if role in ("system", "developer") else "user", _openai_parts(m.get("content")), m)
        out.append(conversion.note(message, [m]))
    results.flush()
    return out


def _openai_assistant(m: dict[str, Any], names: dict[str, str]) -> str | list[dict[str, Any]]:
    calls = [c for c in (m.get("tool_calls") or []) if isinstance(c, dict)]
    if isinstance(m.get("function_call"), dict):  # the legacy single call
        calls.append({"id": "", "function": m["function_call"]})
    content = _openai_parts(m.get("content"))
    if isinstance(m.get("refusal"), str) and m["refusal"]:
        content = [*([{"type": "text", "text": content}] if isinstance(content, str) and content else
                     content if isinstance(content, list) else []), {"type": "text", "text": m["refusal"]}]
    if not calls:
        return content
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) and content else \
        (content if isinstance(content, list) else [])
    for call in calls:
        fn = call.get("function") if isinstance(call.get("function"), dict) else call.get("custom") or {}
        name = str(fn.get("name") or "")
        names[str(call.get("id") or "")] = name
        blocks.append({"type": "tool_use", "id": str(call.get("id") or ""), "name": name,
                       "input": _tool_input(fn.get("arguments", fn.get("input")))})
    return blocks


def _to_openai(m: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = m.get("role"), m.get("content")
    extra = {"pinned": True} if m.get("pinned") is True else {}
    if not isinstance(content, list):
        return [{"role": role, "content": _text(content), **extra}]
    if role == "assistant":
        calls = [{"id": str(b.get("id") or ""), "type": "function", "function": {
            "name": str(b.get("name") or ""), "arguments": _arguments(b.get("input", {}))}}
            for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        message: dict[str, Any] = {"role": "assistant", "content": _text(content) or None, **extra}
        if calls:
            message["tool_calls"] = calls
        return [message]
    out = [{"role": "tool", "tool_call_id": str(b.get("tool_use_id") or ""), "content": _text(b.get("content")),
            **extra} for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    parts = [_openai_part(b) for b in content if isinstance(b, dict) and b.get("type") not in ("tool_result",
                                                                                              "thinking")]
    if parts or not out:
        if all(p.get("type") == "text" for p in parts):
            out.append({"role": role, "content": "\n".join(str(p.get("text", "")) for p in parts), **extra})
        else:
            out.append({"role": role, "content": parts, **extra})
    return out


def _openai_part(block: dict[str, Any]) -> dict[str, Any]:
    if block.get("type") == "image" and "data" in block:
        return {"type": "image_url", "image_url": {"url": f"data:{block.get('media_type', 'image/png')};base64,"
                                                          f"{block['data']}"}}
    return block


# ---- OpenAI Responses items ----

def _responses_parts(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str) or content is None:
        return content or ""
    blocks = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            blocks.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            blocks.append(_image_from_url(part["image_url"]) or part)
        else:
            blocks.append(part)
    return blocks


def _responses_turn_block(item: dict[str, Any]) -> list[dict[str, Any]]:
    """The blocks of the model's turn an item adds."""
    kind = item.get("type") or "message"
    if kind == "message":
        content = _responses_parts(item.get("content"))
        return [{"type": "text", "text": content}] if isinstance(content, str) else content
    if kind == "function_call":
        return [{"type": "tool_use", "id": str(item.get("call_id") or ""), "name": str(item.get("name") or ""),
                 "input": _tool_input(item.get("arguments"))}]
    if kind == "reasoning":
        text = "\n".join(str(s.get("text", "")) for s in item.get("summary") or [] if isinstance(s, dict))
        return [{"type": "thinking", "thinking": text}]
    return [dict(item)]  # another call the model made (web search, ...): a block of its own kind


def _from_responses(items: list[dict[str, Any]], conversion: Conversion) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    results = _Results(out, conversion)
    turn: list[dict[str, Any]] = []  # the items of the model's turn under way
    names: dict[str, str] = {}

    def end_turn():
        if turn:
            blocks = [b for item in turn for b in _responses_turn_block(item)]
            for b in blocks:
                if b.get("type") == "tool_use":
                    names[b["id"]] = b["name"]
            out.append(conversion.note(_lf("assistant", blocks, turn[0]), turn[:]))
            turn.clear()

    for item in items:
        kind = item.get("type") or "message"
        if kind in RESPONSES_CALLS or (kind == "message" and item.get("role") == "assistant"):
            results.flush()
            turn.append(item)
        elif kind in RESPONSES_OUTPUTS:
            end_turn()
            call_id = str(item.get("call_id") or "")
            results.add({"type": "tool_result", "tool_use_id": call_id, "tool_name": names.get(call_id, ""),
                         "content": _text(item.get("output")), "is_error": False}, item)
        else:
            end_turn()
            results.flush()
            role = "system" if item.get("role") in ("system", "developer") else "user"
            out.append(conversion.note(_lf(role, _responses_parts(item.get("content")), item), [item]))
    end_turn()
    results.flush()
    return out


def _to_responses(m: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = m.get("role"), m.get("content")
    extra = {"pinned": True} if m.get("pinned") is True else {}
    if not isinstance(content, list):
        return [{"role": role, "content": _text(content), **extra}]
    out: list[dict[str, Any]] = []
    text = _text(content)
    if role == "assistant":
        if text:
            out.append({"role": "assistant", "content": text, **extra})
        out += [{"type": "function_call", "call_id": str(b.get("id") or ""), "name": str(b.get("name") or ""),
                 "arguments": _arguments(b.get("input", {})), **extra}
                for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        return out or [{"role": "assistant", "content": "", **extra}]
    out += [{"type": "function_call_output", "call_id": str(b.get("tool_use_id") or ""),
             "output": _text(b.get("content")), **extra}
            for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    if text or not out:
        out.append({"role": role, "content": text, **extra})
    return out


# ---- Anthropic Messages ----

def _from_anthropic(messages: list[dict[str, Any]], conversion: Conversion) -> list[dict[str, Any]]:
    out = []
    names: dict[str, str] = {}
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [_anthropic_block(b, names) for b in content if isinstance(b, dict)]
        out.append(conversion.note(_lf(str(m.get("role") or "user"), content, m), [m]))
    return out


def _anthropic_block(block: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "tool_use":
        names[str(block.get("id") or "")] = str(block.get("name") or "")
        return block
    if kind == "tool_result":
        tool_use_id = str(block.get("tool_use_id") or "")
        return {**block, "tool_use_id": tool_use_id, "tool_name": names.get(tool_use_id, ""),
                "content": _text(block.get("content")), "is_error": bool(block.get("is_error", False))}
    source = block.get("source")
    if kind == "image" and isinstance(source, dict) and source.get("type") == "base64":
        return {"type": "image", "media_type": source.get("media_type", ""), "data": source.get("data", "")}
    return block


def _to_anthropic(m: dict[str, Any]) -> list[dict[str, Any]]:
    content = m.get("content")
    if isinstance(content, list):
        content = [_anthropic_out(b) for b in content if isinstance(b, dict)]
    message = {"role": m.get("role"), "content": content}
    if m.get("pinned") is True:
        message["pinned"] = True
    return [message]


def _anthropic_out(block: dict[str, Any]) -> dict[str, Any]:
    if block.get("type") == "tool_result":
        return {"type": "tool_result", "tool_use_id": block.get("tool_use_id", ""),
                "content": _text(block.get("content")), **({"is_error": True} if block.get("is_error") else {})}
    if block.get("type") == "image" and "data" in block and "source" not in block:
        return {"type": "image", "source": {"type": "base64", "media_type": block.get("media_type", "image/png"),
                                            "data": block["data"]}}
    return block


FROM_DIALECT = {OPENAI: _from_openai, OPENAI_RESPONSES: _from_responses, ANTHROPIC: _from_anthropic}
TO_DIALECT = {OPENAI: _to_openai, OPENAI_RESPONSES: _to_responses, ANTHROPIC: _to_anthropic}
