"""Agent hook calls as the web tier answers them: enqueue to a worker, wait until the deadline, else fall back."""

from __future__ import annotations

import logging
import time
from typing import Any

from asgiref.sync import sync_to_async

from engine import hooks as H
from engine import protocol as P
from plugins_app import bus
from plugins_app.services.engine import get_engine

log = logging.getLogger("librefang.hooks")
# Extra wait beyond the plugin's own timeout, so the worker's classified failure (not our guess) comes back.
REPLY_MARGIN_SECS = 0.5


async def call_hook(hook: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(status, body) for an agent's hook call."""
    engine = get_engine()
    if hook in H.FIRE_AND_FORGET_HOOKS:
        job_id = await bus.enqueue(hook, request)
        return 202, {"accepted": True, "job_id": job_id, "hook": hook}
    deadline = await sync_to_async(engine.deadline_secs, thread_sensitive=False)(hook)
    started = time.monotonic()
    try:
        reply = await bus.submit_and_wait(hook, request, deadline + REPLY_MARGIN_SECS, deadline_secs=deadline)
        reason = f"{P.DEADLINE_EXCEEDED}: no worker answered within {deadline:g}s"
    except Exception as exc:  # Redis down: the agent still gets an answer
        log.warning("bus unavailable for %s: %s", hook, exc)
        reply, reason = None, f"{P.WORKER_UNAVAILABLE}: job bus unreachable ({type(exc).__name__})"
    if reply is not None and reply.get("aborted"):
        # on_hook_failure = "abort": the agent gets an error, not a fallback (LibreFang aborts the turn)
        err = reply.get("error") or {}
        return 502, {"error": {"code": "hook_aborted",
                               "message": f"{err.get('plugin', 'a plugin')} failed its {hook} hook and its "
                                          f"on_hook_failure policy is abort: {err.get('message', '')}".strip(),
                               "details": {**err, "trace_ids": reply.get("trace_ids", [])}}}
    if reply is not None and "_engine_error" not in reply:
        return 200, reply
    if reply is not None:
        reason = f"engine_error: {reply['_engine_error']}"
    fallback = await sync_to_async(engine.default, thread_sensitive=False)(hook, request, reason)
    body = fallback.to_dict()
    body["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    return 200, body


async def test_hook(plugin: str, hook: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one plugin's hook through a worker, whatever the active configuration."""
    try:
        reply = await bus.submit_and_wait(hook, request, timeout + REPLY_MARGIN_SECS + 1, kind="test_hook",
                                          plugin=plugin, deadline_secs=timeout + 1)
    except Exception as exc:  # Redis down: say so instead of failing the request
        log.warning("bus unavailable for test-hook %s.%s: %s", plugin, hook, exc)
        return {"ok": False, "reply": None, "stderr": "", "elapsed_ms": None, "trace_id": None,
                "error": {"kind": P.WORKER_UNAVAILABLE, "message": f"job bus unreachable ({type(exc).__name__})"}}
    if reply is None:
        return {"ok": False, "reply": None, "stderr": "", "elapsed_ms": None, "trace_id": None,
                "error": {"kind": P.WORKER_UNAVAILABLE, "message": f"no worker answered within {timeout:g}s"}}
    if "_engine_error" in reply:
        return {"ok": False, "reply": None, "stderr": "", "elapsed_ms": None, "trace_id": None,
                "error": {"kind": "engine_error", "message": reply["_engine_error"]}}
    return reply
