"""Permission checks for dashboard views, from the same action table as the API (plugins_app.auth.ACTION_ROLES).

Dashboard users map to API roles (plugins_app.selectors.dashboard.user_role): superusers and the "owner" group are
owners, staff are admins, everyone else reads.
"""

from __future__ import annotations

import asyncio
import functools

from asgiref.sync import sync_to_async
from django.shortcuts import render

from plugins_app.auth import required_role, role_may
from plugins_app.models import Role
from plugins_app.selectors import dashboard

ROLE_NAMES = {Role.OWNER.value, Role.ADMIN.value, Role.VIEWER.value}


def actor(request) -> str:
    return f"user:{request.user.get_username()}"


def needed_role(action: str, view_kwargs: dict) -> str:
    """`action` is a key of ACTION_ROLES, possibly with `{kwarg}` placeholders filled from the view's URL
    (e.g. "plugins_{action}"), or a bare role name for pages the API has no counterpart of."""
    if action in ROLE_NAMES:
        return action
    try:
        key = action.format(**view_kwargs)
    except (KeyError, IndexError):
        return Role.OWNER
    return required_role(key)


def user_may(user, action: str, view_kwargs: dict | None = None) -> bool:
    return role_may(dashboard.user_role(user), needed_role(action, view_kwargs or {}))


def role_required(action: str):
    """Refuse (403) a user whose role does not allow `action` (see needed_role)."""

    def decorate(view):
        if asyncio.iscoroutinefunction(view):
            @functools.wraps(view)
            async def async_wrapper(request, *args, **kwargs):
                user = await request.auser()
                if not await sync_to_async(user_may)(user, action, kwargs):
                    return await sync_to_async(forbidden)(request, needed_role(action, kwargs))
                return await view(request, *args, **kwargs)
            return async_wrapper

        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            if not user_may(request.user, action, kwargs):
                return forbidden(request, needed_role(action, kwargs))
            return view(request, *args, **kwargs)
        return wrapper
    return decorate


def forbidden(request, role: str):
    if request.htmx:
        return render(request, "plugins_app/partials/action_feedback.html", {
            "ok": False, "action": "not allowed", "message": f"this needs the {role} role"}, status=403)
    return render(request, "plugins_app/forbidden.html", {"role": role}, status=403)
