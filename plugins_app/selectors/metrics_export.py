"""Metrics views in LibreFang's other shapes: the per-hook summary and Prometheus text exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine import quantiles
from plugins_app.models import AlertState, HookMetric

# Fixed `le` bounds (ms) of the exposed histogram, so Prometheus can aggregate across instances; counts are read
# from each row's latency sketch (engine/quantiles.py). Exact quantiles are exposed as a separate gauge family.
BUCKETS_MS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000,
              20000, 30000, 60000, 120000)
QUANTILES = (0.5, 0.95, 0.99)


def _stats(calls: int, successes: int, failures: int, total_ms: float) -> dict:
    return {"calls": calls, "successes": successes, "failures": failures, "total_ms": round(total_ms, 3),
            "latency_ms_total": round(total_ms, 3), "avg_ms": round(total_ms / calls, 3) if calls else 0.0,
            "error_rate_pct": round(100.0 * failures / calls, 2) if calls else 0.0}


def summary() -> dict:
    """{"hooks": {hook: stats summed over plugins}, "totals": stats, "plugins": {name: stats}}."""
    hooks: dict[str, list] = {}
    plugins: dict[str, list] = {}
    total = [0, 0, 0, 0.0]
    for m in HookMetric.objects.all():
        for bucket in (hooks.setdefault(m.hook, [0, 0, 0, 0.0]), plugins.setdefault(m.plugin, [0, 0, 0, 0.0]), total):
            bucket[0] += m.calls
            bucket[1] += m.successes
            bucket[2] += m.failures
            bucket[3] += m.latency_ms_total
    return {"hooks": {h: _stats(*v) for h, v in sorted(hooks.items())}, "totals": _stats(*total),
            "plugins": {p: _stats(*v) for p, v in sorted(plugins.items())}}


class _HookMetrics:
    """A prometheus_client collector over the HookMetric rows, read when the exposition is generated."""

    def collect(self):
        rows = list(HookMetric.objects.all())
        labels = ["plugin", "hook"]
        calls = CounterMetricFamily("librefang_hook_calls", "Hook invocations (retries count separately).",
                                    labels=labels)
        errors = CounterMetricFamily("librefang_hook_errors", "Failed hook invocations.", labels=labels)
        latency = CounterMetricFamily("librefang_hook_latency_ms", "Summed latency of all invocations, failures "
                                      "included.", labels=labels)
        duration = HistogramMetricFamily("librefang_hook_duration_ms", "Hook latency in milliseconds.",
                                         labels=labels)
        quantile = GaugeMetricFamily("librefang_hook_latency_quantile_ms", "Measured latency quantiles since the "
                                     "last reset (within 1 % of the samples).", labels=[*labels, "quantile"])
        console = CounterMetricFamily("librefang_hook_test_console_calls", "Test-console runs (not agent traffic).",
                                      labels=labels)
        for m in rows:
            key = [m.plugin, m.hook]
            calls.add_metric(key, m.calls)
            errors.add_metric(key, m.failures)
            latency.add_metric(key, round(m.latency_ms_total, 3))
            buckets = [(str(bound), quantiles.count_at_most(m.histogram, bound)) for bound in BUCKETS_MS]
            duration.add_metric(key, [*buckets, ("+Inf", m.calls)], round(m.latency_ms_total, 3))
            for q in QUANTILES:
                value = quantiles.quantile(m.histogram, q)
                if value is not None:
                    quantile.add_metric([*key, str(q)], round(value, 3))
            console.add_metric(key, m.console_calls)
        yield from (calls, errors, latency, duration, quantile, console)


class _AlertGauges:
    """Alert states and the figures the web tier's alert evaluator measured last (plugins_app/services/alerts.py,
    every few seconds): queue lag and live workers, so Grafana users can alert on them instead."""

    FIGURES = {"queue_lag": ("librefang_queue_lag", "Jobs in the queue not yet delivered to a worker."),
               "no_live_worker": ("librefang_workers_live", "Workers with a live heartbeat."),
               "redis_unreachable": ("librefang_redis_unreachable", "1 while Redis does not answer the web tier."),
               "fallback_rate": ("librefang_fallback_rate", "Share of calls answered by the default engine, 10 min.")}

    def collect(self):
        firing = GaugeMetricFamily("librefang_alert_firing", "1 while the alert fires.", labels=["rule", "alert"])
        figures = {key: GaugeMetricFamily(name, text) for key, (name, text) in self.FIGURES.items()}
        for state in AlertState.objects.all():
            firing.add_metric([state.rule, state.key], 1.0 if state.firing else 0.0)
            if state.key in figures and state.value is not None:
                figures[state.key].add_metric([], state.value)
        yield firing
        yield from (f for f in figures.values() if f.samples)


def prometheus() -> str:
    """Text exposition format 0.0.4 (CONTENT_TYPE_LATEST): counters per plugin/hook and a latency histogram, and
    the alert, queue and worker gauges."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_HookMetrics())
    registry.register(_AlertGauges())
    return generate_latest(registry).decode("utf-8")
