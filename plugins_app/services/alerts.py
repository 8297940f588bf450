"""Alerts: evaluated by the web tier, delivered to the webhooks of config.toml (plugins_app/selectors/alerts.py).

Who sends them: every web process (daphne, under `librefang start` or `librefang web` alike) runs one evaluator
thread, started by librefang_site/web.py. The web tier is the process that is always there when an operator can
look at anything, and the only one that can say "no live worker" or "Redis unreachable" (a worker cannot report its
own absence; the supervisor does not run under systemd). Several web processes share one row per alert
(AlertState): the process whose UPDATE flips it sends the message, the others see it flipped, so a message goes out
once ("deduplicated"), and once more when the condition ends ("resolved"). While the database is down nothing can
be deduplicated and nothing is sent; Prometheus users alert on the exported gauges instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.utils import timezone

from plugins_app import bus
from plugins_app.home import home
from plugins_app.models import AlertEvent, AlertState, JobRecord
from plugins_app.selectors import alerts as alert_selectors
from plugins_app.selectors import health, outcomes
from plugins_app.selectors.workers import split_dead
from plugins_app.services import audit
from plugins_app.services import config as config_service

log = logging.getLogger("librefang.alerts")
SEND_TIMEOUT_SECS = 5.0
FALLBACK_WINDOW = dt.timedelta(minutes=10)
FALLBACK_MIN_CALLS = 10


@dataclass
class Condition:
    key: str
    rule: str
    firing: bool
    value: float | None
    summary: str


# ---- what is measured ----

def conditions(cfg: alert_selectors.AlertConfig, *, redis_ok: bool, workers: list[dict] | None,
               queue: dict | None) -> list[Condition]:
    """Every enabled rule's condition now. plugin_failing yields one firing condition per failing plugin × hook
    (the ones that stopped failing are resolved by `evaluate`)."""
    out: list[Condition] = []
    rules = set(cfg.rules)
    if "redis_unreachable" in rules:
        out.append(Condition("redis_unreachable", "redis_unreachable", not redis_ok, 0.0 if redis_ok else 1.0,
                             "Redis is unreachable: agents get the default engine, after_turn answers 503"
                             if not redis_ok else "Redis answers"))
    if "no_live_worker" in rules and redis_ok and workers is not None:
        n = len(workers)
        out.append(Condition("no_live_worker", "no_live_worker", n == 0, float(n),
                             "No live worker: every hook call falls back to the default engine" if n == 0
                             else f"{n} live worker(s)"))
    if "queue_lag" in rules and queue is not None:
        lag = int(queue.get("lag") or 0)
        out.append(Condition("queue_lag", "queue_lag", lag >= cfg.queue_lag, float(lag),
                             f"{lag} job(s) wait in the queue (threshold {cfg.queue_lag})"))
    if "fallback_rate" in rules:
        out.append(_fallback_rate(cfg.fallback_rate))
    if "plugin_failing" in rules:
        for plugin, hooks in outcomes.failing().items():
            for hook, row in hooks.items():
                out.append(Condition(f"plugin_failing:{plugin}:{hook}", "plugin_failing", True,
                                     float(row["failures"]), outcomes.describe(plugin, hook, row)))
    return out


def _fallback_rate(threshold: float) -> Condition:
    recent = JobRecord.objects.filter(finished_at__gte=timezone.now() - FALLBACK_WINDOW)
    total = recent.count()
    fell_back = recent.filter(source="default").exclude(fallback_reason="").count()
    rate = fell_back / total if total else 0.0
    return Condition("fallback_rate", "fallback_rate", total >= FALLBACK_MIN_CALLS and rate >= threshold,
                     round(rate, 4), f"{fell_back} of {total} calls in the last 10 min were answered by the default "
                     f"engine ({rate:.0%}; threshold {threshold:.0%})")


# ---- state changes, deduplicated through the database ----

def evaluate(cfg: alert_selectors.AlertConfig, found: list[Condition]) -> list[AlertEvent]:
    """Store each condition's figure; flip the states that changed, and send a message for each flip this process
    won. Returns the events this process recorded."""
    events = []
    seen = set()
    for c in found:
        seen.add(c.key)
        state, _ = AlertState.objects.get_or_create(key=c.key, defaults={"rule": c.rule})
        AlertState.objects.filter(pk=state.pk).update(value=c.value, summary=c.summary, updated_at=timezone.now())
        if c.firing != state.firing and _flip(state.pk, c.firing):
            events.append(_announce(cfg, c.key, c.rule, "firing" if c.firing else "resolved", c.summary))
    for state in AlertState.objects.filter(rule="plugin_failing", firing=True).exclude(key__in=seen):
        _, plugin, hook = (state.key.split(":", 2) + ["", ""])[:3]
        text = f"{plugin} is no longer failing its {hook} hook"
        AlertState.objects.filter(pk=state.pk).update(value=0.0, summary=text)
        if _flip(state.pk, False):
            events.append(_announce(cfg, state.key, state.rule, "resolved", text))
    return events


def _flip(pk: int, firing: bool) -> bool:
    """Only one process wins a flip: the UPDATE matches the row only while it still has the other state."""
    return bool(AlertState.objects.filter(pk=pk, firing=not firing).update(
        firing=firing, since=timezone.now(), updated_at=timezone.now()))


def _announce(cfg: alert_selectors.AlertConfig, key: str, rule: str, status: str, summary: str) -> AlertEvent:
    event = AlertEvent.objects.create(key=key, rule=rule, status=status, summary=summary)
    event.deliveries = [send(hook, event) for hook in cfg.webhooks]
    event.save(update_fields=["deliveries"])
    log.warning("alert %s %s: %s", key, status, summary)
    return event


def send_test(actor: str) -> AlertEvent:
    """The dashboard's test button: one message to every webhook, recorded in the history."""
    cfg = alert_selectors.config()
    return _announce(cfg, "test", "test", "test", f"Test message from the LibreFang dashboard ({actor})")


# ---- delivery ----

def body(fmt: str, event: AlertEvent) -> tuple[bytes, dict[str, str]]:
    """The request body and headers for one webhook format."""
    mark = {"firing": "FIRING", "resolved": "RESOLVED", "test": "TEST"}[event.status]
    if fmt == "slack":
        return json.dumps({"text": f"[{mark}] {event.summary}"}).encode(), {"Content-Type": "application/json"}
    if fmt == "ntfy":
        return event.summary.encode(), {"Title": f"LibreFang {mark.lower()}: {event.rule}",
                                        "Priority": "high" if event.status == "firing" else "default",
                                        "Tags": {"firing": "rotating_light", "resolved": "white_check_mark"}.get(
                                            event.status, "test_tube"), "Content-Type": "text/plain"}
    return json.dumps({"source": "librefang", "status": event.status, "alert": event.key, "rule": event.rule,
                       "summary": event.summary, "at": event.at.isoformat()}).encode(), {
        "Content-Type": "application/json"}


def send(hook: dict, event: AlertEvent) -> dict:
    data, headers = body(hook["format"], event)
    req = urllib.request.Request(hook["url"], data=data, method="POST", headers=headers)
    result = {"url": hook["url"], "format": hook["format"]}
    try:
        with urllib.request.urlopen(req, timeout=SEND_TIMEOUT_SECS) as resp:
            return {**result, "ok": 200 <= resp.status < 300, "status": resp.status}
    except urllib.error.HTTPError as exc:
        return {**result, "ok": False, "status": exc.code}
    except (OSError, ValueError) as exc:
        return {**result, "ok": False, "error": str(exc)[:200]}


# ---- the evaluator thread of a web process ----

async def _measure(cfg: alert_selectors.AlertConfig) -> list[Condition]:
    redis_ok = await bus.ping()
    workers = queue = None
    if redis_ok:
        try:
            supervisor = await sync_to_async(health.supervisor, thread_sensitive=False)()
            workers, _dead = split_dead(await bus.live_workers(), supervisor)
            queue = await bus.queue_stats()
        except bus.REDIS_DOWN:
            redis_ok = False
    return await sync_to_async(conditions, thread_sensitive=False)(cfg, redis_ok=redis_ok, workers=workers,
                                                                    queue=queue)


async def _run_forever(stop: threading.Event) -> None:
    while not stop.is_set():
        cfg = await sync_to_async(alert_selectors.config, thread_sensitive=False)()
        try:
            found = await _measure(cfg)
            await sync_to_async(evaluate, thread_sensitive=False)(cfg, found)
        except Exception:  # the database away, a bug: try again next round
            log.warning("alert evaluation failed", exc_info=True)
        await asyncio.sleep(max(1.0, cfg.every_secs))


_started: threading.Event | None = None


def start_in_background() -> None:
    """One evaluator thread per web process (its own event loop, for the bus's asyncio reads)."""
    global _started
    if _started is not None:
        return
    _started = threading.Event()
    threading.Thread(target=lambda: asyncio.run(_run_forever(_started)), name="alerts", daemon=True).start()


def configure(actor: str, rules: list[str], fallback_rate: float, queue_lag: int, webhooks: list[dict]) -> None:
    """The Alerts page's edit: [alerts] written into config.toml (the evaluators read it on their next round) and
    audited with what changed (webhook URLs are not logged: they often carry a secret)."""
    details = {"rules": rules, "fallback_rate": fallback_rate, "queue_lag": queue_lag,
               "webhooks": [w["format"] for w in webhooks]}
    try:
        config_service.write_alerts(home().config_path, rules, fallback_rate, queue_lag, webhooks)
    except (config_service.ConfigWriteError, OSError) as exc:
        audit.record(actor, "alerts.configure", "config.toml", ok=False, details={**details, "error": str(exc)})
        raise
    audit.record(actor, "alerts.configure", "config.toml", details=details)
