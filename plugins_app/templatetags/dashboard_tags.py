"""Small template helpers for the dashboard."""

from __future__ import annotations

import json

from django import template

from plugins_app.auth import role_may
from plugins_app.selectors.dashboard import is_owner as _is_owner
from plugins_app.selectors.dashboard import user_role

register = template.Library()


@register.filter
def is_owner(user) -> bool:
    return _is_owner(user)


@register.filter
def is_admin(user) -> bool:
    """Admins and owners (pages such as Memories, which show what agents stored)."""
    return role_may(user_role(user), "admin")


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


def _as_datetime(value):
    import datetime as dt

    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value, dt.UTC)
    if isinstance(value, str) and value:
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return None


@register.filter
def ago(value) -> str:
    """A <time> saying "3 minutes ago", with the absolute UTC time on hover (title) and in datetime=.

    Accepts a datetime, an ISO-8601 string or unix seconds; "—" for nothing. Use it everywhere a relative time
    is shown, so every one of them can be read exactly."""
    from django.utils.html import format_html
    from django.utils.timesince import timesince

    when = _as_datetime(value)
    if when is None:
        return "—"
    import datetime as dt

    now = dt.datetime.now(dt.UTC)
    secs = (now - when).total_seconds()
    if abs(secs) < 2:
        words = "just now"
    elif 0 < secs < 60:
        words = f"{int(secs)} seconds ago"  # timesince would say "0 minutes"
    else:
        words = f"{timesince(when, now)} ago" if when <= now else f"in {timesince(now, when)}"
    return format_html('<time datetime="{}" title="{}">{}</time>', when.isoformat(),
                       when.strftime("%Y-%m-%d %H:%M:%S UTC"), words)


@register.filter
def absolute(value) -> str:
    """The absolute UTC time, for places that show it in full."""
    when = _as_datetime(value)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC") if when else "—"


@register.filter
def ms(value) -> str:
    """A latency in plain numbers: "609 ms", "12.4 ms", "2.31 s"; "—" without data."""
    from engine.quantiles import display_ms

    try:
        return display_ms(None if value is None or value == "" else float(value))
    except (TypeError, ValueError):
        return "—"


@register.filter
def duration(seconds) -> str:
    """Uptime-style durations: "42 s", "5 min", "3 h 12 min", "2 d 4 h"."""
    if seconds is None:
        return "—"
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


@register.filter
def clock(value) -> str:
    """A stderr line's time: <time> showing HH:MM:SS.mmm (UTC), the full date on hover; "" without a time."""
    from django.utils.html import format_html

    when = _as_datetime(value)
    if when is None:
        return ""
    return format_html('<time class="ts" datetime="{}" title="{}">{}</time>', when.isoformat(),
                       when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC", when.strftime("%H:%M:%S.%f")[:-3])
