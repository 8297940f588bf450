"""Creating and revoking API tokens."""

from __future__ import annotations

from django.utils import timezone

from plugins_app.auth import generate_token, hash_token
from plugins_app.models import ApiToken, AuditEntry, Role


def create_token(name: str, role: str, created_by=None, actor: str = "cli") -> tuple[ApiToken, str]:
    """Returns (token row, raw token). The raw token is shown once and never stored."""
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}; choose one of {', '.join(Role.values)}")
    name = (name or "").strip()
    if not name:
        raise ValueError("a token needs a name")
    raw = generate_token()
    token = ApiToken.objects.create(name=name[:100], role=role, token_hash=hash_token(raw), prefix=raw[:10],
                                    created_by=created_by)
    AuditEntry.objects.create(actor=actor, action="token.create", target=token.name, details={"role": role,
                                                                                              "prefix": token.prefix})
    return token, raw


def revoke_token(token_id: int, actor: str = "cli") -> ApiToken:
    token = ApiToken.objects.get(pk=token_id)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        AuditEntry.objects.create(actor=actor, action="token.revoke", target=token.name,
                                  details={"prefix": token.prefix})
    return token
