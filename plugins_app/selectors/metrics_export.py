"""Metrics views in LibreFang's other shapes: the per-hook summary and Prometheus text exposition."""

from __future__ import annotations

from engine import quantiles
from plugins_app.models import HookMetric

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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus() -> str:
    """Text exposition format 0.0.4: counters per plugin/hook and a latency histogram."""
    rows = list(HookMetric.objects.all())
    out: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")

    family("librefang_hook_calls_total", "counter", "Hook invocations (retries count separately).")
    for m in rows:
        out.append(f'librefang_hook_calls_total{{plugin="{_label(m.plugin)}",hook="{_label(m.hook)}"}} {m.calls}')
    family("librefang_hook_errors_total", "counter", "Failed hook invocations.")
    for m in rows:
        out.append(f'librefang_hook_errors_total{{plugin="{_label(m.plugin)}",hook="{_label(m.hook)}"}} {m.failures}')
    family("librefang_hook_latency_ms_total", "counter", "Summed latency of all invocations, failures included.")
    for m in rows:
        out.append(f'librefang_hook_latency_ms_total{{plugin="{_label(m.plugin)}",hook="{_label(m.hook)}"}} '
                   f"{m.latency_ms_total:.3f}")
    family("librefang_hook_duration_ms", "histogram", "Hook latency in milliseconds.")
    for m in rows:
        labels = f'plugin="{_label(m.plugin)}",hook="{_label(m.hook)}"'
        for bound in BUCKETS_MS:
            out.append(f'librefang_hook_duration_ms_bucket{{{labels},le="{bound}"}} '
                       f"{quantiles.count_at_most(m.histogram, bound)}")
        out.append(f'librefang_hook_duration_ms_bucket{{{labels},le="+Inf"}} {m.calls}')
        out.append(f"librefang_hook_duration_ms_sum{{{labels}}} {m.latency_ms_total:.3f}")
        out.append(f"librefang_hook_duration_ms_count{{{labels}}} {m.calls}")
    family("librefang_hook_latency_quantile_ms", "gauge",
           "Measured latency quantiles since the last reset (within 1 % of the samples).")
    for m in rows:
        labels = f'plugin="{_label(m.plugin)}",hook="{_label(m.hook)}"'
        for q in QUANTILES:
            value = quantiles.quantile(m.histogram, q)
            if value is not None:
                out.append(f'librefang_hook_latency_quantile_ms{{{labels},quantile="{q}"}} {value:.3f}')
    family("librefang_hook_test_console_calls_total", "counter", "Test-console runs (not agent traffic).")
    for m in rows:
        out.append(f'librefang_hook_test_console_calls_total{{plugin="{_label(m.plugin)}",hook="{_label(m.hook)}"}} '
                   f"{m.console_calls}")
    return "\n".join(out) + "\n"
