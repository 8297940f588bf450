"""The ASGI application: HTTP goes to Django (static files included), websockets to the Channels router. Agents' hook
calls are answered before Django's middleware (plugins_app/api/hook_asgi.py), /mcp by its own app (`HttpRoutes`).
Importing it starts nothing: what a serving web process runs beside it is librefang_site/web.py's, which daphne
serves."""

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


class HttpRoutes:
    """Every HTTP request: an agent's hook call (answered before Django by plugins_app/api/hook_asgi.py, and kept
    running on shutdown), /mcp (the Model Context Protocol server, plugins_app/mcp/app.py), or Django."""

    HOOK_PATH = re.compile(r"/api(?:/v1)?/context-engine/hooks/")
    # On SIGTERM daphne cancels every request in flight, so an agent waiting on a hook would get an empty reply. A
    # hook call keeps running: the job bus answers its waiting calls now (they fall back to the default engine,
    # `fallback_reason` "shutting_down: …") and the answer is given DRAIN_SECS to go out.
    DRAIN_SECS = 3.0

    def __init__(self, django_app):
        self.django = django_app
        self.hooks = LeanHookRoutes(django_app)
        self.mcp = McpApp()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if self.HOOK_PATH.match(path):
            return await self._until_answered(self.hooks(scope, receive, send))
        if is_mcp_path(path):
            return await self.mcp(scope, receive, send)
        return await self.django(scope, receive, send)

    async def _until_answered(self, call) -> None:
        task = asyncio.ensure_future(call)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            bus.drain("the web process is stopping")
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, self.DRAIN_SECS)
            raise


application = ProtocolTypeRouter(
    {
        "http": HttpRoutes(ASGIStaticFilesHandler(django_asgi_app)),
        "websocket": BrowserOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
                                            settings.ALLOWED_HOSTS),
    }
)

get_resolver().url_patterns  # noqa: B018 - load the views now, not on the first request
