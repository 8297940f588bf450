"""Creating and revoking API tokens."""

from __future__ import annotations

from django.utils import timezone

from plugins_app.auth import clean_agent_patterns, generate_token, hash_token
from plugins_app.models import ApiToken, AuditEntry, Role


def create_token(name: str, role: str, created_by=None, actor: str = "cli",
                 agent_ids: list[str] | None = None) -> tuple[ApiToken, str]:
    """Returns (token row, raw token). The raw token is shown once and never stored. `agent_ids` binds an agent
    token to those agents (a trailing "*" for a prefix); none: every agent."""
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}; choose one of {', '.join(Role.values)}")
    name = (name or "").strip()
    if not name:
        raise ValueError("a token needs a name")
    patterns = clean_agent_patterns(role, agent_ids)
    raw = generate_token()
    token = ApiToken.objects.create(name=name[:100], role=role, token_hash=hash_token(raw), prefix=raw[:10],
                                    created_by=created_by, agent_ids=patterns)
    AuditEntry.objects.create(actor=actor, action="token.create", target=token.name, details={
        "role": role, "prefix": token.prefix, **({"agent_ids": patterns} if patterns else {})})
    return token, raw


def describe(token: ApiToken) -> dict:
    """A token as the API and `token list --json` show it (never the token itself)."""
    return {"id": token.pk, "name": token.name, "role": token.role, "prefix": token.prefix,
            "agent_ids": list(token.agent_ids) if token.role == Role.AGENT else None,
            "active": token.active, "created_at": token.created_at.isoformat(),
            "last_used_at": token.last_used_at.isoformat() if token.last_used_at else None,
            "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None}


def revoke_token(token_id: int, actor: str = "cli") -> ApiToken:
    token = ApiToken.objects.get(pk=token_id)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        AuditEntry.objects.create(actor=actor, action="token.revoke", target=token.name,
                                  details={"prefix": token.prefix})
    return token
