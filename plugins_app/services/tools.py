"""WASM tool plugins: install/package/enable/disable/remove (web tier, no module code runs) and execution, which
runs module code and therefore goes through the job bus to a worker (job kind "tool").

Callers catch engine.wasm_tools.ToolError: `code` is stable, `status` is the HTTP status to answer.
"""

from __future__ import annotations

import logging
from typing import Any

from engine import wasm_tools as T
from plugins_app import bus, events
from plugins_app.selectors.tools import policy
from plugins_app.services import audit
from plugins_app.services.engine import home

log = logging.getLogger("librefang.tools")
JOB_KIND = "tool"
REPLY_MARGIN_SECS = 1.5
MAX_INPUT_BYTES = 1024 * 1024


def install(data: bytes, actor: str, source: str = "local") -> dict[str, Any]:
    try:
        tool = T.install(home(), data, source=source, policy=policy())
    except T.ToolError as exc:
        audit.record(actor, "tool.install", "", ok=False, details={"error": exc.message})
        raise
    audit.record(actor, "tool.install", tool.id, details={"version": tool.version})
    return T.describe(tool, policy())


async def request_describe(tool_id: str) -> None:
    """Ask a worker to read the module's az_tool_name/az_tool_schema (module code never runs in the web tier)."""
    try:
        await bus.enqueue("tool", {"tool": tool_id, "describe": True}, kind=JOB_KIND, plugin=tool_id)
    except Exception as exc:  # best effort: the first execution fills it in too
        log.warning("could not queue a describe job for tool %s: %s", tool_id, exc)


def package(manifest: bytes | str | dict, wasm: bytes) -> bytes:
    return T.package(manifest, wasm)


def set_enabled(tool_id: str, enabled: bool, actor: str) -> dict[str, Any]:
    tool = T.set_enabled(home(), tool_id, enabled)
    audit.record(actor, "tool.enable" if enabled else "tool.disable", tool_id)
    return T.describe(tool, policy())


def remove(tool_id: str, actor: str, version: str | None = None) -> int:
    count = T.remove(home(), tool_id, version)
    if not count:
        raise T.ToolError(f"unknown tool {tool_id!r}", code="not_found", status=404)
    audit.record(actor, "tool.remove", tool_id, details={"version": version, "removed": count})
    return count


def check_input(value: Any) -> str:
    """The tool input string: a string as is, any other JSON value as its JSON text (AgentZero passes raw text)."""
    import json

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text.encode("utf-8")) > MAX_INPUT_BYTES:
        raise T.ToolError(f"input is larger than {MAX_INPUT_BYTES} bytes", code="payload_too_large", status=413)
    return text


async def execute(tool_id: str, input_text: str) -> tuple[int, dict[str, Any]]:
    """(status, body) for POST /api/tools/{id}/execute: checked here, run by a worker."""
    from asgiref.sync import sync_to_async

    tool = await sync_to_async(T.get_tool, thread_sensitive=False)(home(), tool_id)  # 404 before queueing
    if not tool.enabled:
        raise T.ToolError(f"tool {tool_id!r} is disabled", code="tool_disabled", status=409)
    budget = policy().max_execution_ms / 1000
    try:
        reply = await bus.submit_and_wait("tool", {"tool": tool_id, "input": input_text}, budget + REPLY_MARGIN_SECS,
                                          kind=JOB_KIND, plugin=tool_id, deadline_secs=budget + REPLY_MARGIN_SECS)
    except Exception as exc:  # Redis down
        log.warning("bus unavailable for tool %s: %s", tool_id, exc)
        return 503, {"ok": False, "output": "", "error": f"job bus unreachable ({type(exc).__name__})",
                     "kind": "worker_unavailable"}
    if reply is None:
        return 504, {"ok": False, "output": "", "error": f"no worker answered within {budget + REPLY_MARGIN_SECS:g}s",
                     "kind": "worker_unavailable"}
    if "_engine_error" in reply:
        return 500, {"ok": False, "output": "", "error": reply["_engine_error"], "kind": "engine_error"}
    if "_tool_error" in reply:
        err = reply["_tool_error"]
        raise T.ToolError(err["message"], code=err["code"], status=err["status"])
    return 200, reply


def run_tool_job(request: Any) -> dict[str, Any]:
    """Worker side of a "tool" job: run the module, stream its log lines, answer the reply dict."""
    if not isinstance(request, dict) or not isinstance(request.get("tool"), str) \
            or not (isinstance(request.get("input"), str) or request.get("describe")):
        return {"_tool_error": {"code": "bad_request", "message": "malformed tool job", "status": 400}}
    tool_id = request["tool"]
    if request.get("describe"):
        try:
            return T.refresh_info(T.get_tool(home(), tool_id), policy())
        except T.ToolError as exc:
            return {"_tool_error": {"code": exc.code, "message": exc.message, "status": exc.status}}
    stream = events.publisher()
    stream_name = f"tool:{tool_id}"
    try:
        run = T.execute(home(), tool_id, request["input"], policy=policy(),
                        on_log=lambda line: stream.line(stream_name, "execute", line, ""))
    except T.ToolError as exc:
        return {"_tool_error": {"code": exc.code, "message": exc.message, "status": exc.status}}
    body = run.to_dict()
    body["tool"] = tool_id
    return body
