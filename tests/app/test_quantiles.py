"""Latency percentiles are measured (within 2 % of the raw samples), over any range, under concurrent writers."""

import datetime as dt
import math
import random
import threading
import time
import uuid

import pytest
from django.db import DatabaseError, close_old_connections, connection

from engine import quantiles
from engine.ports import TEST_CONSOLE, Invocation
from plugins_app.models import HookMetric, HookMetricBucket, HookMetricHour, HookTrace
from plugins_app.selectors import metrics as metric_selectors
from plugins_app.selectors import metrics_export
from plugins_app.services.recording import record_now
from tests.app.prometheus_text import prometheus_samples
from tests.waiting import wait_until

QS = (0.5, 0.95, 0.99)


def true_quantile(samples: list[float], q: float) -> float:
    """Nearest rank, as the sketch and bench/run.py define it."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def relative_error(measured: float, true: float) -> float:
    return abs(measured - true) / true


def invocation(ms: float, started: float, plugin: str = "p", hook: str = "ingest", ok: bool = True,
               origin: str = "agent") -> Invocation:
    return Invocation(trace_id=uuid.uuid4().hex[:16], plugin=plugin, hook=hook, agent_id="a1", started_at=started,
                      elapsed_ms=ms, ok=ok, error_kind=None if ok else "timeout", origin=origin)


def test_it_keeps_merged_per_minute_sketches_within_two_percent_of_the_samples():
    rng = random.Random(16)
    samples_by_minute: list[list[float]] = []
    for m in range(10):  # ten minutes with different latency profiles, each its own sketch
        samples = [rng.lognormvariate(3 + m * 0.2, 1.1) for _ in range(rng.randint(200, 2000))]
        samples += [rng.uniform(0.05, 30_000) for _ in range(20)]  # sub-millisecond to 30 s outliers
        samples_by_minute.append(samples)
    sketches = [quantiles.from_values(s) for s in samples_by_minute]
    for first, last in ((0, 10), (3, 7), (9, 10)):  # the whole range, a middle range (a chart's), one minute
        merged: dict = {}
        for s in sketches[first:last]:
            quantiles.merge(merged, s)
        raw = [v for s in samples_by_minute[first:last] for v in s]
        assert quantiles.count(merged) == len(raw)
        for q in QS + (0.0, 0.25, 0.75, 0.999, 1.0):
            assert relative_error(quantiles.quantile(merged, q), true_quantile(raw, q)) <= 0.02, (first, last, q)


def test_it_reads_p99_of_a_few_calls_as_the_slowest():
    s = quantiles.from_values([80, 90, 100, 110, 160, 2060])
    assert relative_error(quantiles.quantile(s, 0.99), 2060) <= 0.01
    assert relative_error(quantiles.quantile(s, 0.5), 100) <= 0.01


def test_it_reads_a_single_call_as_its_own_latency():
    s = quantiles.from_values([609.0])
    for q in QS:
        assert relative_error(quantiles.quantile(s, q), 609.0) <= 0.01
    assert quantiles.display_ms(quantiles.quantile(s, 0.5)) in ("609 ms", "608 ms", "610 ms", "611 ms", "607 ms")
    assert quantiles.quantile({}, 0.5) is None


def test_it_still_reads_rows_written_with_the_old_bucket_bounds():
    assert quantiles.quantile({"10": 3, "20": 1}, 0.5) == 10.0
    assert quantiles.count_at_most({"10": 3, "20": 1}, 10) == 3


@pytest.mark.django_db
def test_it_measures_percentiles_over_a_time_range_from_the_database(client):
    rng = random.Random(7)
    now = time.time()
    start_minute = now - now % 60 - 30 * 60
    raw_in_range: list[float] = []
    batch = []
    for m in range(30):
        for _ in range(rng.randint(20, 120)):
            ms = rng.lognormvariate(5, 0.8)
            started = start_minute + m * 60 + rng.uniform(0, 59)
            batch.append(invocation(ms, started))
            if m >= 10:
                raw_in_range.append(ms)
    record_now(batch)
    start = dt.datetime.fromtimestamp(start_minute + 10 * 60, dt.UTC)
    end = dt.datetime.fromtimestamp(now + 60, dt.UTC)
    data = metric_selectors.series(start, end, plugin="p")
    assert data["summary"]["calls"] == len(raw_in_range)
    for q, key in zip(QS, ("p50_ms", "p95_ms", "p99_ms"), strict=True):
        assert relative_error(data["summary"][key], true_quantile(raw_in_range, q)) <= 0.02, key
    assert len(data["t"]) <= metric_selectors.MAX_POINTS
    # The LibreFang-shaped API reads the totals' sketch: all 30 minutes.
    every = [i.elapsed_ms for i in batch]
    stats = metric_selectors.metrics_by_plugin("p")["plugins"]["p"]["ingest"]
    assert stats["calls"] == len(batch)
    assert relative_error(stats["p99_ms"], true_quantile(every, 0.99)) <= 0.02
    samples = prometheus_samples(metrics_export.prometheus())
    assert relative_error(samples["librefang_hook_latency_quantile_ms", ("p", "ingest", "0.5")],
                          true_quantile(every, 0.5)) <= 0.02


@pytest.mark.django_db
def test_it_counts_test_console_runs_apart_from_agent_traffic():
    now = time.time()
    record_now([invocation(10, now), invocation(20, now, ok=False),
                invocation(5000, now, origin=TEST_CONSOLE), invocation(7000, now, ok=False, origin=TEST_CONSOLE)])
    m = HookMetric.objects.get(plugin="p", hook="ingest")
    assert (m.calls, m.failures, m.console_calls, m.console_failures) == (2, 1, 2, 1)
    assert quantiles.quantile(m.histogram, 1.0) < 21  # console latencies stay out of the agents' percentiles
    b = HookMetricBucket.objects.get(plugin="p", hook="ingest")
    assert (b.calls, b.console_calls) == (2, 2)
    assert sorted(HookTrace.objects.values_list("origin", flat=True)) == ["agent", "agent", TEST_CONSOLE, TEST_CONSOLE]
    hour = metric_selectors.last_hour("p")["p"]
    assert hour["calls"] == 2 and hour["test_console_calls"] == 2


@pytest.mark.django_db(transaction=True)
def test_it_loses_no_count_when_workers_record_at_the_same_time():
    """Several writers (threads with their own connections, as workers are) hit the same rows at once."""
    writers, batches, per_batch = 4, 8, 25
    now = time.time()
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers)

    def write(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            for _ in range(batches):
                items = [invocation(1 + n, now) for _ in range(per_batch)]
                # The in-memory test database (SQLite shared cache) answers "table is locked" instead of waiting.
                # A file database (LIBREFANG_TEST_DB=…, transaction_mode IMMEDIATE) and PostgreSQL (row lock) make
                # writers wait: there every batch lands on its first try.
                wait_until(lambda items=items: record_now(items) or True, 60, "a batch stored past the others' locks",
                           ignoring=(DatabaseError,))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    expected = writers * batches * per_batch
    m = HookMetric.objects.get(plugin="p", hook="ingest")
    assert m.calls == expected and quantiles.count(m.histogram) == expected
    b = HookMetricBucket.objects.get(plugin="p", hook="ingest")
    assert b.calls == expected and quantiles.count(b.histogram) == expected
    h = HookMetricHour.objects.get(plugin="p", hook="ingest")
    assert h.calls == expected and quantiles.count(h.histogram) == expected


@pytest.mark.django_db
def test_it_reads_long_ranges_from_hourly_rows_with_the_same_accuracy():
    rng = random.Random(3)
    now = time.time()
    batch = [invocation(rng.lognormvariate(4 + (h % 5) * 0.3, 0.9), now - h * 3600 - rng.uniform(0, 3500))
             for h in range(60) for _ in range(rng.randint(5, 40))]
    record_now(batch)
    start = dt.datetime.fromtimestamp(now - 7 * 86400, dt.UTC)
    end = dt.datetime.fromtimestamp(now + 1, dt.UTC)
    data = metric_selectors.series(start, end)
    assert data["step_s"] >= 3600 and len(data["t"]) <= metric_selectors.MAX_POINTS
    assert data["summary"]["calls"] == len(batch) == sum(HookMetricHour.objects.values_list("calls", flat=True))
    raw = [i.elapsed_ms for i in batch]
    for q, key in zip(QS, ("p50_ms", "p95_ms", "p99_ms"), strict=True):
        assert relative_error(data["summary"][key], true_quantile(raw, q)) <= 0.02, key
    # The hourly rows hold what the minute rows hold.
    day = metric_selectors.series(dt.datetime.fromtimestamp(now - 86400, dt.UTC), end)
    assert day["step_s"] < 3600
    in_day = [i.elapsed_ms for i in batch if i.started_at >= day["t"][0]]
    assert day["summary"]["calls"] == len(in_day)


@pytest.mark.django_db
def test_it_rolls_existing_minute_rows_up_into_hours_when_migrating():
    import importlib

    from django.apps import apps

    migration = importlib.import_module("plugins_app.migrations.0004_hourly_metrics")
    now = time.time()
    record_now([invocation(10, now - 120), invocation(20, now - 60), invocation(30, now - 7200)])
    HookMetricHour.objects.all().delete()
    migration.roll_up_minutes(apps, None)
    assert sum(HookMetricHour.objects.values_list("calls", flat=True)) == 3
    assert sum(quantiles.count(h) for h in HookMetricHour.objects.values_list("histogram", flat=True)) == 3


@pytest.mark.django_db
def test_it_adds_each_batch_to_the_stored_rows_as_if_all_samples_were_kept():
    """The database merges a batch into existing rows (engine/quantiles.py merge): counts and sketch add up exactly,
    a console-only batch leaves the agents' sketch, last call and last error alone, a failure replaces the error."""
    now = time.time()
    first = [invocation(12.5, now), invocation(40, now, ok=False), invocation(0.5, now), invocation(3, now, hook="assemble")]
    second = [invocation(12.5, now), invocation(900, now), invocation(0.5, now), invocation(0.0001, now)]
    record_now(first)
    record_now(second)
    last_call = HookMetric.objects.get(plugin="p", hook="ingest").last_called_at
    console = invocation(5000, now, ok=False, origin=TEST_CONSOLE)
    console.error_kind = "crash"
    record_now([console])
    agent_ingest = [i.elapsed_ms for i in first + second if i.hook == "ingest"]
    for row in (HookMetric.objects.get(plugin="p", hook="ingest"), HookMetricBucket.objects.get(plugin="p", hook="ingest"),
                HookMetricHour.objects.get(plugin="p", hook="ingest")):
        assert (row.calls, row.failures, row.console_calls, row.console_failures) == (7, 1, 1, 1)
        assert row.latency_ms_total == pytest.approx(sum(agent_ingest))
        assert row.histogram == quantiles.from_values(agent_ingest)
    m = HookMetric.objects.get(plugin="p", hook="ingest")
    assert m.successes == 6 and m.last_error_kind == "timeout" and m.last_called_at == last_call is not None
    assert HookMetric.objects.get(plugin="p", hook="assemble").histogram == quantiles.from_values([3])
    assert HookTrace.objects.count() == 9


@pytest.mark.django_db
def test_it_merges_new_calls_into_rows_written_with_the_old_bucket_bounds():
    minute = dt.datetime.fromtimestamp(time.time() // 60 * 60, dt.UTC)
    HookMetricBucket.objects.create(plugin="p", hook="ingest", minute=minute, calls=2, histogram={"50": 2})
    record_now([invocation(10, minute.timestamp() + 1)])
    b = HookMetricBucket.objects.get(plugin="p", hook="ingest")
    assert b.calls == 3 and b.histogram == {"50": 2, **quantiles.from_values([10])}
    assert quantiles.quantile(b.histogram, 1.0) == 50


@pytest.mark.django_db
def test_it_records_a_full_batch_beyond_the_databases_parameter_limit():
    """The writer's largest batch (plugins_app/batching.py batch_max) with more keys than one statement can carry."""
    now = time.time()
    items = [invocation(1 + n % 7, now - 60 * (n % 3), hook=f"h{n % 90}") for n in range(500)]
    record_now(items)
    assert HookTrace.objects.count() == 500
    assert HookMetric.objects.count() == 90 and sum(HookMetric.objects.values_list("calls", flat=True)) == 500
    assert sum(quantiles.count(h) for h in HookMetricBucket.objects.values_list("histogram", flat=True)) == 500
    assert sum(HookMetricHour.objects.values_list("calls", flat=True)) == 500


def test_the_trace_insert_names_every_column_of_the_trace_model():
    # services/recording.py writes traces with its own INSERT: a HookTrace field it does not name would be left to a
    # database default it may not have
    from plugins_app.services.recording import _TRACE_COLUMNS

    columns = {f.column for f in HookTrace._meta.concrete_fields if not f.primary_key}
    assert set(_TRACE_COLUMNS) == columns and len(_TRACE_COLUMNS) == len(columns)
