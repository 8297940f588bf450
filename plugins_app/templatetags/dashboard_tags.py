"""Small template helpers for the dashboard."""

from __future__ import annotations

import json

from django import template

from plugins_app.selectors.dashboard import is_owner as _is_owner

register = template.Library()


@register.filter
def is_owner(user) -> bool:
    return _is_owner(user)


@register.filter
def pretty_json(value) -> str:
    """Indented JSON for <pre> blocks; strings that already hold JSON are re-indented."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def percent(value) -> str:
    if value is None:
        return "—"
    return f"{float(value) * 100:.1f} %"


@register.filter
def parse_iso(value):
    """An ISO-8601 string (as selectors return them) as a datetime for |timesince and friends."""
    import datetime as dt

    if not isinstance(value, str):
        return value
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None
