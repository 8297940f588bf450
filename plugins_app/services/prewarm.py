"""Prewarm (LibreFang's `POST /plugins/prewarm` and `/plugins/{name}/prewarm`): every live worker starts the
warm-start zygotes of the plugins' python hooks and fetches their pinned bundles, so the next call pays neither.

The web tier posts one request on the bus's control stream (plugins_app/bus/control.py); each worker's control thread
(plugins_app/management/commands/worker.py) runs `warm_here` (plugins_app/services/prewarm_worker.py) and
answers; the route reports per worker what it confirmed, and lists the workers that heartbeat but did not answer in
time. Nothing is reported warmed that a worker did not confirm.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from plugins_app import bus
from plugins_app.errors import PluginError
from plugins_app.home import catalog as plugin_catalog
from plugins_app.services import audit
from plugins_app.services.bundles import PinsUnavailable, job_pins

WAIT_SECS = 10.0


# ---- web tier ----

def _targets(name: str | None, pins: dict[str, str] | None, only: list[str] | None = None
             ) -> tuple[list[str], dict[str, str]]:
    """The plugins to warm, and the asked-for ones that will not be (name -> why). One named plugin that cannot be
    warmed is an error (404/409); in a list (LibreFang's `{"plugins": [...]}`) it is reported per plugin instead."""
    catalog = plugin_catalog()
    if name is None and not only:
        if pins is not None:
            return sorted(pins), {}
        return [n for n in catalog.names() if catalog.get(n).enabled], {}
    names, refused = [], {}
    for n in [name] if name is not None else dict.fromkeys(only):
        if not catalog.exists(n) and (pins is None or n not in pins):
            err = PluginError("not_found", f"plugin {n!r} is not installed", 404)
        elif (pins is not None and n not in pins) or (pins is None and not catalog.get(n).enabled):
            err = PluginError("plugin_disabled", f"plugin {n!r} is disabled: its hooks do not run", 409)
        else:
            names.append(n)
            continue
        if name is not None:
            raise err
        refused[n] = err.message
    return names, refused


def _pins() -> tuple[dict[str, str], str] | None:
    try:
        return job_pins()
    except PinsUnavailable as exc:
        raise PluginError("unavailable", str(exc), 503) from exc


async def prewarm(name: str | None, actor: str, wait_secs: float | None = None,
                  only: list[str] | None = None) -> dict[str, Any]:
    """Warm `name` (or the plugins in `only`, or every enabled plugin) on every live worker; what each worker
    confirmed within `wait_secs` (default WAIT_SECS)."""
    wait_secs = WAIT_SECS if wait_secs is None else wait_secs
    pins = await sync_to_async(_pins)()
    names, refused = await sync_to_async(_targets)(name, pins[0] if pins else None, only)
    if pins is not None:
        pins = ({n: h for n, h in pins[0].items() if n in names}, pins[1])
    if names:
        try:
            raw = await bus.prewarm(names, wait_secs, pins)
        except bus.BusUnavailable as exc:
            raise PluginError("unavailable", f"cannot reach the workers: {exc}", 503) from exc
    else:
        raw = {"answers": [], "missing": []}
    workers = [_worker_report(a, names) for a in raw["answers"]]
    result = {
        "plugins": names,
        "workers": workers,
        "missing": raw["missing"],
        "warmed_everywhere": bool(workers) and not raw["missing"] and not refused and all(w["ok"] for w in workers),
        "results": {**{n: _plugin_result(n, workers, raw["missing"]) for n in names},
                    **{n: {"ok": False, "message": why} for n, why in refused.items()}},
    }
    await sync_to_async(audit.record)(actor, "plugin.prewarm", name or "*", ok=result["warmed_everywhere"],
                                      details={"plugins": names, "workers": len(workers),
                                               "missing": [m["worker"] for m in raw["missing"]]})
    return result


def _plugin_result(name: str, workers: list[dict], missing: list[dict]) -> dict[str, Any]:
    """LibreFang's per-plugin `{ok, message}`: ok only when every live worker answered and none failed it."""
    failed = [f"{w['worker']}: {w['error'] or '; '.join(f'{h}: {why}' for h, why in p['failed'].items())}"
              for w in workers for p in (w["plugins"] or [{"plugin": name, "failed": {}}])
              if p.get("plugin") == name and (p.get("failed") or w["error"])]
    if not workers:
        return {"ok": False, "message": "no live worker answered"}
    if failed:
        return {"ok": False, "message": "failed on " + "; ".join(failed)}
    if missing:
        return {"ok": False, "message": f"pre-warmed on {len(workers)} worker(s); {len(missing)} did not answer"}
    return {"ok": True, "message": f"pre-warmed on {len(workers)} worker(s)"}


def _worker_report(answer: dict, names: list[str]) -> dict[str, Any]:
    plugins = answer.get("plugins") or []
    ok = not answer.get("error") and all(not p.get("failed") for p in plugins)
    return {"worker": answer.get("worker", ""), "host": answer.get("host", ""), "pid": answer.get("pid"),
            "ok": ok, "error": answer.get("error", ""), "plugins": plugins,
            "zygote_pids": answer.get("zygote_pids") or [], "elapsed_ms": answer.get("elapsed_ms")}
