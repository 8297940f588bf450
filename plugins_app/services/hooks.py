"""Agent hook calls as the web tier answers them: enqueue to a worker, wait until the deadline, else fall back. The
answer (`Answer`) carries the worker's reply as it came: status and JSON body, never parsed here."""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from engine import hooks as H
from engine import protocol as P
from engine.hook_requests import AgentRequest
from plugins_app import bus
from plugins_app.models import JobRecord
from plugins_app.services.affinity import agent_to_route
from plugins_app.services.hook_policy import hook_policy

log = logging.getLogger("librefang.hooks")
# Extra wait beyond the plugin's own timeout, so the worker's classified failure (not our guess) comes back.
REPLY_MARGIN_SECS = 0.5
# How long a fire-and-forget call may wait for its job to be stored before the agent is told to retry.
STORE_WITHIN_SECS = 5.0
# What an agent is told to wait before retrying a fire-and-forget call that could not be stored.
RETRY_AFTER_SECS = 2
# fallback_reason prefixes of our own making (not a plugin's failure)
BUS_UNAVAILABLE = "bus_unavailable"
CAPACITY = "capacity"
SHUTTING_DOWN = "shutting_down"


@dataclass(frozen=True)
class Answer:
    """What an agent gets for a hook call: the status, the JSON body as it goes out (a worker's reply is passed on
    as the worker made it, plugins_app/bus/job.py Reply) and the headers beyond Content-Type (Retry-After)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
        return cls(status, bus.to_json(data).encode(), headers or {})

    def data(self) -> Any:
        """The body, parsed (for callers that read the answer: MCP tools, a dialect's conversion)."""
        return json.loads(self.body)


async def call_hook(hook: str, request: dict[str, Any]) -> Answer:
    """The answer to an agent's hook call."""
    if hook in H.FIRE_AND_FORGET_HOOKS:
        return await _enqueue(hook, request)
    policy = hook_policy()
    # Cached config and catalog (a few stat calls): cheaper on the loop than a hop to a thread on every call.
    deadline = policy.deadline_secs(hook)
    started = time.monotonic()
    try:
        reply = await bus.submit_and_wait(hook, request, deadline + REPLY_MARGIN_SECS, deadline_secs=deadline,
                                          agent=agent_to_route(request))
        reason = (f"{P.DEADLINE_EXCEEDED}: no worker answered within {deadline:g}s" if bus.replies_reachable() else
                  f"{BUS_UNAVAILABLE}: Redis went away while waiting for the reply")
    except bus.BusDraining as exc:  # daphne is stopping: answer now rather than with an empty reply
        reply, reason = None, f"{SHUTTING_DOWN}: {exc}"
    except bus.BusUnavailable as exc:  # the agent still gets an answer, and is told why it is the default one
        log.warning("bus unavailable for %s: %s", hook, exc)
        reply, reason = None, f"{BUS_UNAVAILABLE}: {exc}"
    except bus.BusCapacity as exc:
        log.warning("bus at capacity for %s: %s", hook, exc)
        reply, reason = None, f"{CAPACITY}: {exc}"
    except Exception as exc:  # Redis refused the command (out of memory, read-only replica…): still an answer
        log.warning("bus error for %s: %s", hook, exc)
        reply, reason = None, f"{BUS_UNAVAILABLE}: Redis refused the job ({type(exc).__name__}: {exc})"
    if reply is not None and not reply.failed:  # the worker's answer (a 502 when a plugin aborted the turn)
        return Answer(reply.status, reply.body.encode())
    if reply is not None:
        reason = f"engine_error: {reply.body}"
    elif reason.startswith((BUS_UNAVAILABLE, CAPACITY)):  # no worker will ever record this job: we do
        await sync_to_async(_record_web_fallback, thread_sensitive=False)(hook, reason)
    body = await sync_to_async(policy.fallback, thread_sensitive=False)(hook, request, reason)
    body["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    return Answer.of(body)


async def _enqueue(hook: str, request: dict[str, Any]) -> Answer:
    """202 only once the job is in Redis; otherwise 503 + Retry-After so the agent sends it again."""
    try:
        job_id = await bus.enqueue(hook, request, store_within=STORE_WITHIN_SECS, agent=agent_to_route(request))
    except Exception as exc:  # nothing stored, whatever the reason: never a 202, never a 500
        unavailable = not isinstance(exc, bus.BusCapacity)
        log.warning("%s not accepted: %s", hook, exc)
        code = BUS_UNAVAILABLE if unavailable else CAPACITY
        message = (f"The job bus (Redis) is unreachable, so this {hook} call was not stored; retry later."
                   if unavailable else f"Too many jobs are waiting to be stored; this {hook} call was not stored.")
        body = {"error": {"code": code, "message": message,
                          "details": {"cause": str(exc), "retry_after_secs": RETRY_AFTER_SECS}}}
        return Answer.of(body, 503, {"Retry-After": str(RETRY_AFTER_SECS)})
    return Answer.of({"accepted": True, "job_id": job_id, "hook": hook}, 202)


async def answer(call: AgentRequest) -> Answer:
    """call_hook for an agent's checked request (engine/hook_requests.py `accept`): the answer's messages go back in
    the dialect the agent sent (engine/dialects.py), the one case where the web tier reads the worker's reply."""
    found = await call_hook(call.hook, call.request)
    if found.status == 200 and call.conversion is not None:
        return Answer.of(call.reply(found.data()), found.status, found.headers)
    return found


def _record_web_fallback(hook: str, reason: str) -> None:
    """A JobRecord for a call the web tier answered itself (Redis unreachable, our own capacity), so such
    fallbacks are counted with the others (by `fallback_reason` prefix)."""
    try:
        JobRecord.objects.create(job_id=f"web-{uuid.uuid4().hex}", hook=hook, state=JobRecord.State.FAILED,
                                 source="default", fallback_reason=reason, worker="web")
    except Exception:  # the database may be the thing that is down: the agent's answer matters more
        log.warning("could not record a %s fallback", hook, exc_info=True)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "reply": None, "stderr": "", "elapsed_ms": None, "trace_id": None,
            "error": {"kind": kind, "message": message}}


async def test_hook(plugin: str, hook: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one plugin's hook through a worker, whatever the active configuration (never a disabled plugin)."""
    try:
        reply = await bus.submit_and_wait(hook, request, timeout + REPLY_MARGIN_SECS + 1, kind="test_hook",
                                          plugin=plugin, deadline_secs=timeout + 1,
                                          agent=agent_to_route(request, plugin))
    except Exception as exc:  # Redis down or refusing: say so instead of failing the request
        log.warning("bus unavailable for test-hook %s.%s: %s", plugin, hook, exc)
        return _error(P.WORKER_UNAVAILABLE, f"job bus unreachable: {exc}")
    if reply is None:
        return _error(P.WORKER_UNAVAILABLE, f"no worker answered within {timeout:g}s")
    if reply.failed:
        kind = P.PLUGIN_DISABLED if reply.body.startswith(P.PLUGIN_DISABLED) else "engine_error"
        return _error(kind, reply.body)
    return reply.data()
