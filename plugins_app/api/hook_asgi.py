"""The agents' hook calls (`POST /api[/v1]/context-engine/hooks/<hook>`) answered straight from ASGI: read the body,
take the bearer token from the per-process cache (plugins_app/auth.py TokenCache), parse and check the call once
(plugins_app/api/context_engine.py `agent_call`: the body, its model in any dialect, the agents a bound token may
name), call plugins_app/services/hooks.py and write its answer: the worker's reply bytes as they came, with the
headers Django's middleware would add. No Django middleware, URL resolving or thread hop on the way: those cost more
CPU than the rest of the web tier's work.

A call Django would hand to its route as it is is answered here, refusals included (no, unknown or
under-privileged token, a body that is not a valid request, an agent the token is not bound to), rendered by the
API's own exception handlers (plugins_app/api/errors.py) and logged as Django logs them. Everything else (another
method or path, a Host Django would refuse, cookies, a body too large, a repeated header) goes on to Django with
the body replayed, and the django-ninja route (plugins_app/api/context_engine.py, also the OpenAPI description)
answers it: each request is parsed once, on one path or the other. tests/app/test_api_hook_lean.py compares both
paths; with settings this module does not stand in for (other middleware, HTTPS redirects or HSTS) every call goes
to Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re

from django.conf import settings
from django.http import HttpResponse
from django.http.request import split_domain_port, validate_host
from django.utils.log import log_response
from ninja.errors import AuthenticationError

from engine import hook_requests
from engine.hooks import ALL_HOOKS
from plugins_app.api.app import api
from plugins_app.api.context_engine import HOOKS_ACTION, agent_call
from plugins_app.auth import admit, bearer_token, token_cache
from plugins_app.services import hooks as hook_service

log = logging.getLogger("librefang.api")
HOOK_PATH = re.compile(r"/api(?:/v1)?/context-engine/hooks/([a-z_]+)")
HOOKS = frozenset(ALL_HOOKS)
# The middleware whose effect on these answers this module reproduces (see _middleware_headers); with any other
# list, Django answers every call.
STOOD_IN_FOR = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",  # the route never reads the session: no cookie, no Vary
    "django.middleware.common.CommonMiddleware",  # Content-Length; the Host check is done here
    "django.middleware.csrf.CsrfViewMiddleware",  # csrf-exempt with bearer auth; requests with cookies go to Django
    "django.contrib.auth.middleware.AuthenticationMiddleware",  # lazy: untouched
    "django.contrib.messages.middleware.MessageMiddleware",  # untouched storage: no cookie
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",  # request attribute only
    "plugins_app.middleware.ContentSecurityPolicy",  # HTML pages only: nothing on a JSON answer
    "plugins_app.middleware.DatabaseDownPage",  # dashboard pages only (never /api/)
    "axes.middleware.AxesMiddleware",  # login lockouts only
]


def _middleware_headers() -> list[tuple[bytes, bytes]] | None:
    """The headers Django's middleware adds to a hook route's answer, or None when this module cannot stand in."""
    if (list(settings.MIDDLEWARE) != STOOD_IN_FOR or settings.SECURE_SSL_REDIRECT or settings.SECURE_HSTS_SECONDS
            or settings.FORCE_SCRIPT_NAME or settings.USE_X_FORWARDED_HOST or settings.PREPEND_WWW):
        return None
    headers = []
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append(("X-Content-Type-Options", "nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        policy = settings.SECURE_REFERRER_POLICY
        headers.append(("Referrer-Policy", policy if isinstance(policy, str) else ",".join(policy)))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append(("Cross-Origin-Opener-Policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
    headers.append(("X-Frame-Options", getattr(settings, "X_FRAME_OPTIONS", "DENY").upper()))
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


class LeanHookRoutes:
    """ASGI middleware: answers the hook calls Django would hand to the route as they are (refusals included) itself,
    passes everything else to `app` (Django)."""

    def __init__(self, app):
        self.app = app
        self._extra: list[tuple[bytes, bytes]] | None = None
        self._settings_read = False

    def hook_of(self, scope) -> str | None:
        """The hook a request may be answered here for, or None."""
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("root_path"):
            return None
        match = HOOK_PATH.fullmatch(scope.get("path", ""))
        if match is None or match.group(1) not in HOOKS:
            return None
        if not self._settings_read:
            self._extra, self._settings_read = _middleware_headers(), True
            if self._extra is None:
                log.warning("hook calls go through Django's middleware: the settings differ from what "
                            "plugins_app/api/hook_asgi.py stands in for (STOOD_IN_FOR)")
        return match.group(1) if self._extra is not None else None

    async def __call__(self, scope, receive, send):
        hook = self.hook_of(scope)
        if hook is None:
            return await self.app(scope, receive, send)
        headers = _single_headers(scope.get("headers") or ())
        limit = settings.LIBREFANG_MAX_BODY_BYTES
        chunks, complete = await _read_body(receive, limit)
        if chunks is None:  # the client went away before sending its request: nobody to answer
            return
        body = b"".join(chunks)
        if not (complete and headers is not None and _plain_request(headers, len(body), limit)):
            # Not a request Django would hand to the route as it is: Django answers, reading the same body.
            return await self.app(scope, _replaying(body, complete, receive), send)
        try:
            call = agent_call(hook, await _token(headers.get(b"authorization")), body)
        except Exception as exc:  # a refusal, or the token store failing: the route's answer either way
            return await self._send_response(_rendered(scope, exc), send)
        return await self._answer(scope, call, receive, send)

    async def _answer(self, scope, call: hook_requests.AgentRequest, receive, send) -> None:
        # As Django's ASGIHandler: a client that disconnects while waiting cancels its call.
        answering = asyncio.ensure_future(self._call_and_send(scope, call, send))
        listener = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait([answering, listener], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (listener, answering):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if answering.done() and not answering.cancelled():
            answering.result()

    async def _call_and_send(self, scope, call: hook_requests.AgentRequest, send) -> None:
        try:
            answer = await hook_service.answer(call)
        except Exception as exc:
            return await self._send_response(_rendered(scope, exc), send)  # the route's 500 envelope
        head = [(b"Content-Type", b"application/json")]
        head += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()]
        await self._send(answer.status, head, answer.body, send)

    async def _send_response(self, response: HttpResponse, send) -> None:
        head = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
        await self._send(response.status_code, head, response.content, send)

    async def _send(self, status: int, head: list[tuple[bytes, bytes]], body: bytes, send) -> None:
        head += self._extra or []
        head.append((b"Content-Length", str(len(body)).encode()))
        with contextlib.suppress(OSError):  # the client went away meanwhile
            await send({"type": "http.response.start", "status": status, "headers": head})
            await send({"type": "http.response.body", "body": body})


def _rendered(scope, exc: Exception) -> HttpResponse:
    """What the route answers for `exc`, rendered by the API's exception handlers (plugins_app/api/errors.py: 401,
    403, 400, 413, or 500 logged with its traceback) and logged as Django logs an error answer."""
    response = api.on_exception(None, exc)
    log_response("%s: %s", response.reason_phrase, scope.get("path", ""), response=response)
    return response


async def _read_body(receive, limit: int) -> tuple[list[bytes] | None, bool]:
    """The body's chunks (None if the client disconnected) and whether that is the whole body: reading stops past
    `limit`, the rest is left for Django."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, False
        chunk = message.get("body", b"")
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
        if not message.get("more_body", False):
            return chunks, True
        if size > limit:
            return chunks, False


def _replaying(body: bytes, complete: bool, receive):
    """`receive` for Django: the body read so far as one message, then whatever the client still sends."""
    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replay


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _single_headers(raw) -> dict[bytes, bytes] | None:
    """The request's headers, or None when one that matters here is repeated (Django joins repeats with ",")."""
    headers: dict[bytes, bytes] = {}
    for name, value in raw:
        if name in headers and name in (b"authorization", b"host", b"content-length"):
            return None
        headers[name] = value
    return headers


def _plain_request(headers: dict[bytes, bytes], size: int, limit: int) -> bool:
    """A request Django would hand to the route as it is: a Host it accepts, a body within the limit, no cookies
    (the CSRF middleware replaces a malformed csrftoken cookie in its answer; agents send none)."""
    if b"cookie" in headers:
        return False
    length = headers.get(b"content-length")
    if length is not None and (not length.isdigit() or int(length) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE):
        return False
    if size > limit:
        return False
    host = headers.get(b"host")
    if host is None:
        return False
    domain, _port = split_domain_port(host.decode("latin-1"))
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


async def _token(authorization: bytes | None):
    """The token of a `Bearer` header when it may call hooks; AuthenticationError (401) or a 403 ServiceError."""
    raw = bearer_token(authorization)
    found = admit(await token_cache.lookup(raw), HOOKS_ACTION) if raw else None
    if found is None:
        raise AuthenticationError()
    return found
