"""Metrics and traces: the Django implementation of engine.ports.InvocationSink.

Records are queued and written by one background thread in batches, so a hook's reply never waits on the
database; dashboards are told which metrics moved.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import time

from django.db import connections, router, transaction
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
    """Write a batch of invocations: traces, totals, per-minute and per-hour rows.

    One statement per table for the whole batch: totals and periods are upserts (INSERT ... ON CONFLICT DO UPDATE)
    whose counters and latency sketch are added up by the database, so concurrent workers never lose counts (the
    conflicting row stays locked until the transaction ends; rows are taken in sorted key order, so no deadlock);
    test-console runs go to their own counters.
    """
    now = dt.datetime.now(dt.UTC)
    by_hook: dict[tuple[str, str], list[Invocation]] = {}
    by_minute: dict[tuple[str, str, dt.datetime], list[Invocation]] = {}
    by_hour: dict[tuple[str, str, dt.datetime], list[Invocation]] = {}
    connection = connections[router.db_for_write(HookMetric)]
    adapt = connection.ops.adapt_datetimefield_value
    traces = []
    for i in items:
        started = dt.datetime.fromtimestamp(i.started_at, dt.UTC)
        traces.append((  # _TRACE_COLUMNS' order
            i.trace_id, i.job_id or "", i.plugin, i.hook, i.agent_id[:200], adapt(started), i.elapsed_ms, i.ok,
            i.error_kind or "", (i.error or "")[:4000], i.input_preview, i.output_preview, i.stderr_tail,
            None if i.annotations is None else json.dumps(i.annotations), (i.origin or AGENT)[:20]))
        by_hook.setdefault((i.plugin, i.hook), []).append(i)
        minute = started.replace(second=0, microsecond=0)
        by_minute.setdefault((i.plugin, i.hook, minute), []).append(i)
        by_hour.setdefault((i.plugin, i.hook, minute.replace(minute=0)), []).append(i)
    totals = []
    for key in sorted(by_hook):
        agent, console = _split(by_hook[key])
        failed = [i for i in agent if not i.ok]
        last = failed[-1] if failed else None
        totals.append((*key, *_figures(agent, console), sum(1 for i in agent if i.ok),
                       (last.error or "")[:2000] if last else "", (last.error_kind or "") if last else "",
                       adapt(now) if agent else None))
    minutes = [(p, h, adapt(m), *_figures(*_split(g))) for (p, h, m), g in sorted(by_minute.items())]
    hours = [(p, h, adapt(m), *_figures(*_split(g))) for (p, h, m), g in sorted(by_hour.items())]
    # Within the limit of parameters per statement (Django's 999 on SQLite; 65535 in PostgreSQL's protocol), in order.
    chunk = max(1, (connection.features.max_query_params or 65535) // len(_TRACE_COLUMNS))
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        for n in range(0, len(traces), chunk):
            part = traces[n:n + chunk]
            cursor.execute(_insert_traces_sql(connection.vendor, len(part)), [v for row in part for v in row])
        for model, rows in ((HookMetric, totals), (HookMetricBucket, minutes), (HookMetricHour, hours)):
            for n in range(0, len(rows), chunk):
                part = rows[n:n + chunk]
                cursor.execute(_upsert_sql(connection.vendor, model, len(part)), [v for row in part for v in row])


def _split(items: list[Invocation]) -> tuple[list[Invocation], list[Invocation]]:
    # MCP calls are agent traffic too (only their traces say "mcp"); test-console runs are counted apart
    agent = [i for i in items if (i.origin or AGENT) != TEST_CONSOLE]
    return agent, [i for i in items if (i.origin or AGENT) == TEST_CONSOLE]


def _figures(agent: list[Invocation], console: list[Invocation]) -> tuple:
    """calls, failures, latency total, latency sketch (JSON), console calls, console failures: _COUNTED's order."""
    sketch: quantiles.Sketch = {}
    for i in agent:
        quantiles.add(sketch, i.elapsed_ms)
    return (len(agent), sum(1 for i in agent if not i.ok), float(sum(i.elapsed_ms for i in agent)),
            json.dumps(sketch), len(console), sum(1 for i in console if not i.ok))


# Columns added to the stored row on conflict (the sketch is merged apart: its counts are added key by key).
_COUNTED = ("calls", "failures", "latency_ms_total", "histogram", "console_calls", "console_failures")
# The latency sketches merged in SQL (engine/quantiles.py merge: counts added per key), per backend; {old} is the
# stored row's column, {new} the batch's. An empty batch sketch (console-only calls) keeps the stored one as is.
# (numeric on PostgreSQL: a count stored as 2.0 by an older writer still adds up instead of failing the batch)
_MERGE_SKETCH = {
    "sqlite": ("CASE WHEN {new} = '{{}}' THEN {old} ELSE json_patch({old}, (SELECT json_group_object(key, value"
               " + COALESCE(json_extract({old}, '$.\"' || key || '\"'), 0)) FROM json_each({new}))) END"),
    "postgresql": ("CASE WHEN {new} = '{{}}'::jsonb THEN {old} ELSE {old} || (SELECT jsonb_object_agg(key,"
                   " value::numeric + COALESCE(({old} ->> key)::numeric, 0)) FROM jsonb_each_text({new})) END"),
}


# Every HookTrace column but the id; a trace already stored (a retried batch) is left as it is.
_TRACE_COLUMNS = ("trace_id", "job_id", "plugin", "hook", "agent_id", "started_at", "elapsed_ms", "ok", "error_kind",
                  "error", "input_preview", "output_preview", "stderr_tail", "annotations", "origin")


@functools.lru_cache(maxsize=64)  # one statement text per batch size seen
def _insert_traces_sql(vendor: str, rows: int) -> str:
    """The traces' INSERT for `rows` rows (the ORM's bulk_create spent more CPU building it than the database took)."""
    q = connections[router.db_for_write(HookTrace)].ops.quote_name
    json_param = "CAST(%s AS jsonb)" if vendor == "postgresql" else "%s"
    row = "(" + ", ".join(json_param if c == "annotations" else "%s" for c in _TRACE_COLUMNS) + ")"
    return (f"INSERT INTO {q(HookTrace._meta.db_table)} ({', '.join(map(q, _TRACE_COLUMNS))}) "
            f"VALUES {', '.join([row] * rows)} ON CONFLICT DO NOTHING")


@functools.lru_cache(maxsize=64)
def _upsert_sql(vendor: str, model: type[HookMetric] | type[HookMetricBucket] | type[HookMetricHour],
                rows: int) -> str:
    """INSERT ... ON CONFLICT DO UPDATE for `rows` rows of one table: the row tuples built in record_now."""
    if vendor not in _MERGE_SKETCH:
        raise NotImplementedError(f"recording needs SQLite or PostgreSQL, not {vendor}")
    q = connections[router.db_for_write(model)].ops.quote_name
    table = q(model._meta.db_table)
    key = ("plugin", "hook") if model is HookMetric else ("plugin", "hook", "minute" if model is HookMetricBucket
                                                          else "hour")
    extra = ("successes", "last_error", "last_error_kind", "last_called_at") if model is HookMetric else ()
    columns = (*key, *_COUNTED, *extra)
    json_param = "CAST(%s AS jsonb)" if vendor == "postgresql" else "%s"
    row = "(" + ", ".join(json_param if c == "histogram" else "%s" for c in columns) + ")"
    updates = []
    for c in (*_COUNTED, *extra):
        old, new = f"{table}.{q(c)}", f"excluded.{q(c)}"
        if c == "histogram":
            updates.append(f"{q(c)} = " + _MERGE_SKETCH[vendor].format(old=old, new=new))
        elif c in ("last_error", "last_error_kind"):  # the batch's last failed agent call, if any
            updates.append(f"{q(c)} = CASE WHEN excluded.{q('failures')} > 0 THEN {new} ELSE {old} END")
        elif c == "last_called_at":  # null when the batch had only test-console runs
            updates.append(f"{q(c)} = COALESCE({new}, {old})")
        else:
            updates.append(f"{q(c)} = {old} + {new}")
    return (f"INSERT INTO {table} ({', '.join(map(q, columns))}) VALUES {', '.join([row] * rows)} "
            f"ON CONFLICT ({', '.join(map(q, key))}) DO UPDATE SET {', '.join(updates)}")


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

    UNWRITTEN_KEPT = 10_000

    def __init__(self) -> None:
        super().__init__()
        self._written = 0
        self._unwritten: dict[str, None] = {}  # job ids whose traces could not be stored (oldest first)

    def record(self, invocation: Invocation) -> None:
        self.put(invocation)

    def flush(self, timeout: float = 10.0) -> None:
        super().flush(timeout)

    def take_unwritten(self, job_ids: list[str]) -> set[str]:
        """Of these jobs, those whose traces were not stored (forgotten once asked): the worker's outcome writer
        leaves them unacknowledged, so they run again (plugins_app/services/jobs.py OutcomeWriter)."""
        with self._lock:
            found = {job for job in job_ids if job in self._unwritten}
            for job in found:
                del self._unwritten[job]
        return found

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
                    with self._lock:
                        self._unwritten.update(dict.fromkeys(i.job_id for i in batch if i.job_id))
                        while len(self._unwritten) > self.UNWRITTEN_KEPT:
                            self._unwritten.pop(next(iter(self._unwritten)))
                    raise
                time.sleep(0.1 * (attempt + 1))
        before = self._written
        self._written += len(batch)
        if self._written // PRUNE_EVERY != before // PRUNE_EVERY:
            prune_traces()
        events.metrics_changed([{"plugin": p, "hook": h} for p, h in sorted({(i.plugin, i.hook) for i in batch})])
