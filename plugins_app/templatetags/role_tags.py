"""`user|may:"plugins_export"`: whether the dashboard user's role allows an action of plugins_app.auth.ACTION_ROLES,
so a page shows only the buttons its viewer can use (plugins_app/views/roles.py makes the same check on POST)."""

from django import template

from plugins_app.auth import required_role, role_may
from plugins_app.selectors.dashboard import user_role

register = template.Library()


@register.filter
def may(user, action: str) -> bool:
    return role_may(user_role(user), required_role(action))
