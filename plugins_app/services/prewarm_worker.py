"""The worker's half of prewarm (the web tier's is plugins_app/services/prewarm.py): fetch the pinned bundles a
request names and start their python hooks' zygotes, here, and say what was done. Apart from the web half so the web
process never imports the engine that runs hooks."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from django.db import close_old_connections

from engine.plugins.bundles import BundleError
from engine.prewarm import warm_plugin
from engine.process import warmstart
from plugins_app.home import home
from plugins_app.services.engine import engine_for_job


def warm_here(fields: dict[str, str]) -> dict[str, Any]:
    """Run one prewarm request on this worker: fetch the named bundles, start the zygotes. Never raises."""
    started = time.monotonic()
    out: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "plugins": [], "error": ""}
    try:
        names = [str(n) for n in json.loads(fields.get("plugins") or "[]")]
        bundles = json.loads(fields["bundles"]) if "bundles" in fields else None
        close_old_connections()
        engine = engine_for_job(bundles, fields.get("engine_config", ""))
        for name in names:
            if not engine.catalog.exists(name):
                out["plugins"].append({"plugin": name, "runtime": "", "warmed": [], "skipped": {},
                                       "failed": {"*": "not installed on this worker"}, "zygotes": 0})
                continue
            report = warm_plugin(engine.catalog.get(name), home(), policy=engine.permissions(engine.config.get()))
            report["bundle"] = (bundles or {}).get(name, "")[:12]
            out["plugins"].append(report)
    except BundleError as exc:
        out["error"] = f"bundle not fetched: {exc}"
    except Exception as exc:  # reported to the operator, never a dead control thread
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        close_old_connections()
    out["zygote_pids"] = warmstart.zygote_pids()
    out["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    return out
