"""Alert rules as `config.toml` sets them, their current states and the alert history (plugins_app/services/alerts.py
evaluates and delivers them).

    [alerts]
    rules = ["plugin_failing", "fallback_rate", "no_live_worker", "queue_lag", "redis_unreachable"]  # the default
    fallback_rate = 0.2        # fraction of agent calls answered by the default engine over the last 10 min
    queue_lag = 100            # jobs waiting, not yet delivered to a worker
    every_secs = 5             # how often each web process evaluates

    [[alerts.webhooks]]
    url = "https://hooks.example/…"
    format = "json"            # or "slack" ({"text": …}) or "ntfy" (text body, Title/Priority/Tags headers)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field

from plugins_app.home import home
from plugins_app.models import AlertEvent, AlertState

RULES = {
    "plugin_failing": "a plugin fails a hook (plugins_app/selectors/outcomes.py)",
    "fallback_rate": "too many agent calls answered by the default engine",
    "no_live_worker": "no worker heartbeats",
    "queue_lag": "jobs wait in the queue",
    "redis_unreachable": "Redis does not answer",
}
FORMATS = ("json", "slack", "ntfy")


@dataclass
class AlertConfig:
    rules: list[str] = field(default_factory=lambda: list(RULES))
    fallback_rate: float = 0.2
    queue_lag: int = 100
    every_secs: float = 5.0
    webhooks: list[dict] = field(default_factory=list)
    error: str | None = None  # why [alerts] could not be read (the defaults apply meanwhile)


def config() -> AlertConfig:
    """[alerts] of config.toml; the defaults (every rule, no webhook) when absent or invalid (with `error`)."""
    try:
        with open(home().config_path, "rb") as fh:
            table = tomllib.load(fh).get("alerts") or {}
    except FileNotFoundError:
        return AlertConfig()
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return AlertConfig(error=f"config.toml: {exc}")
    try:
        hooks = [{"url": str(w["url"]), "format": str(w.get("format", "json"))} for w in table.get("webhooks", [])]
        bad = [w["format"] for w in hooks if w["format"] not in FORMATS] + [
            r for r in table.get("rules", RULES) if r not in RULES]
        if bad:
            raise ValueError(f"unknown rule or webhook format: {', '.join(map(str, bad))}")
        return AlertConfig(rules=list(table.get("rules", RULES)), fallback_rate=float(table.get("fallback_rate", 0.2)),
                           queue_lag=int(table.get("queue_lag", 100)), every_secs=float(table.get("every_secs", 5)),
                           webhooks=hooks)
    except (KeyError, TypeError, ValueError) as exc:
        return AlertConfig(error=f"[alerts]: {exc}")


def states() -> list[AlertState]:
    return list(AlertState.objects.order_by("-firing", "rule", "key"))


def history(limit: int = 100) -> list[AlertEvent]:
    return list(AlertEvent.objects.all()[:limit])
