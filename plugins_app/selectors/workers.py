"""The workers and queue page: heartbeats grouped by host, and throughput per step from the per-minute buckets."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable

from django.db.models import Count, Sum

from plugins_app.models import HookMetricBucket, JobRecord

# A worker beats every 2 s (plugins_app/management/commands/worker.py); older than this is "late" (a beat missed:
# the worker may be dead; its heartbeat expires 6 s after its last beat).
LATE_AFTER_SECS = 3.0


def _beat_at(w: dict) -> float | None:
    for key in ("beat_at", "ts", "at", "time"):
        if isinstance(w.get(key), int | float):
            return float(w[key])
    return None


def split_dead(heartbeats: Iterable[dict], supervisor_doc: dict | None) -> tuple[list[dict], list[dict]]:
    """(live, dead) heartbeats. A heartbeat outlives its worker by up to its TTL (6 s); a worker the `librefang
    start` supervisor of its host has reaped (supervisor.json, rewritten within 0.1 s of the exit) is dead at once,
    with the exit it saw as `died`."""
    host = (supervisor_doc or {}).get("host")
    reaped = {}
    for child in (supervisor_doc or {}).get("children") or []:
        last = child.get("last_exit") or {}
        if last.get("pid") and last.get("pid") != child.get("pid"):
            reaped[last["pid"]] = {**last, "at": child.get("last_exit_at"), "slot": child.get("slot")}
    live, dead = [], []
    for w in heartbeats:
        exit_ = reaped.get(w.get("pid")) if host and w.get("host") == host else None
        (dead if exit_ else live).append({**w, "died": exit_} if exit_ else w)
    return live, dead


def workers_by_host(heartbeats: Iterable[dict], now: float | None = None) -> list[dict]:
    """[{host, workers: [{name, pid, uptime_s, started_at, concurrency, running, processed, beat_age_s, late}]}]."""
    now = now or time.time()
    hosts: dict[str, list[dict]] = {}
    host_facts: dict[str, dict] = {}
    for w in heartbeats:
        started = w.get("started_at")
        beat = _beat_at(w)
        row = {
            "name": str(w.get("worker") or "?"), "pid": w.get("pid"), "concurrency": w.get("concurrency"),
            "running": w.get("inflight", 0), "processed": w.get("processed", 0),
            "started_at": dt.datetime.fromtimestamp(started, dt.UTC) if isinstance(started, int | float) else None,
            "uptime_s": max(0.0, now - started) if isinstance(started, int | float) else None,
            "beat_at": dt.datetime.fromtimestamp(beat, dt.UTC) if beat else None,
            "beat_age_s": max(0.0, now - beat) if beat else None,
        }
        row["late"] = row["beat_age_s"] is not None and row["beat_age_s"] > LATE_AFTER_SECS
        hosts.setdefault(str(w.get("host") or "?"), []).append(row)
        _note_host_facts(host_facts.setdefault(str(w.get("host") or "?"), {}), w, beat or 0.0)
    return [{"host": h, "workers": sorted(ws, key=lambda r: (r["pid"] or 0)),
             "concurrency": sum(r["concurrency"] or 0 for r in ws), "running": sum(r["running"] or 0 for r in ws),
             **{k: v for k, v in host_facts.get(h, {}).items() if not k.startswith("_")}}
            for h, ws in sorted(hosts.items())]


def _note_host_facts(facts: dict, w: dict, beat: float) -> None:
    """Per host: the load average of its latest heartbeat and the largest bundle cache its workers report (workers
    sharing a $LIBREFANG_HOME share one cache)."""
    load = w.get("load")
    if isinstance(load, list) and load and beat >= facts.get("_load_beat", -1.0):
        facts["load"], facts["_load_beat"] = load, beat
    cache = w.get("bundle_cache")
    if isinstance(cache, dict) and cache.get("bytes", 0) >= facts.get("bundle_cache", {}).get("bytes", -1):
        facts["bundle_cache"] = cache


def job_outcomes(since: dt.datetime) -> dict:
    """Stored job outcomes since a time: done / expired / failed counts (what the queue delivered)."""
    counts = dict.fromkeys(("done", "expired", "failed"), 0)
    for state, n in JobRecord.objects.filter(finished_at__gte=since).values_list("state").annotate(n=Count("id")).order_by():
        counts[state] = n
    return counts


def calls_since(since: dt.datetime) -> int:
    agg = HookMetricBucket.objects.filter(minute__gte=since).aggregate(c=Sum("calls"), cc=Sum("console_calls"))
    return (agg["c"] or 0) + (agg["cc"] or 0)
