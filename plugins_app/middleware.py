"""Response policies for every dashboard page: a Content-Security-Policy, and a page that says what is down
instead of a 500 when the database is unreachable."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpResponse
from django.template.loader import render_to_string

log = logging.getLogger("librefang.dashboard")

# Only our own files run or style a page: scripts and stylesheets are vendored under static/ (htmx, uPlot) and the
# dashboard has no inline script, inline event handler or style attribute; htmx runs without eval
# (templates/base.html, htmx-config). connect-src 'self' covers the page's own websockets (ws/wss, same host).
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:", "font-src 'self'",
    "connect-src 'self'", "object-src 'none'", "base-uri 'self'", "form-action 'self'", "frame-ancestors 'none'",
))


class ContentSecurityPolicy:
    """On every HTML page (a policy governs documents; JSON answers, such as agents' hook calls, carry none, so the
    lean hook route of plugins_app/api/hook_asgi.py answers exactly as Django does)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.headers.get("Content-Type", "").startswith("text/html"):
            response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response


class DatabaseDownPage:
    """A dashboard page whose database is unreachable answers 503 with what is down (templates/database_down.html,
    rendered without the database) instead of the 500 page. The API keeps its own JSON errors."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, DatabaseError) or request.path.startswith("/api/"):
            return None
        log.warning("database unreachable while rendering %s: %s", request.path, exception)
        return HttpResponse(render_to_string("database_down.html", {"path": request.path}), status=503,
                            headers={"Retry-After": "5"})
