"""Resetting the persisted hook metrics (totals and per-minute buckets; traces are kept)."""

from __future__ import annotations

from django.db import transaction

from plugins_app import events
from plugins_app.models import HookMetric, HookMetricBucket
from plugins_app.services import audit


def reset_metrics(actor: str, plugin: str | None = None) -> dict:
    with transaction.atomic():
        totals = HookMetric.objects.all()
        buckets = HookMetricBucket.objects.all()
        if plugin:
            totals, buckets = totals.filter(plugin=plugin), buckets.filter(plugin=plugin)
        removed, _ = totals.delete()
        buckets.delete()
    audit.record(actor, "metrics.reset", plugin or "*", details={"rows": removed})
    events.metrics_changed([{"plugin": plugin or "*", "hook": "*", "reset": True}])
    return {"reset": True, "plugin": plugin, "rows_removed": removed}
