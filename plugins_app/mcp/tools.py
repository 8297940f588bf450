"""What /mcp offers and how each call is answered: the context engine's hooks (the REST hook routes' service,
plugins_app/services/hooks.py), every installed and enabled WASM tool (run on a worker as POST
/api/tools/{id}/execute does, plugins_app/services/tools.py), and read-only `plugins` / `doctor` for viewers.

Each tool declares the role check it needs (plugins_app/mcp/tokens.py); a token only sees the tools it may call.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from engine import hook_requests
from engine.wasm import tools as T
from plugins_app import bus
from plugins_app.mcp import tokens
from plugins_app.selectors import doctor as doctor_selectors
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors import tools as tool_selectors
from plugins_app.services import hooks as hook_service
from plugins_app.services import tools as tool_service

ORIGIN = "mcp"  # engine.ports.MCP: the origin of the jobs (and so the traces) of MCP calls


class McpToolError(Exception):
    """A refused or failed call: answered as a tool result with isError (the protocol's tool error)."""

    def __init__(self, code: str, message: str, details: Any = None):
        super().__init__(message)
        self.body = {"error": {"code": code, "message": message, "details": details}}


@dataclass
class ToolDef:
    name: str
    description: str
    input_schema: dict[str, Any]
    allowed: Callable[[str], bool]
    run: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


MESSAGES_SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "role": {"enum": ["system", "user", "assistant"]}, "content": {"type": "string"}},
    "required": ["role", "content"]}}


def _hook_input(hook: str, fields: dict[str, Any]) -> dict[str, Any]:
    # Advertise the documented fields; extra fields go to the plugins as over REST (the schemas allow extras).
    schema = {"type": "object", "properties": fields, "required": [k for k in fields if k in ("agent_id", "messages",
                                                                                           "query")]}
    if hook in ("assemble", "compact"):
        schema["required"] = ["messages"]
    return schema


async def _hook(hook: str, request: dict[str, Any]) -> dict[str, Any]:
    try:
        hook_requests.check(hook, request)
    except hook_requests.ValidationError as exc:  # the REST route's check (engine/hook_requests.py)
        raise McpToolError("validation_error", f"invalid {hook} arguments: {exc}") from exc
    origin = bus.JOB_ORIGIN.set(ORIGIN)
    try:
        status, body, headers = await hook_service.call_hook(hook, request)
    finally:
        bus.JOB_ORIGIN.reset(origin)
    if status >= 400:  # 503: the job bus is down (retry); 502: a plugin aborted the turn
        err = body.get("error", {})
        details = {**(err.get("details") or {}), "http_status": status, **({"retry_after_secs": int(
            headers["Retry-After"])} if "Retry-After" in headers else {})}
        raise McpToolError(err.get("code", "error"), err.get("message", f"{hook} failed"), details)
    return body


async def recall(args: dict[str, Any]) -> dict[str, Any]:
    """ingest: the agent's message in, what the context engine recalls for it out."""
    request = {k: v for k, v in args.items() if k not in ("query",)}
    request["message"] = args.get("query", args.get("message"))
    return await _hook("ingest", request)


async def remember(args: dict[str, Any]) -> dict[str, Any]:
    return await _hook("after_turn", dict(args))


async def assemble(args: dict[str, Any]) -> dict[str, Any]:
    return await _hook("assemble", dict(args))


async def compact(args: dict[str, Any]) -> dict[str, Any]:
    return await _hook("compact", dict(args))


async def plugins(args: dict[str, Any]) -> dict[str, Any]:
    items = await sync_to_async(plugin_selectors.list_plugins)()
    return {"plugins": [p.to_dict() for p in items], "chain": await sync_to_async(plugin_selectors.active_chain)()}


async def doctor(args: dict[str, Any]) -> dict[str, Any]:
    return await sync_to_async(doctor_selectors.doctor, thread_sensitive=False)(fresh=bool(args.get("fresh")))


BUILTIN: list[ToolDef] = [
    ToolDef("recall", "What the context engine recalls for an agent's message (the ingest hook: plugin or stack, "
                      "with the default engine's fallback and fallback_reason).",
            _hook_input("ingest", {"agent_id": {"type": "string"}, "query": {"type": "string"},
                                   "peer_id": {"type": "string"}}), tokens.may_call_hooks, recall),
    ToolDef("remember", "Store a finished turn (the after_turn hook), queued for a worker; answers the job id.",
            _hook_input("after_turn", {"agent_id": {"type": "string"}, "messages": MESSAGES_SCHEMA,
                                       "peer_id": {"type": "string"}}), tokens.may_call_hooks, remember),
    ToolDef("assemble", "Fit a conversation into the context window (the assemble hook).",
            _hook_input("assemble", {"agent_id": {"type": "string"}, "messages": MESSAGES_SCHEMA,
                                     "system_prompt": {"type": "string"},
                                     "context_window_tokens": {"type": "integer"}}), tokens.may_call_hooks, assemble),
    ToolDef("compact", "Summarise a conversation to free context (the compact hook).",
            _hook_input("compact", {"agent_id": {"type": "string"}, "messages": MESSAGES_SCHEMA,
                                    "model": {"type": "string"}, "context_window_tokens": {"type": "integer"}}),
            tokens.may_call_hooks, compact),
    ToolDef("plugins", "The installed context-engine plugins and the chain serving now (read-only).",
            {"type": "object", "properties": {}}, tokens.may_read, plugins),
    ToolDef("doctor", "Runtime and plugin health findings with hints (read-only).",
            {"type": "object", "properties": {"fresh": {"type": "boolean"}}}, tokens.may_read, doctor),
]
BUILTIN_NAMES = {t.name for t in BUILTIN}


def wasm_tool_name(tool_id: str) -> str:
    return f"wasm_{tool_id}" if tool_id in BUILTIN_NAMES else tool_id


def _tool_schema(info: dict[str, Any]) -> dict[str, Any]:
    """The module's declared input schema (az_tool_schema), else one free-form object."""
    schema = info.get("input_schema")
    if isinstance(schema, dict) and schema.get("type") == "object":
        return schema
    return {"type": "object", "additionalProperties": True}


def _wasm_runner(tool_id: str) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    async def run(args: dict[str, Any]) -> dict[str, Any]:
        try:
            # the tool-call argument string, as AgentZero hands it to a module
            text = tool_service.check_input(json.dumps(args, ensure_ascii=False))
            status, body = await tool_service.execute(tool_id, text)
        except T.ToolError as exc:
            raise McpToolError(exc.code, exc.message, {"http_status": exc.status}) from exc
        if status != 200 or not body.get("ok"):
            raise McpToolError(body.get("kind") or "tool_failed", body.get("error") or "the tool failed",
                               {"http_status": status, "output": body.get("output", "")})
        return body
    return run


def _wasm_tools() -> list[ToolDef]:
    out = []
    for info in tool_selectors.list_tools():
        if not info["enabled"] or info["problems"]:
            continue
        out.append(ToolDef(wasm_tool_name(info["id"]), info["description"] or f"WASM tool {info['id']}",
                           _tool_schema(info), tokens.may_run_tools, _wasm_runner(info["id"])))
    return out


async def available(role: str) -> list[ToolDef]:
    """The tools a token of `role` may call, WASM tools included (read from disk: their list changes)."""
    wasm = await sync_to_async(_wasm_tools, thread_sensitive=False)() if tokens.may_run_tools(role) else []
    return [t for t in BUILTIN if t.allowed(role)] + wasm


async def find(name: str) -> ToolDef | None:
    for tool in BUILTIN:
        if tool.name == name:
            return tool
    for tool in await sync_to_async(_wasm_tools, thread_sensitive=False)():
        if tool.name == name:
            return tool
    return None


def listing_stamp() -> str:
    """Changes whenever the WASM tool list could change (install, enable/disable, remove): a cheap poll."""
    return json.dumps([(t.id, t.version, t.enabled, bool(t.problems)) for t in T.list_tools(tool_selectors.home())])
