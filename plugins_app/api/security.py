"""Bearer-token auth with roles. Missing/wrong/revoked tokens get 401; a valid token without the role gets 403."""

from __future__ import annotations

from ninja.security import HttpBearer

from plugins_app.api.errors import ApiError
from plugins_app.auth import allows, lookup, required_role
from plugins_app.models import Role


class TokenAuth(HttpBearer):
    def __init__(self, required: str):
        super().__init__()
        self.required = required

    def authenticate(self, request, token: str):
        return self.admit(lookup(token))

    def admit(self, found):
        """The token's row when it may call this route; None (401) for an unknown token; 403 when its role falls
        short."""
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


def for_action(action: str) -> TokenAuth:
    """The auth for a route, from the one action table (plugins_app.auth.ACTION_ROLES) the dashboard also reads."""
    return {Role.OWNER: OWNER, Role.ADMIN: ADMIN, Role.VIEWER: VIEWER, Role.AGENT: AGENT}[Role(required_role(action))]


def route_roles(api) -> dict[str, str]:
    """operation id -> the role its token auth requires, for every route of `api` (to check it against the table)."""
    roles = {}
    for _prefix, router in api._routers:
        for path_view in router.path_operations.values():
            for op in path_view.operations:
                required = next((getattr(cb, "required", None) for cb in op.auth_callbacks), None)
                if required is not None and op.operation_id:
                    roles[op.operation_id] = str(Role(required).value)
    return roles


def actor(request) -> str:
    token = getattr(request, "auth", None)
    return f"token:{token.name}" if token is not None else "anonymous"
