"""Bearer-token auth with roles. Missing/wrong/revoked tokens get 401; a valid token without the role gets 403.

A route never names a role: it names its action (its operation id, or its router's `action`) and the role comes
from plugins_app.auth.ACTION_ROLES, the table the dashboard reads too (ActionRouter)."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from ninja import Router
from ninja.constants import NOT_SET
from ninja.security import HttpBearer

from plugins_app.auth import ACTION_ROLES, admit, bearer_token, lookup, token_cache


class TokenAuth(HttpBearer):
    """A route's token check for one action of ACTION_ROLES (read at each call: the table is the one source)."""

    def __init__(self, action: str):
        super().__init__()
        if action not in ACTION_ROLES:
            raise ImproperlyConfigured(f"action {action!r} has no role in plugins_app.auth.ACTION_ROLES")
        self.action = action

    @property
    def required(self) -> str:
        return ACTION_ROLES[self.action]

    def __call__(self, request: HttpRequest):
        raw = bearer_token(request.headers.get(self.header))
        return self.authenticate(request, raw) if raw else None

    def authenticate(self, request, token: str):
        return self.admit(lookup(token))

    def admit(self, found):
        """The token's row when it may call this route; None (401) for an unknown token; 403 when its role falls
        short (plugins_app/auth.py admit)."""
        return admit(found, self.action)


class CachedHookAuth(TokenAuth):
    """The hook routes' token check through the per-process token cache (plugins_app/auth.py TokenCache): agents
    call many times a second with the same token, so only a cache miss costs a query and a thread hop."""

    is_async = True  # django-ninja awaits __call__

    async def __call__(self, request: HttpRequest):  # type: ignore[override]
        raw = bearer_token(request.headers.get(self.header))
        return self.admit(await token_cache.lookup(raw)) if raw else None


class ActionRouter(Router):
    """A router whose routes take their auth from ACTION_ROLES: each route's action is the router's `action` when
    it has one (every route of it needs the same), else the route's operation id. A public route says auth=None;
    any other `auth=`, or an action missing from the table, is refused when the route is declared."""

    def __init__(self, *, action: str | None = None, auth_class: type[TokenAuth] = TokenAuth, **kwargs):
        super().__init__(**kwargs)
        self.action = action
        self.auth_class = auth_class

    def add_api_operation(self, path, methods, view_func, *, auth=NOT_SET, operation_id=None, **kwargs):
        if auth is NOT_SET:
            action = self.action or operation_id
            if action is None:
                raise ImproperlyConfigured(f"route {path!r} names no action (operation_id)")
            auth = self.auth_class(action)
        elif auth is not None:
            raise ImproperlyConfigured(f"route {path!r}: a route names its action, not its auth (ACTION_ROLES)")
        return super().add_api_operation(path, methods, view_func, auth=auth, operation_id=operation_id, **kwargs)


def route_roles(api) -> dict[str, str]:
    """operation id -> what its token auth requires, for every route of `api` that has one."""
    roles = {}
    for _prefix, router in api._routers:
        for path_view in router.path_operations.values():
            for op in path_view.operations:
                required = next((cb.required for cb in op.auth_callbacks if isinstance(cb, TokenAuth)), None)
                if required is not None:
                    roles[op.operation_id or api.get_openapi_operation_id(op)] = str(required)
    return roles


def actor(request) -> str:
    token = getattr(request, "auth", None)
    return f"token:{token.name}" if token is not None else "anonymous"
