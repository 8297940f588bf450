"""Bearer tokens for /mcp: the API's tokens (plugins_app/auth.py), looked up once per TOKEN_CACHE_SECS per process.

An MCP client sends its token on every POST of a session; a query per message would cost more than the call. A
revoked token or a changed role takes effect within the cache time, as for the hook routes
(plugins_app/api/context_engine.py CachedHookAuth)."""

from __future__ import annotations

import time

from asgiref.sync import sync_to_async

from plugins_app.auth import hash_token, lookup, role_may
from plugins_app.models import ApiToken, Role

TOKEN_CACHE_SECS = 5.0
CACHE_MAX = 1000
_cache: dict[str, tuple[float, ApiToken]] = {}


def bearer(headers: list[tuple[bytes, bytes]] | dict) -> str:
    """The raw bearer token of a request's headers ('' when there is none)."""
    items = headers.items() if isinstance(headers, dict) else headers
    for name, value in items:
        name = name.decode("latin-1") if isinstance(name, bytes) else name
        if name.lower() == "authorization":
            value = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, raw = value.partition(" ")
            return raw.strip() if scheme.lower() == "bearer" else ""
    return ""


async def resolve(raw: str) -> ApiToken | None:
    """The active token for `raw`, from the cache or one query."""
    if not raw:
        return None
    key = hash_token(raw)
    hit = _cache.get(key)
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    found = await sync_to_async(lookup)(raw)
    if found is None:
        _cache.pop(key, None)
        return None
    if len(_cache) >= CACHE_MAX:
        _cache.clear()
    _cache[key] = (time.monotonic() + TOKEN_CACHE_SECS, found)
    return found


def may_call_hooks(role: str) -> bool:
    return role_may(role, Role.AGENT)


def may_read(role: str) -> bool:
    return role_may(role, Role.VIEWER)


def may_run_tools(role: str) -> bool:
    # as POST /api/tools/{id}/execute (plugins_app/api/tools.py RUN): module code runs for agents and the owner
    return role in (Role.AGENT, Role.OWNER)


def may_connect(role: str) -> bool:
    return may_call_hooks(role) or may_read(role)
