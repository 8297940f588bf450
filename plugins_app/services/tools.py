"""WASM tool plugins: package/enable/disable/remove (web tier, no module code runs); install, whose archive is
unpacked by a worker (job kind "install_tool": an upload is untrusted input, and decompressing it must not cost the
web process memory); and execution, which runs module code and therefore also goes to a worker (job kind "tool").

Callers catch engine.wasm.tools.ToolError: `code` is stable, `status` is the HTTP status to answer.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable
from typing import Any

from engine.wasm import tools as T
from plugins_app import bus, events
from plugins_app.home import home
from plugins_app.selectors.tools import policy
from plugins_app.services import audit

log = logging.getLogger("librefang.tools")
JOB_KIND = "tool"
REPLY_MARGIN_SECS = 1.5
MAX_INPUT_BYTES = 1024 * 1024


INSTALL_JOB_KIND = "install_tool"
# A URL download (30 s socket timeout), unpacking under the limits and validating a module: a worker's job.
INSTALL_WAIT_SECS = 120.0
INSTALL_SOURCES = ("local", "upload", "url")
STAGED_RE = re.compile(r"^[0-9a-f]{32}\.pkg$")


def stage_package(chunks: Iterable[bytes]) -> str:
    """Write an uploaded package to tools/.incoming/<id>.pkg (owner-only) for a worker to unpack; the web tier only
    copies the bytes it was sent (at most T.MAX_PACKAGE_BYTES) and never opens the archive."""
    name = f"{uuid.uuid4().hex}.pkg"
    path = T.incoming_dir(home()) / name
    size = 0
    try:
        with open(path, "xb") as out:
            for chunk in chunks:
                size += len(chunk)
                if size > T.MAX_PACKAGE_BYTES:
                    raise T.ToolError(f"package is larger than {T.MAX_PACKAGE_BYTES} bytes", status=413,
                                      code="payload_too_large")
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    if not size:
        path.unlink(missing_ok=True)
        raise T.ToolError("the package is empty", code="validation_error")
    return name


async def install(actor: str, *, chunks: Iterable[bytes] | None = None, url: str | None = None,
                  sha256: str | None = None, source: str = "local") -> dict[str, Any]:
    """Install a package (uploaded `chunks`, or fetched from `url`) through a worker (job kind "install_tool"),
    waiting up to INSTALL_WAIT_SECS. Returns the tool as describe() shows it; raises ToolError."""
    from asgiref.sync import sync_to_async

    request: dict[str, Any] = {"source": source}
    if url is not None:
        request.update(url=url, sha256=sha256)
    else:
        request["staged"] = await sync_to_async(stage_package, thread_sensitive=False)(chunks or ())
    try:
        got = await bus.submit_and_wait("install", request, INSTALL_WAIT_SECS, kind=INSTALL_JOB_KIND,
                                        deadline_secs=INSTALL_WAIT_SECS)
    except Exception as exc:  # Redis down or full
        log.warning("bus unavailable for a tool install: %s", exc)
        got = None
        reply = {"_tool_error": {"code": "worker_unavailable", "status": 503,
                                 "message": f"job bus unreachable ({type(exc).__name__})"}}
    else:
        if got is None:
            reply = {"_tool_error": {"code": "worker_unavailable", "status": 504,
                                     "message": f"no worker answered within {INSTALL_WAIT_SECS:g}s"}}
        elif got.failed:
            reply = {"_tool_error": {"code": "engine_error", "status": 500, "message": got.body}}
        else:
            reply = got.data()
    finally:
        if "staged" in request:  # the worker is done with it, or too late to start (the job's deadline passed)
            (T.incoming_dir(home()) / request["staged"]).unlink(missing_ok=True)
    record = sync_to_async(audit.record)
    if "_tool_error" in reply:
        err = reply["_tool_error"]
        await record(actor, "tool.install", "", ok=False, details={"error": err["message"]})
        raise T.ToolError(err["message"], code=err["code"], status=err["status"])
    tool = reply["tool"]
    await record(actor, "tool.install", tool["id"], details={"version": tool["version"], "source": source})
    return tool


def run_install_job(request: Any) -> tuple[dict[str, Any], str, str]:
    """Worker side of an "install_tool" job: (reply, source, reason). Unpacks under engine/wasm/tools/installer.py's limits,
    installs, then reads the module's az_tool_name/az_tool_schema (module code may run here, on a worker)."""
    try:
        tool = _install_for_job(request)
    except T.ToolError as exc:
        return {"_tool_error": {"code": exc.code, "message": exc.message, "status": exc.status}}, "tool", exc.message
    T.refresh_info(tool, policy())
    return {"tool": T.describe(tool, policy())}, f"tool:{tool.id}", ""


def _install_for_job(request: Any) -> T.InstalledTool:
    if not isinstance(request, dict):
        raise T.ToolError("malformed install job")
    source = request.get("source") if request.get("source") in INSTALL_SOURCES else "local"
    incoming = T.incoming_dir(home())
    if isinstance(request.get("url"), str):
        sha = request.get("sha256") if isinstance(request.get("sha256"), str) else None
        archive = incoming / f"{uuid.uuid4().hex}.pkg"
        try:
            T.fetch_package_to(request["url"], archive, sha)
            return T.install_file(home(), archive, source, policy())
        finally:
            archive.unlink(missing_ok=True)
    staged = request.get("staged")
    if not isinstance(staged, str) or not STAGED_RE.match(staged):  # a name in tools/.incoming, nothing else
        raise T.ToolError("malformed install job")
    archive = incoming / staged
    if not archive.is_file():
        raise T.ToolError("the uploaded package is gone (did the request time out?)", code="package_gone")
    try:
        return T.install_file(home(), archive, source, policy())
    finally:
        archive.unlink(missing_ok=True)


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
        got = await bus.submit_and_wait("tool", {"tool": tool_id, "input": input_text}, budget + REPLY_MARGIN_SECS,
                                        kind=JOB_KIND, plugin=tool_id, deadline_secs=budget + REPLY_MARGIN_SECS)
    except Exception as exc:  # Redis down
        log.warning("bus unavailable for tool %s: %s", tool_id, exc)
        return 503, {"ok": False, "output": "", "error": f"job bus unreachable ({type(exc).__name__})",
                     "kind": "worker_unavailable"}
    if got is None:
        return 504, {"ok": False, "output": "", "error": f"no worker answered within {budget + REPLY_MARGIN_SECS:g}s",
                     "kind": "worker_unavailable"}
    if got.failed:
        return 500, {"ok": False, "output": "", "error": got.body, "kind": "engine_error"}
    reply = got.data()
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
