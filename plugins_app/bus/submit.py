"""Queueing jobs from the web tier: fire-and-forget (enqueue) or blocking (submit_and_wait, and its sync form)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from plugins_app.bus.affinity import route, route_sync
from plugins_app.bus.clients import REDIS_DOWN, BusUnavailable, client
from plugins_app.bus.hub import current_hub, first_genuine
from plugins_app.bus.job import job_fields, job_fields_async
from plugins_app.bus.keys import reply_key


async def enqueue(hook: str, request: Any, *, kind: str = "hook", plugin: str = "",
                  store_within: float = 5.0, agent: str | None = None) -> str:
    """Fire-and-forget: once this returns the job is in Redis and is processed at least once. `agent`: route it
    to that agent's worker host (agent affinity, plugins_app/bus/affinity.py; the caller decides).
    Raises BusUnavailable / BusCapacity when it could not be stored."""
    hub = current_hub()
    job_id, fields = await job_fields_async(kind, hook, request, None, False, plugin)
    await hub.xadd(fields, store_within, await route(agent, hub.hosts, hub.r))
    return job_id


async def submit_and_wait(hook: str, request: Any, wait_secs: float, *, kind: str = "hook",
                          plugin: str = "", deadline_secs: float | None = None,
                          agent: str | None = None) -> dict | None:
    """Enqueue a blocking job and wait for its reply; None when no reply came within `wait_secs`. `agent` as
    for enqueue. Raises BusUnavailable / BusCapacity when the job could not be stored."""
    hub = current_hub()
    hub.ensure_running()
    job_id, fields = await job_fields_async(kind, hook, request, deadline_secs or wait_secs, True, plugin,
                                            reply_to=hub.channel)
    started = time.monotonic()
    fut: asyncio.Future = asyncio.get_running_loop().create_future()
    hub.waiters[job_id] = fut
    try:
        await hub.xadd(fields, wait_secs, await route(agent, hub.hosts, hub.r))
        return await hub.wait(job_id, fut, wait_secs - (time.monotonic() - started))
    finally:
        hub.waiters.pop(job_id, None)


def submit_and_wait_sync(kind: str, hook: str, request: Any, wait_secs: float, *, plugin: str = "",
                         agent: str | None = None) -> dict | None:
    """The blocking form of submit_and_wait, for sync callers (routes that run in a thread, commands); its job goes
    to the same stream as submit_and_wait's would (`agent` included)."""
    job_id, fields = job_fields(kind, hook, request, wait_secs, True, plugin)
    r = client()
    try:
        r.xadd(route_sync(agent, r), fields)
    except REDIS_DOWN as exc:
        raise BusUnavailable(f"Redis unreachable ({type(exc).__name__}: {exc})") from exc
    end = time.monotonic() + wait_secs
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return None
        got = r.blpop([reply_key(job_id)], timeout=max(0.01, min(left, 5.0)))
        reply = first_genuine(job_id, [got[1]]) if got else None
        if reply is not None:  # anything else pushed there (unsigned, another job's) is dropped: wait on
            return reply

