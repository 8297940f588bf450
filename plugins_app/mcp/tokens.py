"""Bearer tokens for /mcp: the API's tokens, through the same per-process cache as the hook routes
(plugins_app/auth.py TokenCache): an MCP client sends its token on every POST of a session."""

from __future__ import annotations

from plugins_app.auth import required_role, role_may, token_cache
from plugins_app.models import ApiToken

TOKEN_CACHE_SECS = token_cache.secs  # how long a revoked token may still open a session


async def resolve(raw: str) -> ApiToken | None:
    """The active token for `raw`, from the per-process cache the hook routes use too, or one query."""
    return await token_cache.lookup(raw)


# Each MCP tool or resource needs what its REST route needs (plugins_app/auth.py ACTION_ROLES).

def may_call_hooks(role: str) -> bool:
    return role_may(role, required_role("hooks_call"))  # as POST /api/context-engine/hooks/<hook>


def may_manage_memories(role: str) -> bool:
    return role_may(role, required_role("memories_manage"))  # as /api/memories


def may_read(role: str) -> bool:
    return role_may(role, required_role("plugins_list"))  # as GET /api/plugins


def may_run_tools(role: str) -> bool:
    return role_may(role, required_role("tools_execute"))  # as POST /api/tools/{id}/execute


def may_connect(role: str) -> bool:
    return may_call_hooks(role) or may_manage_memories(role) or may_read(role) or may_run_tools(role)
