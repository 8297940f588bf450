"""The /mcp ASGI app: bearer auth in front of the SDK's Streamable HTTP session manager (stateful sessions, so the
server can tell connected clients that the tool list changed).

daphne runs no ASGI lifespan events, so the session manager (whose task group holds the sessions) is started on the
first request, as a task of the running loop, and lives as long as the process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from plugins_app.auth import headers_bearer
from plugins_app.mcp import resources, tokens
from plugins_app.mcp import tools as mcp_tools

log = logging.getLogger("librefang.mcp")
PATH = "/mcp"
POLL_SECS = 1.0  # how often the WASM tool list is checked for changes (one directory listing)


def _token_of(ctx) -> str:
    request = getattr(ctx, "request", None)
    return headers_bearer(dict(request.headers)) if request is not None else ""


async def _token(ctx):
    """The token on the HTTP request that carried this message (checked again per message)."""
    found = await tokens.resolve(_token_of(ctx))
    if found is None:
        raise mcp_tools.McpToolError("unauthorized", "the bearer token is missing, unknown or revoked")
    return found


async def _role(ctx) -> str:
    return str((await _token(ctx)).role)


def _result(body: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(body, default=str))],
                                structured_content=body, is_error=is_error)


class McpServer(Server):
    """Advertises tools.listChanged: the WASM tools come and go (see Sessions)."""

    def create_initialization_options(self, notification_options=None, *args, **kwargs):
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), *args, **kwargs)


class Sessions:
    """The sessions of this process, told `notifications/tools/list_changed` when the WASM tool list changes."""

    def __init__(self) -> None:
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.stamp: str | None = None

    def track(self, ctx) -> None:
        # ctx.session is made per request; the connection under it lives as long as the client's session and
        # writes on its standalone (GET) stream. The SDK exposes it on the session object only.
        connection = getattr(ctx.session, "_connection", None)
        if connection is not None:
            self.live.add(connection)

    async def watch(self) -> None:
        while True:
            try:
                stamp = await sync_to_async(mcp_tools.listing_stamp, thread_sensitive=False)()
                if self.stamp is not None and stamp != self.stamp:
                    log.info("WASM tool list changed: notifying %d MCP sessions", len(self.live))
                    await self.notify()
                self.stamp = stamp
            except Exception:  # a half-written tool directory: look again next time
                log.debug("tool listing stamp failed", exc_info=True)
            await asyncio.sleep(POLL_SECS)

    async def notify(self) -> None:
        for connection in list(self.live):
            try:
                await connection.send_tool_list_changed()
            except Exception:  # a closed session: forget it
                log.info("could not notify an MCP session", exc_info=True)
                self.live.discard(connection)


SESSIONS = Sessions()


async def on_list_tools(ctx, params) -> types.ListToolsResult:
    SESSIONS.track(ctx)
    role = await _role(ctx)
    return types.ListToolsResult(tools=[
        types.Tool(name=t.name, description=t.description, input_schema=t.input_schema, output_schema=t.output_schema)
        for t in await mcp_tools.available(role)])


async def on_call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    SESSIONS.track(ctx)
    try:
        token = await _token(ctx)
        tool = await mcp_tools.find(params.name)
        if tool is None:
            raise mcp_tools.McpToolError("not_found", f"no tool named {params.name!r}")
        if not tool.allowed(str(token.role)):
            raise mcp_tools.McpToolError("forbidden", f"the {params.name} tool needs another role; the token has "
                                                      f"{token.role}")
        return _result(await tool.run(dict(params.arguments or {}), token))
    except mcp_tools.McpToolError as exc:
        return _result(exc.body, is_error=True)


async def _reader(ctx) -> None:
    SESSIONS.track(ctx)
    role = await _role(ctx)
    if not tokens.may_read(role):
        from mcp.shared.exceptions import MCPError

        raise MCPError(code=-32003, message=f"plugin resources need the viewer role or above; the token has {role}")


async def on_list_resources(ctx, params) -> types.ListResourcesResult:
    await _reader(ctx)
    items = await sync_to_async(resources.listing)()
    return types.ListResourcesResult(resources=[types.Resource(**item) for item in items])


async def on_read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    await _reader(ctx)
    found = await sync_to_async(resources.read)(str(params.uri))
    if found is None:
        from mcp.shared.exceptions import MCPError

        raise MCPError(code=-32002, message=f"no resource {params.uri}")
    mime, text = found
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=str(params.uri), mime_type=mime,
                                                                         text=text)])


def build_server() -> McpServer:
    return McpServer("librefang", version="1", instructions=(
        "LibreFang's context engine: `recall` before answering, `remember` after each turn, `assemble` and "
        "`compact` to fit the conversation; the memory_* tools read and change what is remembered; installed WASM "
        "tools are tools of their own."),
        on_list_tools=on_list_tools, on_call_tool=on_call_tool, on_list_resources=on_list_resources,
        on_read_resource=on_read_resource)


async def _unauthorized(send, status: int, error: str, description: str) -> None:
    body = json.dumps({"error": error, "error_description": description}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", f'Bearer error="{error}", error_description="{description}"'.encode())]})
    await send({"type": "http.response.body", "body": body})


class McpApp:
    """ASGI: 401 (WWW-Authenticate: Bearer) without a valid token, 403 for a token that may use nothing here,
    else the SDK's transport. Each token is its own principal, so a session only answers the token that opened it."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None
        self._started: asyncio.Future | None = None
        self._runner: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None

    async def _ensure_started(self) -> StreamableHTTPSessionManager:
        if self._started is not None and self._started.done() and self._started.exception() is not None:
            self._started = None  # the last start failed: try again with a new manager (one run() per manager)
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            self.manager = StreamableHTTPSessionManager(app=build_server(), stateless=False)
            self._runner = asyncio.ensure_future(self._run(self.manager, self._started))
            if self._watcher is None:
                self._watcher = asyncio.ensure_future(SESSIONS.watch())
        await asyncio.shield(self._started)
        assert self.manager is not None
        return self.manager

    @staticmethod
    async def _run(manager: StreamableHTTPSessionManager, started: asyncio.Future) -> None:
        try:
            async with manager.run():
                started.set_result(True)
                await asyncio.Event().wait()  # for the life of the process
        except BaseException as exc:  # never leave a request waiting on a start that will not come
            if not started.done():
                log.exception("the MCP session manager did not start")
                started.set_exception(RuntimeError(f"the MCP session manager did not start: {exc!r}"))
            raise

    async def __call__(self, scope, receive, send) -> None:
        raw = headers_bearer(scope.get("headers") or [])
        found = await tokens.resolve(raw)
        if found is None:
            return await _unauthorized(send, 401, "invalid_token", "Authentication required")
        if not tokens.may_connect(str(found.role)):
            return await _unauthorized(send, 403, "insufficient_scope", f"role {found.role} may not use /mcp")
        user = AuthenticatedUser(AccessToken(token=f"lf-token-{found.pk}", client_id=f"token:{found.pk}",
                                             scopes=[str(found.role)]))
        manager = await self._ensure_started()
        await manager.handle_request({**scope, "user": user}, receive, send)


def is_mcp_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")
