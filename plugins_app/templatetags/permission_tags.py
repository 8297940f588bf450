"""`{% plugin_permissions name %}`: the plugin page's Permissions card (plugins_app/views/permissions.py answers
its Approve button with the same card)."""

from __future__ import annotations

from django import template

from plugins_app.selectors import permissions as perm_selectors

register = template.Library()


@register.inclusion_tag("plugins_app/partials/permissions.html", takes_context=True)
def plugin_permissions(context, name: str) -> dict:
    return {"perm": perm_selectors.permissions(name), "request": context.get("request"),
            "csrf_token": context.get("csrf_token")}
