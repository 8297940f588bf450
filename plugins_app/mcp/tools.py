"""What /mcp offers and how each call is answered: every context-engine hook (the REST hook routes' service,
plugins_app/services/hooks.py; `recall` is ingest, `remember` after_turn), the memory API (plugins_app/mcp/
memory_tools.py), every installed and enabled WASM tool (run on a worker as POST /api/tools/{id}/execute does,
plugins_app/services/tools.py), and read-only `plugins` / `doctor` for viewers.

Each tool's input schema is the model its arguments are checked against (the REST routes' models: engine/
hook_requests.py, plugins_app/schemas), its output schema the model of its answer (engine/hook_replies.py). A
refusal is a tool error whose structured content is REST's envelope: {"error": {"code", "message", "details"}}.
Each tool declares the role check it needs (plugins_app/mcp/tokens.py), and a token bound to agents calls tools only
for its agents (plugins_app/auth.py); a token only sees the tools it may call.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from pydantic import BaseModel, ConfigDict, Field

from engine import hook_requests
from engine import hooks as H
from engine.hook_replies import HOOK_REPLY_MODELS
from engine.wasm import tools as T
from plugins_app import bus
from plugins_app.auth import refused_agents
from plugins_app.mcp import tokens
from plugins_app.mcp.memory_tools import MEMORY_TOOLS
from plugins_app.mcp.tool_base import McpToolError, Run, ToolDef, checked, schema_of
from plugins_app.models import ApiToken
from plugins_app.schemas import DoctorOut, ToolRunOut
from plugins_app.selectors import doctor as doctor_selectors
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors import tools as tool_selectors
from plugins_app.services import hooks as hook_service
from plugins_app.services import tools as tool_service

ORIGIN = "mcp"  # engine.ports.MCP: the origin of the jobs (and so the traces) of MCP calls
__all__ = ["BUILTIN", "McpToolError", "ToolDef", "available", "find", "listing_stamp"]


# ---- the hooks ----

async def call_hook(tool: str, hook: str, args: dict[str, Any], token: ApiToken) -> dict[str, Any]:
    """A hook call as REST's hook routes make it: checked (any dialect), for the token's agents, with the same
    deadline, fallback and answer in the agent's dialect."""
    try:
        call = hook_requests.accept(hook, args)
    except hook_requests.ValidationError as exc:  # the REST route's check (engine/hook_requests.py)
        raise McpToolError.invalid(tool, exc) from exc
    refused = refused_agents(token, hook_requests.agent_ids(hook, call.request))
    if refused is not None:
        raise McpToolError.of(refused)
    origin = bus.JOB_ORIGIN.set(ORIGIN)
    try:
        answer = await hook_service.answer(call)
    finally:
        bus.JOB_ORIGIN.reset(origin)
    body, headers = answer.data(), answer.headers
    if answer.status >= 400:  # 503: the job bus is down (retry); 502: a plugin aborted the turn
        err = body.get("error", {})
        details = {**(err.get("details") or {}), "http_status": answer.status, **({"retry_after_secs": int(
            headers["Retry-After"])} if "Retry-After" in headers else {})}
        raise McpToolError(err.get("code", "error"), err.get("message", f"{hook} failed"), details)
    return body


class RecallArgs(BaseModel):
    """recall's arguments: the ingest hook's, with the agent's message as `query`."""

    model_config = ConfigDict(extra="allow", title="RecallArgs")
    agent_id: str = Field(max_length=200)
    query: str = Field(description="the agent's message (ingest's `message`)")
    peer_id: str | None = Field(None, max_length=200, description="recall this peer's memories and the agent's "
                                                                 "peer-less ones; absent: every peer's")
    session_id: str | None = Field(None, max_length=200, description="recall this session's memories and the "
                                                                    "session-less ones; absent: every session's")


async def recall(args: dict[str, Any], token: ApiToken) -> dict[str, Any]:
    """ingest: the agent's message in, what the context engine recalls for it out."""
    checked(RecallArgs, "recall", args)
    request = {k: v for k, v in args.items() if k != "query"}
    request["message"] = args["query"]
    return await call_hook("recall", H.INGEST, request, token)


def _hook_runner(tool: str, hook: str) -> Run:
    async def run(args: dict[str, Any], token: ApiToken) -> dict[str, Any]:
        return await call_hook(tool, hook, args, token)
    return run


HOOK_TOOLS = {  # tool name -> (hook, what it does)
    "remember": (H.AFTER_TURN, "Store a finished turn (the after_turn hook), queued for a worker; answers the job id."),
    "assemble": (H.ASSEMBLE, "Fit a conversation into the context window (the assemble hook)."),
    "compact": (H.COMPACT, "Summarise a conversation to free context (the compact hook)."),
    "bootstrap": (H.BOOTSTRAP, "Let the plugins set themselves up (the bootstrap hook); concerns every agent."),
    "prepare_subagent": (H.PREPARE_SUBAGENT, "Before a sub-agent starts (the prepare_subagent hook)."),
    "merge_subagent": (H.MERGE_SUBAGENT, "After a sub-agent finished, fold its work back (the merge_subagent hook)."),
    "transform_tool_result": (H.TRANSFORM_TOOL_RESULT, "Rewrite a tool's result before the model sees it (the "
                                                        "transform_tool_result hook)."),
    "on_event": (H.ON_EVENT, "Hand the plugins an event (the on_event hook), queued for a worker."),
}
MESSAGES_NOTE = (" Messages in LibreFang's, OpenAI Chat Completions', OpenAI Responses' or Anthropic Messages' format; "
                 "the answer's come back in the same one.")


def _hook_tools() -> list[ToolDef]:
    out = [ToolDef("recall", "What the context engine recalls for an agent's message (the ingest hook: plugin or "
                             "stack, with the default engine's fallback and fallback_reason); the built-in store's "
                             "memories carry their id.",
                   schema_of(RecallArgs), tokens.may_call_hooks, recall, schema_of(HOOK_REPLY_MODELS[H.INGEST]))]
    for name, (hook, what) in HOOK_TOOLS.items():
        note = MESSAGES_NOTE if hook in hook_requests.CONVERSATION_HOOKS else ""
        out.append(ToolDef(name, what + note, schema_of(hook_requests.HOOK_REQUEST_MODELS[hook]),
                           tokens.may_call_hooks, _hook_runner(name, hook), schema_of(HOOK_REPLY_MODELS[hook])))
    return out


# ---- read-only views for viewers ----

class PluginsOut(BaseModel):
    model_config = ConfigDict(extra="allow", title="PluginsOut")
    plugins: list[dict[str, Any]]
    chain: dict[str, Any]


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", title="NoArgs")


class DoctorArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", title="DoctorArgs")
    fresh: bool = Field(False, description="run the checks again instead of using the last results")


async def plugins(args: dict[str, Any], token: ApiToken) -> dict[str, Any]:
    checked(NoArgs, "plugins", args)
    items = await sync_to_async(plugin_selectors.list_plugins)()
    return {"plugins": [p.to_dict() for p in items], "chain": await sync_to_async(plugin_selectors.active_chain)()}


async def doctor(args: dict[str, Any], token: ApiToken) -> dict[str, Any]:
    fresh = checked(DoctorArgs, "doctor", args).fresh  # type: ignore[attr-defined]
    return await sync_to_async(doctor_selectors.doctor, thread_sensitive=False)(fresh=fresh)


def _builtin() -> list[ToolDef]:
    return [*_hook_tools(), *MEMORY_TOOLS,
            ToolDef("plugins", "The installed context-engine plugins and the chain serving now (read-only).",
                    schema_of(NoArgs), tokens.may_read, plugins, schema_of(PluginsOut)),
            ToolDef("doctor", "Runtime and plugin health findings with hints (read-only).",
                    schema_of(DoctorArgs), tokens.may_read, doctor, schema_of(DoctorOut))]


BUILTIN: list[ToolDef] = _builtin()
BUILTIN_NAMES = {t.name for t in BUILTIN}


# ---- WASM tools ----

def wasm_tool_name(tool_id: str) -> str:
    return f"wasm_{tool_id}" if tool_id in BUILTIN_NAMES else tool_id


def _tool_schema(info: dict[str, Any]) -> dict[str, Any]:
    """The module's declared input schema (az_tool_schema), else one free-form object."""
    schema = info.get("input_schema")
    if isinstance(schema, dict) and schema.get("type") == "object":
        return schema
    return {"type": "object", "additionalProperties": True}


def _wasm_runner(tool_id: str) -> Run:
    async def run(args: dict[str, Any], token: ApiToken) -> dict[str, Any]:
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
                           _tool_schema(info), tokens.may_run_tools, _wasm_runner(info["id"]),
                           schema_of(ToolRunOut)))
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
