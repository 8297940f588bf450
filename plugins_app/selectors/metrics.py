"""Metrics in LibreFang's documented shape, plus percentiles and last-hour figures."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from plugins_app.models import HookMetric, HookMetricBucket
from plugins_app.services.recording import BUCKETS_MS


def percentile(histogram: dict, q: float) -> float | None:
    """Upper bound (ms) of the bucket holding the q-th percentile; None without data."""
    total = sum(histogram.values())
    if not total:
        return None
    rank = q * total
    seen = 0
    for bound in BUCKETS_MS:
        seen += histogram.get(str(bound), 0)
        if seen >= rank:
            return float(bound)
    return float(BUCKETS_MS[-1])


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
    """Per plugin: calls, failures, error rate and p95 over the last 60 minutes."""
    since = timezone.now() - dt.timedelta(hours=1)
    qs = HookMetricBucket.objects.filter(minute__gte=since)
    if plugin:
        qs = qs.filter(plugin=plugin)
    agg: dict[str, dict] = {}
    for b in qs:
        a = agg.setdefault(b.plugin, {"calls": 0, "failures": 0, "histogram": {}})
        a["calls"] += b.calls
        a["failures"] += b.failures
        for k, v in b.histogram.items():
            a["histogram"][k] = a["histogram"].get(k, 0) + v
    return {
        p: {"calls": a["calls"], "failures": a["failures"],
            "error_rate": round(a["failures"] / a["calls"], 4) if a["calls"] else 0.0,
            "p95_ms": percentile(a["histogram"], 0.95)}
        for p, a in agg.items()
    }
