"""Metrics in LibreFang's documented shape, plus measured percentiles, last-hour figures and chart series.

Latencies come from the mergeable sketches stored per plugin × hook (totals) and per minute (engine/quantiles.py),
so p50/p95/p99 over any range are within 1 % of the measured samples. All counts are agent traffic; test-console
runs are reported apart as `test_console`.
"""

from __future__ import annotations

import datetime as dt
import math

from django.db.models import Q
from django.utils import timezone

from engine import quantiles
from plugins_app.models import AuditEntry, HookMetric, HookMetricBucket, HookMetricHour

MAX_POINTS = 300
# Chart steps in minutes: the smallest that keeps a range under MAX_POINTS points.
STEPS_MIN = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)
MAX_RANGE = dt.timedelta(days=31)
# Matches plugins_app/services/recording.py MINUTE_RETENTION (selectors do not import services).
MINUTE_ROWS_KEPT = dt.timedelta(days=8)


def percentile(histogram: dict | None, q: float) -> float | None:
    """The q-th percentile (ms) of a latency sketch, rounded to 0.01 ms; None without data."""
    value = quantiles.quantile(histogram, q)
    return None if value is None else round(value, 2)


def hook_stats(m: HookMetric) -> dict:
    return {
        "calls": m.calls,
        "successes": m.successes,
        "failures": m.failures,
        "latency_ms_total": round(m.latency_ms_total, 3),
        "avg_ms": round(m.latency_ms_total / m.calls, 3) if m.calls else None,
        "p50_ms": percentile(m.histogram, 0.50),
        "p95_ms": percentile(m.histogram, 0.95),
        "p99_ms": percentile(m.histogram, 0.99),
        "last_error": m.last_error or None,
        "last_error_kind": m.last_error_kind or None,
        "last_called_at": m.last_called_at.isoformat() if m.last_called_at else None,
        "test_console": {"calls": m.console_calls, "failures": m.console_failures},
    }


def metrics_by_plugin(plugin: str | None = None) -> dict:
    qs = HookMetric.objects.all()
    if plugin:
        qs = qs.filter(plugin=plugin)
    out: dict[str, dict] = {}
    for m in qs:
        out.setdefault(m.plugin, {})[m.hook] = hook_stats(m)
    return {"plugins": out}


def last_hour(plugin: str | None = None) -> dict[str, dict]:
    """Per plugin: agent calls, failures, error rate and p95 over the last 60 minutes (+ test-console calls)."""
    since = timezone.now() - dt.timedelta(hours=1)
    qs = HookMetricBucket.objects.filter(minute__gte=since)
    if plugin:
        qs = qs.filter(plugin=plugin)
    agg: dict[str, dict] = {}
    for b in qs:
        a = agg.setdefault(b.plugin, {"calls": 0, "failures": 0, "console_calls": 0, "histogram": {}, "hooks": {}})
        a["calls"] += b.calls
        a["failures"] += b.failures
        a["console_calls"] += b.console_calls
        quantiles.merge(a["histogram"], b.histogram)
        h = a["hooks"].setdefault(b.hook, {"calls": 0, "failures": 0})
        h["calls"] += b.calls
        h["failures"] += b.failures
    return {
        p: {"calls": a["calls"], "failures": a["failures"],
            "error_rate": round(a["failures"] / a["calls"], 4) if a["calls"] else 0.0,
            "p95_ms": percentile(a["histogram"], 0.95), "test_console_calls": a["console_calls"],
            # error rates are per hook: a hook failing every call is not half-failing beside a healthy one
            "hooks": _hook_rates(a["hooks"])}
        for p, a in agg.items()
    }


def _hook_rates(hooks: dict[str, dict]) -> list[dict]:
    """[{hook, calls, failures, error_rate}], the hooks with agent calls, worst error rate first."""
    rows = [{"hook": hook, **h, "error_rate": round(h["failures"] / h["calls"], 4)}
            for hook, h in hooks.items() if h["calls"]]
    return sorted(rows, key=lambda r: (-r["error_rate"], r["hook"]))


def step_minutes(start: dt.datetime, end: dt.datetime, max_points: int = MAX_POINTS) -> int:
    minutes = max(1.0, (end - start).total_seconds() / 60)
    for step in STEPS_MIN:
        if minutes / step <= max_points:
            return step
    return math.ceil(minutes / max_points)


def series(start: dt.datetime, end: dt.datetime, plugin: str | None = None, hook: str | None = None,
           max_points: int = MAX_POINTS) -> dict:
    """Calls, errors, test-console calls and p50/p95/p99 per step between start and end (at most max_points
    steps), plus the same figures over the whole range. Times are unix seconds (step starts)."""
    end = min(end, start + MAX_RANGE)
    step = step_minutes(start, end, max_points)
    # Hourly rows when a step spans hours, or when the minute rows of that time are pruned already.
    hourly = step >= 60 or start < timezone.now() - MINUTE_ROWS_KEPT
    step = max(step, 60) if hourly else step
    step_s = step * 60
    first = int(start.timestamp()) // step_s * step_s
    n = max(1, math.ceil((end.timestamp() - first) / step_s))
    calls, errors, console = [0] * n, [0] * n, [0] * n
    sketches: list[dict] = [{} for _ in range(n)]
    model, field = (HookMetricHour, "hour") if hourly else (HookMetricBucket, "minute")
    qs = model.objects.filter(**{f"{field}__gte": dt.datetime.fromtimestamp(first, dt.UTC), f"{field}__lt": end})
    if plugin:
        qs = qs.filter(plugin=plugin)
    if hook:
        qs = qs.filter(hook=hook)
    per_hook: dict[str, tuple[list[int], list[int]]] = {}
    for at, hk, c, f, cc, hist in qs.values_list(field, "hook", "calls", "failures", "console_calls", "histogram"):
        i = (int(at.timestamp()) - first) // step_s
        if not 0 <= i < n:
            continue
        calls[i] += c
        errors[i] += f
        console[i] += cc
        quantiles.merge(sketches[i], hist)
        hook_calls, hook_errors = per_hook.setdefault(hk, ([0] * n, [0] * n))
        hook_calls[i] += c
        hook_errors[i] += f
    total_sketch: dict = {}
    for sk in sketches:
        quantiles.merge(total_sketch, sk)

    def qs_of(q: float) -> list[float | None]:
        return [percentile(s, q) for s in sketches]

    return {
        "start": int(start.timestamp()), "end": int(end.timestamp()), "step_s": step_s,
        "t": [first + i * step_s for i in range(n)],
        "calls": calls, "errors": errors, "test_console_calls": console,
        "p50_ms": qs_of(0.50), "p95_ms": qs_of(0.95), "p99_ms": qs_of(0.99),
        # error rate (%) per hook and step, null where the hook had no call: never one rate over several hooks
        "error_rate_by_hook": {hk: [round(100 * e / c, 1) if c else None for c, e in zip(hc, he, strict=True)]
                               for hk, (hc, he) in sorted(per_hook.items()) if sum(hc)},
        "markers": markers(dt.datetime.fromtimestamp(first, dt.UTC), end, plugin),
        "summary": {
            "calls": sum(calls), "errors": sum(errors), "test_console_calls": sum(console),
            "error_rate": round(sum(errors) / sum(calls), 4) if sum(calls) else None,
            "p50_ms": percentile(total_sketch, 0.50), "p95_ms": percentile(total_sketch, 0.95),
            "p99_ms": percentile(total_sketch, 0.99),
        },
    }


# What changed the service, drawn on the charts: reloads, enables, installs, config changes, worker (re)starts.
MARKER_ACTIONS = {"plugin.reload": "reload", "plugin.enable": "enabled", "plugin.disable": "disabled",
                  "plugin.install": "installed", "plugin.update": "updated", "plugin.uninstall": "uninstalled",
                  "engine.config": "config change", "worker.start": "worker started"}
SERVICE_WIDE = ("engine.config", "worker.start")


def markers(start: dt.datetime, end: dt.datetime, plugin: str | None = None, limit: int = 200) -> list[dict]:
    """[{t, kind, label}] of the audit trail's changes within the range (a plugin's chart: its own and the
    service-wide ones)."""
    qs = AuditEntry.objects.filter(at__gte=start, at__lt=end, ok=True, action__in=list(MARKER_ACTIONS))
    if plugin:
        qs = qs.filter(Q(target=plugin) | Q(action__in=SERVICE_WIDE))
    return [{"t": int(e.at.timestamp()), "kind": MARKER_ACTIONS[e.action],
             "label": f"{MARKER_ACTIONS[e.action]}: {e.target}" if e.target else MARKER_ACTIONS[e.action]}
            for e in qs.order_by("at")[:limit]]


RANGES = {"15m": dt.timedelta(minutes=15), "1h": dt.timedelta(hours=1), "24h": dt.timedelta(hours=24),
          "7d": dt.timedelta(days=7)}
DEFAULT_RANGE = "1h"


def _instant(value: str) -> dt.datetime:
    """Unix seconds or ISO-8601 (naive means UTC)."""
    try:
        return dt.datetime.fromtimestamp(float(value), dt.UTC)
    except ValueError:
        parsed = dt.datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def parse_range(name: str | None, start: str | None = None, end: str | None = None,
                now: dt.datetime | None = None) -> tuple[dt.datetime, dt.datetime, str]:
    """(start, end, label) for a named range ("15m", "1h", "24h", "7d") or a custom from/to.

    Raises ValueError for an unknown name, an unparsable instant, an empty or longer-than-31-days range."""
    now = now or timezone.now()
    if start or end:
        if not (start and end):
            raise ValueError("a custom range needs both from and to")
        try:
            s, e = _instant(start), _instant(end)
        except (ValueError, OverflowError, OSError) as exc:
            raise ValueError(f"not a time: {exc}") from None
        if e <= s:
            raise ValueError("the range must end after it starts")
        if e - s > MAX_RANGE:
            raise ValueError("the range may span at most 31 days")
        return s, e, "custom"
    name = name or DEFAULT_RANGE
    if name not in RANGES:
        raise ValueError(f"unknown range {name!r}; use one of {', '.join(RANGES)} or from/to")
    return now - RANGES[name], now, name
