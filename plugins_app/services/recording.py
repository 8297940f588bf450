"""Metrics and traces: the Django implementation of engine.ports.InvocationSink.

Records are queued and written by one background thread in batches, so a hook's reply never waits on the
database; dashboards are told which metrics moved.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time

from django.db import transaction
from django.utils import timezone

from engine import quantiles
from engine.ports import AGENT, TEST_CONSOLE, Invocation
from plugins_app import events
from plugins_app.batching import BatchWriter
from plugins_app.models import HookMetric, HookMetricBucket, HookMetricHour, HookTrace
from plugins_app.services.connections import refresh_connections

log = logging.getLogger("librefang.recording")
MAX_TRACES = 10_000
PRUNE_EVERY = 256
BATCH_LINGER_SECS = 0.05
# Per-minute rows serve ranges up to a week; hourly rows (60× fewer) serve long ranges and outlive them.
MINUTE_RETENTION = dt.timedelta(days=8)
HOUR_RETENTION = dt.timedelta(days=92)


def record_now(items: list[Invocation]) -> None:
    """Write a batch of invocations: traces, totals, per-minute buckets.

    Totals and buckets are read-merge-written under a row lock (select_for_update), taken in sorted key order so
    concurrent workers neither lose counts nor deadlock; test-console runs go to their own counters.
    """
    now = timezone.now()
    with transaction.atomic():
        HookTrace.objects.bulk_create([
            HookTrace(
                trace_id=i.trace_id, job_id=i.job_id or "", plugin=i.plugin, hook=i.hook, agent_id=i.agent_id[:200],
                started_at=dt.datetime.fromtimestamp(i.started_at, dt.UTC), elapsed_ms=i.elapsed_ms, ok=i.ok,
                error_kind=i.error_kind or "", error=(i.error or "")[:4000], input_preview=i.input_preview,
                output_preview=i.output_preview, stderr_tail=i.stderr_tail, annotations=i.annotations,
                origin=(i.origin or AGENT)[:20],
            )
            for i in items
        ], ignore_conflicts=True)
        # One locked read-modify-write per (plugin, hook) and per (plugin, hook, minute) for the whole batch.
        by_hook: dict[tuple[str, str], list[Invocation]] = {}
        by_minute: dict[tuple[str, str, dt.datetime], list[Invocation]] = {}
        by_hour: dict[tuple[str, str, dt.datetime], list[Invocation]] = {}
        for i in items:
            by_hook.setdefault((i.plugin, i.hook), []).append(i)
            minute = dt.datetime.fromtimestamp(i.started_at - i.started_at % 60, dt.UTC)
            by_minute.setdefault((i.plugin, i.hook, minute), []).append(i)
            by_hour.setdefault((i.plugin, i.hook, minute.replace(minute=0)), []).append(i)
        for key in sorted(by_hook):
            _bump_total(by_hook[key], now)
        for (plugin, hook, minute), group in sorted(by_minute.items()):
            _bump_period(HookMetricBucket, group, plugin=plugin, hook=hook, minute=minute)
        for (plugin, hook, hour), group in sorted(by_hour.items()):
            _bump_period(HookMetricHour, group, plugin=plugin, hook=hook, hour=hour)


def _split(items: list[Invocation]) -> tuple[list[Invocation], list[Invocation]]:
    # MCP calls are agent traffic too (only their traces say "mcp"); test-console runs are counted apart
    agent = [i for i in items if (i.origin or AGENT) != TEST_CONSOLE]
    return agent, [i for i in items if (i.origin or AGENT) == TEST_CONSOLE]


def _add_calls(row: HookMetric | HookMetricBucket | HookMetricHour, items: list[Invocation]) -> None:
    agent, console = _split(items)
    row.calls += len(agent)
    row.failures += sum(1 for i in agent if not i.ok)
    row.latency_ms_total += sum(i.elapsed_ms for i in agent)
    sketch = dict(row.histogram or {})
    for i in agent:
        quantiles.add(sketch, i.elapsed_ms)
    row.histogram = sketch
    row.console_calls += len(console)
    row.console_failures += sum(1 for i in console if not i.ok)


def _bump_total(items: list[Invocation], now: dt.datetime) -> None:
    """Add calls of one plugin/hook to its totals (the row stays locked until the transaction ends)."""
    first = items[0]
    metric, _ = HookMetric.objects.select_for_update().get_or_create(plugin=first.plugin, hook=first.hook)
    _add_calls(metric, items)
    agent, _console = _split(items)
    metric.successes += sum(1 for i in agent if i.ok)
    if agent:
        metric.last_called_at = now
    failed = [i for i in agent if not i.ok]
    if failed:
        metric.last_error, metric.last_error_kind = (failed[-1].error or "")[:2000], failed[-1].error_kind or ""
    metric.save()


def _bump_period(model: type[HookMetricBucket] | type[HookMetricHour], items: list[Invocation], **key) -> None:
    """Add calls of one plugin/hook that started in one minute (or hour) to that period's row."""
    row, _ = model.objects.select_for_update().get_or_create(**key)
    _add_calls(row, items)
    row.save()


def prune_traces(keep: int = MAX_TRACES) -> None:
    cutoff = HookTrace.objects.order_by("-started_at").values_list("started_at", flat=True)[keep:keep + 1]
    if cutoff:
        HookTrace.objects.filter(started_at__lte=cutoff[0]).delete()
    now = timezone.now()
    HookMetricBucket.objects.filter(minute__lt=now - MINUTE_RETENTION).delete()
    HookMetricHour.objects.filter(hour__lt=now - HOUR_RETENTION).delete()


class DbInvocationSink(BatchWriter[Invocation]):
    """Implements engine.ports.InvocationSink: queue the record; one writer thread stores them in batches."""

    thread_name = "invocation-writer"
    # Linger a moment so calls arriving together share one transaction and one dashboard event (a busy worker
    # otherwise spends more CPU recording a call than running it).
    linger_secs = BATCH_LINGER_SECS

    def __init__(self) -> None:
        super().__init__()
        self._written = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        # the writer thread's own event loop, for the dashboards' events: kept, not made per batch
        self._loop = asyncio.new_event_loop()

    def record(self, invocation: Invocation) -> None:
        self.put(invocation)

    def flush(self, timeout: float = 10.0) -> None:
        super().flush(timeout)

    def write(self, batch: list[Invocation]) -> None:
        refresh_connections()
        self._write(batch)

    def _write(self, batch: list[Invocation]) -> None:
        for attempt in range(5):
            try:
                record_now(batch)
                break
            except Exception:
                if attempt == 4:
                    raise
                time.sleep(0.1 * (attempt + 1))
        before = self._written
        self._written += len(batch)
        if self._written // PRUNE_EVERY != before // PRUNE_EVERY:
            prune_traces()
        events.metrics_changed([{"plugin": p, "hook": h} for p, h in sorted({(i.plugin, i.hook) for i in batch})],
                               self._loop)
