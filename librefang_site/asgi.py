"""The ASGI application: HTTP goes to Django (static files included), websockets to the Channels router. Agents' hook
calls are answered before Django's middleware (plugins_app/api/hook_asgi.py); /mcp by its own app. Importing it
starts nothing: what a serving web process runs beside it is librefang_site/web.py's, which daphne serves."""

import asyncio
import contextlib
import os
import re

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "librefang_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import get_resolver  # noqa: E402

from plugins_app import bus  # noqa: E402
from plugins_app.api.hook_asgi import LeanHookRoutes  # noqa: E402
from plugins_app.mcp.app import McpApp, is_mcp_path  # noqa: E402
from plugins_app.routing import websocket_urlpatterns  # noqa: E402


class BrowserOriginValidator(OriginValidator):
    """Browsers always send Origin, so a cross-site page is refused; non-browser clients (no Origin) are let
    through to the consumer, which still requires a session or an API token."""

    def valid_origin(self, parsed_origin):
        return parsed_origin is None or super().valid_origin(parsed_origin)


class AnswerHookCallsOnShutdown:
    """On SIGTERM daphne cancels every request in flight, so an agent waiting on a hook would get an empty reply.
    For the hook routes we keep the request running, tell the job bus to answer its waiting calls now (they fall
    back to the default engine, `fallback_reason` "shutting_down: …") and give the answer DRAIN_SECS to go out."""

    HOOK_PATH = re.compile(r"/api(?:/v1)?/context-engine/hooks/")
    DRAIN_SECS = 3.0

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.HOOK_PATH.match(scope.get("path", "")):
            return await self.app(scope, receive, send)
        task = asyncio.ensure_future(self.app(scope, receive, send))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            bus.drain("the web process is stopping")
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, self.DRAIN_SECS)
            raise


class McpOrDjango:
    """/mcp (the Model Context Protocol server, plugins_app/mcp/app.py) or Django for every other path."""

    def __init__(self, app):
        self.app = app
        self.mcp = McpApp()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and is_mcp_path(scope.get("path", "")):
            return await self.mcp(scope, receive, send)
        return await self.app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": McpOrDjango(AnswerHookCallsOnShutdown(LeanHookRoutes(ASGIStaticFilesHandler(django_asgi_app)))),
        "websocket": BrowserOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
                                            settings.ALLOWED_HOSTS),
    }
)

get_resolver().url_patterns  # noqa: B018 - load the views now, not on the first request
