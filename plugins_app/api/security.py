"""Bearer-token auth with roles. Missing/wrong/revoked tokens get 401; a valid token without the role gets 403."""

from __future__ import annotations

from ninja.security import HttpBearer

from plugins_app.api.errors import ApiError
from plugins_app.auth import allows, lookup
from plugins_app.models import Role


class TokenAuth(HttpBearer):
    def __init__(self, required: str):
        super().__init__()
        self.required = required

    def authenticate(self, request, token: str):
        found = lookup(token)
        if found is None:
            return None
        if not allows(found, self.required):
            raise ApiError(403, "forbidden", f"this route needs the {self.required} role; the token has "
                                             f"{found.role}")
        return found


OWNER = TokenAuth(Role.OWNER)
ADMIN = TokenAuth(Role.ADMIN)
VIEWER = TokenAuth(Role.VIEWER)
AGENT = TokenAuth(Role.AGENT)


def actor(request) -> str:
    token = getattr(request, "auth", None)
    return f"token:{token.name}" if token is not None else "anonymous"
