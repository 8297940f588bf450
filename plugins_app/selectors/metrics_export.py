"""Metrics views in LibreFang's other shapes: the per-hook summary and Prometheus text exposition."""

from __future__ import annotations

from plugins_app.models import HookMetric
from plugins_app.services.recording import BUCKETS_MS


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
        seen = 0
        for bound in BUCKETS_MS[:-1]:
            seen += int(m.histogram.get(str(bound), 0))
            out.append(f'librefang_hook_duration_ms_bucket{{{labels},le="{bound}"}} {seen}')
        out.append(f'librefang_hook_duration_ms_bucket{{{labels},le="+Inf"}} {m.calls}')
        out.append(f"librefang_hook_duration_ms_sum{{{labels}}} {m.latency_ms_total:.3f}")
        out.append(f"librefang_hook_duration_ms_count{{{labels}}} {m.calls}")
    return "\n".join(out) + "\n"
