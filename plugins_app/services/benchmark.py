"""POST /plugins/{name}/benchmark: each hook run N times, one after another, through a worker on the same path as
the test console (job kind test_hook), with the latency distribution of those N runs."""

from __future__ import annotations

import time
from typing import Any

from asgiref.sync import sync_to_async

from engine import hooks as H
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors.examples import example_request
from plugins_app.services import audit
from plugins_app.services import hooks as hook_service

MAX_RUNS = 50
DEFAULT_RUNS = 5


def quantile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile by linear interpolation between the closest ranks (exact on the samples taken)."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return round(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo), 3)


def distribution(values: list[float]) -> dict[str, Any]:
    s = sorted(values)
    return {"min": round(s[0], 3) if s else None, "max": round(s[-1], 3) if s else None,
            "avg": round(sum(s) / len(s), 3) if s else None, "p50": quantile(s, 0.50), "p95": quantile(s, 0.95),
            "p99": quantile(s, 0.99), "all": [round(v, 3) for v in values]}


def _plan(name: str, hook: str | None) -> tuple[list[str], dict[str, float]]:
    """The hooks to run (the one asked for, else every declared hook) and each one's timeout."""
    settings = plugin_selectors.runnable_hooks(name, [hook] if hook else None, enabled=True)
    hooks = [hook] if hook else sorted(settings.declared_hooks())
    return hooks, {h: H.timeout_for(h, settings) for h in hooks}


async def benchmark(name: str, hook: str | None, request: dict | None, runs: int, actor: str, run=None) -> dict:
    """`run(plugin, hook, request, timeout)` runs one call (default: through a worker, as the test console does;
    the CLI passes an in-process runner when no worker is alive)."""
    run = run or hook_service.test_hook
    hooks, timeouts = await sync_to_async(_plan)(name, hook)
    results = []
    for h in hooks:
        req = request if (request is not None and hook) else example_request(h)
        elapsed, round_trips, errors = [], [], []
        for _ in range(runs):
            started = time.monotonic()
            reply = await run(name, h, req, timeouts[h])
            round_trips.append((time.monotonic() - started) * 1000)
            if reply.get("ok"):
                elapsed.append(float(reply.get("elapsed_ms") or 0.0))
            else:
                errors.append((reply.get("error") or {}).get("kind") or "error")
        results.append({"hook": h, "runs": runs, "ok": len(elapsed), "errors": len(errors),
                        "error_kinds": sorted(set(errors)), "latency_ms": distribution(elapsed),
                        "round_trip_ms": distribution(round_trips)})
    await sync_to_async(audit.record)(actor, "plugin.benchmark", name, ok=all(r["errors"] == 0 for r in results),
                                      details={"hooks": hooks, "runs": runs})
    return {"plugin": name, "runs": runs, "hooks": results}
