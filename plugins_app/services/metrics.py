"""Resetting the persisted hook metrics (totals, per-minute and per-hour rows; traces are kept)."""

from __future__ import annotations

from django.db import transaction

from plugins_app import events
from plugins_app.models import HookMetric, HookMetricBucket, HookMetricHour
from plugins_app.services import audit


def reset_metrics(actor: str, plugin: str | None = None) -> dict:
    with transaction.atomic():
        totals = HookMetric.objects.all()
        buckets = HookMetricBucket.objects.all()
        hours = HookMetricHour.objects.all()
        if plugin:
            totals, buckets, hours = totals.filter(plugin=plugin), buckets.filter(plugin=plugin), hours.filter(plugin=plugin)
        removed, _ = totals.delete()
        buckets.delete()
        hours.delete()
    audit.record(actor, "metrics.reset", plugin or "*", details={"rows": removed})
    events.metrics_changed([{"plugin": plugin or events.EVERY_PLUGIN, "hook": "*", "reset": True}])
    return {"reset": True, "plugin": plugin, "rows_removed": removed}
