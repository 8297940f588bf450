"""API bearer tokens: hashing, lookup and role checks. Tokens are stored only as sha256."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
import time
from collections.abc import Iterable

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from engine.errors import ServiceError
from plugins_app.models import ApiToken, Role

log = logging.getLogger("librefang.auth")
TOKEN_PREFIX = "lf_"
# last_used_at is written at most this often per token: it says "in use lately", not "used at this instant".
TOUCH_EVERY_SECS = 60
# Higher number = more power. An agent token may only call context-engine hooks (and read health).
ROLE_RANK = {Role.AGENT: 0, Role.VIEWER: 1, Role.ADMIN: 2, Role.OWNER: 3}


def bearer_token(authorization: str | bytes | None) -> str:
    """The token of an `Authorization: Bearer <token>` value; '' for none or another scheme. The one parser of the
    API's routes, the hook calls answered before Django (plugins_app/api/hook_asgi.py), /mcp and the websockets."""
    if not authorization:
        return ""
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, _, raw = authorization.partition(" ")
    return raw.strip() if scheme.lower() == "bearer" else ""


def headers_bearer(headers: Iterable[tuple[bytes | str, bytes | str]] | dict) -> str:
    """bearer_token() of a request's Authorization header, from ASGI headers (a list of byte pairs) or a mapping."""
    items = headers.items() if isinstance(headers, dict) else headers
    for name, value in items:
        name = name.decode("latin-1") if isinstance(name, bytes) else name
        if name.lower() == "authorization":
            return bearer_token(value)
    return ""


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def find(raw: str | None) -> ApiToken | None:
    """The active token for a raw bearer string, or None (missing, unknown or revoked)."""
    if not raw or len(raw) > 200:
        return None
    try:
        token = ApiToken.objects.get(token_hash=hash_token(raw.strip()))
    except ApiToken.DoesNotExist:
        return None
    return token if token.revoked_at is None else None


def touch_due(token: ApiToken) -> bool:
    return token.last_used_at is None or (timezone.now() - token.last_used_at).total_seconds() > TOUCH_EVERY_SECS


def touch(token: ApiToken) -> None:
    token.last_used_at = timezone.now()
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=token.last_used_at)


def lookup(raw: str | None) -> ApiToken | None:
    """find(), noting the use (at most once a minute)."""
    token = find(raw)
    if token is not None and touch_due(token):
        touch(token)
    return token


def _touch_in_background(token: ApiToken) -> None:
    """In a pool thread: the agent's call does not wait for this write (SQLite may make it wait for the lock)."""
    try:
        touch(token)
    except Exception:  # only a "last used" note: the call it belongs to has been answered
        log.warning("could not note the use of token %s", token.pk, exc_info=True)
    finally:
        close_old_connections()


class TokenCache:
    """Looked-up tokens kept for `secs` per process, for callers that see the same token many times a second (agents
    on the hook routes, MCP clients on every message): one query per token per `secs` instead of one per call, and
    no hop to Django's sync thread on a hit. A revoked token or a changed role takes effect within `secs`. The
    `last_used_at` note is written off the caller's path, at most once a minute per token."""

    def __init__(self, secs: float = 5.0, max_entries: int = 1000):
        self.secs = secs
        self.max_entries = max_entries
        self.entries: dict[str, tuple[float, ApiToken]] = {}

    async def lookup(self, raw: str) -> ApiToken | None:
        if not raw:
            return None
        key = hash_token(raw.strip())
        hit = self.entries.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        found = await sync_to_async(find)(raw)
        if found is None:
            self.entries.pop(key, None)
            return None
        if touch_due(found):
            asyncio.get_running_loop().run_in_executor(None, _touch_in_background, found)
        if len(self.entries) >= self.max_entries:
            self.entries.clear()
        self.entries[key] = (time.monotonic() + self.secs, found)
        return found


token_cache = TokenCache()


def allows(token: ApiToken, required: str) -> bool:
    """Whether `token`'s role may do what needs `required`. Agent tokens are a separate lane: they can call hooks
    and nothing else, and only an agent, admin or owner token may call hooks."""
    return role_may(token.role, required)


# Two requirements that are not a rank: any token's role (listing WASM tools), and the roles that run a tool's
# module code (agents and the owner: never a viewer, nor an admin, who may only stop tools).
ANY_ROLE = "any_role"
AGENT_OR_OWNER = "agent_or_owner"

# What each action needs, for API tokens and dashboard users alike: every API route takes its role from here by its
# action (plugins_app/api/security.py ActionRouter: the route's operation id, or its router's action); the
# dashboard's checks (plugins_app/views/roles.py) and buttons (plugins_app/templatetags/role_tags.py) read it too,
# and dashboard-only actions have a key of their own. Changing plugin code, or letting it run, is the owner's:
# reload re-reads the code from disk and enable lets it run again; admins may stop plugins and tools and change the
# engine configuration; viewers read; agents call hooks and the memory API.
ACTION_ROLES: dict[str, str] = {
    # agents' calls (plugins_app/api/context_engine.py, memories.py)
    "hooks_call": Role.AGENT,
    "memories_manage": Role.AGENT,
    # the context engine: metrics, traces, chain, configuration (plugins_app/api/context_engine*.py)
    "metrics_get": Role.VIEWER,
    "metrics_summary": Role.VIEWER,
    "metrics_prometheus": Role.VIEWER,
    "metrics_reset": Role.ADMIN,
    "traces_list": Role.VIEWER,
    "traces_history": Role.VIEWER,
    "traces_get": Role.VIEWER,
    "engine_chain": Role.VIEWER,
    "engine_config_get": Role.VIEWER,
    "engine_config_put": Role.ADMIN,
    "engine_health": Role.VIEWER,
    "context_engine_metrics_per_agent": Role.VIEWER,
    "context_engine_sandbox_policy": Role.VIEWER,
    # plugins (plugins_app/api/plugins.py, permissions.py)
    "plugins_list": Role.VIEWER,
    "plugins_doctor": Role.VIEWER,
    "plugins_registries": Role.VIEWER,
    "plugins_registry_search": Role.VIEWER,
    "plugins_get": Role.VIEWER,
    "plugins_status": Role.VIEWER,
    "plugins_health": Role.VIEWER,
    "plugins_lint": Role.VIEWER,
    "plugins_update_check": Role.VIEWER,
    "plugins_state": Role.VIEWER,
    "plugins_env": Role.VIEWER,
    "plugins_advanced_config": Role.VIEWER,
    "plugins_permissions": Role.VIEWER,  # what a plugin asks beyond the defaults
    "plugins_scaffold": Role.OWNER,
    "plugins_install": Role.OWNER,
    "plugins_install_with_deps": Role.OWNER,
    "plugins_update": Role.OWNER,
    "plugins_install_deps": Role.OWNER,
    "plugins_test_hook": Role.OWNER,
    "plugins_reload": Role.OWNER,
    "plugins_enable": Role.OWNER,
    "plugins_benchmark": Role.OWNER,
    "plugins_batch": Role.OWNER,
    "plugins_prewarm": Role.OWNER,
    "plugins_prewarm_one": Role.OWNER,
    "plugins_env_set": Role.OWNER,
    "plugins_advanced_config_set": Role.OWNER,
    "plugins_approve": Role.OWNER,  # the owner's approval of those asks
    "plugins_disable": Role.ADMIN,
    "plugins_uninstall": Role.ADMIN,
    "plugins_export": Role.ADMIN,
    "plugins_state_wipe": Role.ADMIN,
    # WASM tools (plugins_app/api/tools.py)
    "tools_list": ANY_ROLE,
    "tools_get": ANY_ROLE,
    "tools_execute": AGENT_OR_OWNER,
    "tools_install": Role.OWNER,
    "tools_package": Role.OWNER,
    "tools_enable": Role.ADMIN,
    "tools_disable": Role.ADMIN,
    "tools_remove": Role.ADMIN,
    "tokens_manage": Role.OWNER,  # the dashboard's Tokens page and /api/tokens (as `librefang token`)
    "alerts_configure": Role.ADMIN,  # dashboard only: [alerts] rules, thresholds and webhooks in config.toml
}


def required_role(action: str) -> str:
    """The role an action needs; an action missing from the table needs the owner (fail closed)."""
    return ACTION_ROLES.get(action, Role.OWNER)


def role_may(role: str | None, required: str) -> bool:
    """Whether a holder of `role` (a dashboard user's or a token's) may do what needs `required`; see allows()."""
    if role is None:
        return False
    if required == ANY_ROLE:
        return True
    if required == AGENT_OR_OWNER:
        return role in (Role.AGENT, Role.OWNER)
    if required == Role.AGENT:
        return role in (Role.AGENT, Role.ADMIN, Role.OWNER)
    if role == Role.AGENT:
        return False
    return ROLE_RANK[Role(role)] >= ROLE_RANK[Role(required)]


def describe_role(required: str) -> str:
    """`required` as a refusal names it ("this route needs …")."""
    return {ANY_ROLE: "an agent or viewer (or higher) role",
            AGENT_OR_OWNER: "the agent or owner role"}.get(required, f"the {required} role")


def admit(token: ApiToken | None, action: str) -> ApiToken | None:
    """`token` when its role may do `action` (ACTION_ROLES); None when there is no such token (the caller answers
    401); a ServiceError 403 when its role falls short. Every API route's check (plugins_app/api/security.py), and the
    hook calls answered before Django (plugins_app/api/hook_asgi.py)."""
    if token is None:
        return None
    required = ACTION_ROLES[action]
    if not role_may(token.role, required):
        raise ServiceError("forbidden", f"this route needs {describe_role(required)}; the token has {token.role}", 403)
    return token


# ---- agents are tenants: tokens bound to agent ids ----

# An agent id, or a prefix of agent ids when it ends with "*" ("planner-*"); no other "*", nothing blank.
AGENT_PATTERN = re.compile(r"(?=.{1,200}$)[^*\s][^*]*\*?", re.DOTALL)
MAX_AGENT_PATTERNS = 64


def clean_agent_patterns(role: str, values: Iterable[str] | None) -> list[str]:
    """The binding of a new token, checked: only agent tokens are bound (admins and owners see every agent)."""
    patterns = list(dict.fromkeys(v.strip() for v in (values or []) if v and v.strip()))
    if not patterns:
        return []
    if role != Role.AGENT:
        raise ValueError(f"only agent tokens are bound to agents; a {role} token sees every agent")
    bad = [p for p in patterns if not AGENT_PATTERN.fullmatch(p)]
    if bad:
        raise ValueError(f"not an agent id or prefix: {', '.join(map(repr, bad))} (a trailing * makes a prefix; "
                         "no other *, at most 200 characters)")
    if len(patterns) > MAX_AGENT_PATTERNS:
        raise ValueError(f"at most {MAX_AGENT_PATTERNS} agent ids per token")
    return patterns


def is_bound(token: ApiToken) -> bool:
    return token.role == Role.AGENT and bool(token.agent_ids)


def may_act_for(token: ApiToken, agent_id: str) -> bool:
    """Whether `token` may call hooks, tools and the memory API for `agent_id`: admins, owners and unbound agent
    tokens for every agent; a bound agent token only for the ids (or prefixes, "x*") it is bound to."""
    if not is_bound(token):
        return True
    return any(agent_id.startswith(p[:-1]) if p.endswith("*") else agent_id == p for p in token.agent_ids)


class AgentForbidden(ServiceError):
    """A bound token naming an agent it is not bound to (or a call that concerns every agent)."""

    def __init__(self, token: ApiToken, refused: list[str] | None):
        bound_to = ", ".join(token.agent_ids)
        if refused is None:
            message = f"this call concerns every agent; the token is bound to {bound_to}"
        else:
            message = f"the token is bound to {bound_to}; not to {', '.join(map(repr, refused))}"
        super().__init__("agent_forbidden", message, 403, {"agent_ids": refused, "bound_to": list(token.agent_ids)})


def refused_agents(token: ApiToken, agent_ids: list[str] | None) -> AgentForbidden | None:
    """Why `token` may not make a call naming `agent_ids` (None: a call that concerns every agent), or None."""
    if not is_bound(token):
        return None
    if agent_ids is None:
        return AgentForbidden(token, None)
    refused = [a for a in agent_ids if not may_act_for(token, a)]
    return AgentForbidden(token, refused) if refused else None


def check_agents(token: ApiToken | None, agent_ids: list[str] | None) -> None:
    """Raise AgentForbidden (403) unless `token` may act for every one of `agent_ids`."""
    problem = refused_agents(token, agent_ids) if token is not None else None
    if problem is not None:
        raise problem
