"""API bearer tokens: hashing, lookup and role checks. Tokens are stored only as sha256."""

from __future__ import annotations

import hashlib
import secrets

from django.utils import timezone

from plugins_app.models import ApiToken, Role

TOKEN_PREFIX = "lf_"
# Higher number = more power. An agent token may only call context-engine hooks (and read health).
ROLE_RANK = {Role.AGENT: 0, Role.VIEWER: 1, Role.ADMIN: 2, Role.OWNER: 3}


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def lookup(raw: str | None) -> ApiToken | None:
    """The active token for a raw bearer string, or None (missing, unknown or revoked)."""
    if not raw or len(raw) > 200:
        return None
    try:
        token = ApiToken.objects.get(token_hash=hash_token(raw.strip()))
    except ApiToken.DoesNotExist:
        return None
    if token.revoked_at is not None:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def allows(token: ApiToken, required: str) -> bool:
    """Whether `token`'s role may do what needs `required`. Agent tokens are a separate lane: they can call hooks
    and nothing else, and only an agent, admin or owner token may call hooks."""
    if required == Role.AGENT:
        return token.role in (Role.AGENT, Role.ADMIN, Role.OWNER)
    if token.role == Role.AGENT:
        return False
    return ROLE_RANK[Role(token.role)] >= ROLE_RANK[Role(required)]
