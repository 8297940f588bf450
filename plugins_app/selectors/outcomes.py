"""A plugin's health from what its calls did, per hook, not from its configuration (healthchecks' up / down).

A plugin is **failing** a hook when, over the last WINDOW_MINUTES, at least MIN_FAILURES of its agent calls of that
hook failed and they are at least FAILING_RATE of those calls (each failure was answered by the default engine or
the next layer). Test-console runs are not agent traffic and do not count. Every place that shows a plugin's state
reads this (the plugin badge, the chain, engine health, the doctor, the list filter, /api/health), so they agree.
"""

from __future__ import annotations

import datetime as dt
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone

from plugins_app.models import HookMetric, HookMetricBucket

WINDOW_MINUTES = 10
MIN_FAILURES = 3
FAILING_RATE = 0.5


def traces_url(plugin: str, hook: str) -> str:
    """The trace explorer, showing this plugin's failed calls of this hook."""
    return reverse("traces") + "?" + urlencode({"plugin": plugin, "hook": hook, "outcome": "failed"})


def recent_by_hook(plugin: str | None = None, now: dt.datetime | None = None) -> dict[str, dict[str, dict]]:
    """{plugin: {hook: {calls, failures, error_rate, failing}}} for the agent calls of the last WINDOW_MINUTES."""
    since = (now or timezone.now()) - dt.timedelta(minutes=WINDOW_MINUTES)
    qs = HookMetricBucket.objects.filter(minute__gte=since.replace(second=0, microsecond=0))
    if plugin is not None:
        qs = qs.filter(plugin=plugin)
    out: dict[str, dict[str, dict]] = {}
    for name, hook, calls, failures in qs.values_list("plugin", "hook", "calls", "failures"):
        row = out.setdefault(name, {}).setdefault(hook, {"calls": 0, "failures": 0})
        row["calls"] += calls
        row["failures"] += failures
    for hooks in out.values():
        for row in hooks.values():
            row["error_rate"] = round(row["failures"] / row["calls"], 4) if row["calls"] else 0.0
            row["failing"] = row["failures"] >= MIN_FAILURES and row["error_rate"] >= FAILING_RATE
    return out


def failing(plugin: str | None = None, now: dt.datetime | None = None) -> dict[str, dict[str, dict]]:
    """{plugin: {hook: {calls, failures, error_rate, last_error, last_error_kind, traces_url}}}, failing hooks only."""
    bad = {name: {hook: row for hook, row in hooks.items() if row["failing"]}
           for name, hooks in recent_by_hook(plugin, now).items()}
    bad = {name: hooks for name, hooks in bad.items() if hooks}
    if not bad:
        return {}
    errors = {(m.plugin, m.hook): m for m in HookMetric.objects.filter(plugin__in=list(bad))}
    for name, hooks in bad.items():
        for hook, row in hooks.items():
            m = errors.get((name, hook))
            row.update({"last_error": (m.last_error if m else "") or "", "last_error_kind": (m.last_error_kind if m
                        else "") or "", "traces_url": traces_url(name, hook), "window_minutes": WINDOW_MINUTES})
    return bad


def describe(plugin: str, hook: str, row: dict) -> str:
    """One line for a failing hook: how many calls failed, and the last error."""
    text = (f"{plugin} is failing its {hook} hook: {row['failures']} of {row['calls']} agent calls failed in the "
            f"last {WINDOW_MINUTES} min")
    if row.get("last_error_kind"):
        text += f" (last error: {row['last_error_kind']}"
        text += f": {row['last_error'][:200]})" if row.get("last_error") else ")"
    return text


def findings(plugin: str, bad: dict[str, dict[str, dict]] | None = None) -> list[dict]:
    """The doctor's findings (engine/findings.py's shape) for the plugin's failing hooks."""
    bad = failing(plugin) if bad is None else bad
    return [{"id": "outcomes.failing", "severity": "error", "message": describe(plugin, hook, row),
             "hint": "Agents get the default engine's answer for these calls.", "traces_url": row["traces_url"]}
            for hook, row in bad.get(plugin, {}).items()]
