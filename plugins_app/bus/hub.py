"""The web side of the job stream: queueing jobs (enqueue, submit_and_wait, and submit_and_wait_sync for threads)
through one hub per event loop (one per web process under daphne).

XADDs go through one writer task that pipelines whatever is queued, so a burst queues instead of exhausting a pool.
Blocking hooks carry a deadline and a reply channel: the hub keeps ONE subscriber connection on its own channel and
resolves waiting calls by job id with the worker's Reply (plugins_app/bus/job.py), so a waiting call holds no Redis
connection; the worker also pushes the reply onto a short-lived list, read when the subscriber was reconnecting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Any

import redis.asyncio as aredis
from django.conf import settings

from plugins_app.bus.affinity import LiveHosts, route, route_sync
from plugins_app.bus.clients import (
    ASYNC_OPTIONS,
    REDIS_DOWN,
    SOCKET_TIMEOUT_SECS,
    BusCapacity,
    BusDraining,
    BusUnavailable,
    client,
    subscribe_forever,
)
from plugins_app.bus.job import Reply, job_fields, job_fields_async
from plugins_app.bus.keys import reply_channel_prefix, reply_key, stream_key
from plugins_app.bus.signing import open_reply

log = logging.getLogger("librefang.bus")

# Jobs waiting for the writer task beyond this are refused as our own capacity limit (never silently).
OUTBOX_MAX = 20_000
WRITE_BATCH_MAX = 500


class Hub:
    """Per event loop: the writer task that pipelines XADDs and the one subscriber that resolves waiting calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.url = settings.REDIS_URL
        self.channel = reply_channel_prefix() + f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        pool = aredis.BlockingConnectionPool.from_url(self.url, max_connections=16,
                                                      timeout=SOCKET_TIMEOUT_SECS, **ASYNC_OPTIONS)
        self.r = aredis.Redis(connection_pool=pool)
        self.outbox: asyncio.Queue[tuple[str, dict[str, str], asyncio.Future]] = asyncio.Queue(maxsize=OUTBOX_MAX)
        self.waiters: dict[str, asyncio.Future[Reply]] = {}
        self.delivered: list[str] = []  # reply lists to delete (their reply already came by the channel)
        self.subscribed = False
        self.draining = ""
        self.last_error: str = ""
        self._tasks: list[asyncio.Task] = []
        self.hosts = LiveHosts()  # where jobs with agent affinity go (plugins_app/bus/affinity.py)

    def ensure_running(self) -> None:
        if not self._tasks or any(t.done() for t in self._tasks):
            for t in self._tasks:
                t.cancel()
            self._tasks = [asyncio.ensure_future(self._write_loop()), asyncio.ensure_future(self._listen_loop())]

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        self._tasks = []

    # -- writing --

    def drain(self, reason: str) -> None:
        self.draining = reason
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(BusDraining(reason))

    async def xadd(self, fields: dict[str, str], timeout: float, stream: str = "") -> str:
        if self.draining:
            raise BusDraining(self.draining)
        self.ensure_running()
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        try:
            self.outbox.put_nowait((stream or stream_key(), fields, fut))
        except asyncio.QueueFull:
            raise BusCapacity(f"{OUTBOX_MAX} jobs already waiting to be stored") from None
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            fut.cancel()  # the writer skips it: never stored after we said it was not
            if self.last_error:
                raise BusUnavailable(self.last_error) from None
            raise BusCapacity(f"job not stored within {timeout:.1f}s ({self.outbox.qsize()} queued)") from None

    async def _write_loop(self) -> None:
        while True:
            batch = [await self.outbox.get()]
            while len(batch) < WRITE_BATCH_MAX and not self.outbox.empty():
                batch.append(self.outbox.get_nowait())
            batch = [(st, f, fut) for st, f, fut in batch if not fut.done()]
            if not batch:
                continue
            try:
                pipe = self.r.pipeline(transaction=False)
                for target, fields, _ in batch:
                    pipe.xadd(target, fields)
                ids = await pipe.execute()
                self.last_error = ""
            except Exception as exc:  # Redis down or refusing: each caller hears why, nothing is retried for it
                self.last_error = f"Redis unreachable ({type(exc).__name__}: {exc})"
                err = BusUnavailable(self.last_error) if isinstance(exc, REDIS_DOWN) else exc
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(err)
                        fut.exception()  # marks it retrieved even if the caller already gave up
                continue
            for (_, _, fut), entry_id in zip(batch, ids, strict=True):
                if not fut.done():
                    fut.set_result(entry_id)

    # -- replies --

    def deliver(self, job_id: str, sealed: str) -> bool:
        """Resolve the call waiting for `job_id` with a sealed reply; one that is unsigned, tampered with or meant
        for another job is dropped (False), and the call waits on for the worker's reply or its deadline."""
        reply = genuine(job_id, sealed)
        if reply is None:
            return False
        fut = self.waiters.get(job_id)
        if fut is not None and not fut.done():
            fut.set_result(reply)
        return True

    async def _sweep(self) -> None:
        """Replies pushed while we were not subscribed are in their lists."""
        ids = [job_id for job_id, fut in self.waiters.items() if not fut.done()]
        for start in range(0, len(ids), 200):
            chunk = ids[start:start + 200]
            pipe = self.r.pipeline(transaction=False)
            for job_id in chunk:
                pipe.lrange(reply_key(job_id), 0, -1)
            for job_id, sealed in zip(chunk, await pipe.execute(), strict=True):
                if any(self.deliver(job_id, one) for one in sealed or []):
                    self.delivered.append(reply_key(job_id))

    async def _drop_delivered(self) -> None:
        keys, self.delivered = self.delivered, []
        if keys:
            await self.r.unlink(*keys)

    async def _listen_loop(self) -> None:
        await subscribe_forever(self.r, self.channel, on_message=self._on_reply, on_subscribed=self._on_subscribed,
                                on_lost=self._on_lost, on_idle=self._on_idle, what="reply listener")

    async def _on_subscribed(self) -> None:
        self.subscribed = True
        await self._sweep()

    def _on_lost(self) -> None:
        self.subscribed = False

    def _on_reply(self, data: str) -> None:
        job_id, _, sealed = data.partition("\n")
        if self.deliver(job_id, sealed):
            self.delivered.append(reply_key(job_id))

    async def _on_idle(self, quiet: bool) -> None:
        if len(self.delivered) >= 200 or (quiet and self.delivered):
            await self._drop_delivered()

    async def wait(self, job_id: str, fut: asyncio.Future[Reply], timeout: float) -> Reply | None:
        try:
            return await asyncio.wait_for(fut, max(0.01, timeout))
        except TimeoutError:
            try:  # last chance: a reply published while the listener was reconnecting
                pushed = await self.r.lrange(reply_key(job_id), 0, -1)
            except Exception:
                pushed = []
            return first_genuine(job_id, pushed)


def genuine(job_id: str, sealed: str) -> Reply | None:
    """The Reply of a sealed reply to `job_id`; None (logged) when it is unsigned, tampered with or meant for another
    job, or not a Reply (a worker of another version)."""
    data = open_reply(job_id, sealed)
    if data is None:
        log.error("dropped a reply to job %s: its signature is missing or does not match", job_id[:64])
        return None
    reply = Reply.from_wire(data)
    if reply is None:
        log.error("dropped a reply to job %s: not a status and body (a worker of another version?)", job_id[:64])
    return reply


def first_genuine(job_id: str, pushed: list[str]) -> Reply | None:
    """The first reply of a reply list that verifies (whatever else was pushed there), or None."""
    for sealed in pushed or []:
        reply = genuine(job_id, sealed)
        if reply is not None:
            return reply
    return None


_hubs: dict[int, Hub] = {}


def current_hub() -> Hub:
    """This event loop's hub, made on first use."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(id(loop))
    if hub is None or hub.loop is not loop or hub.url != settings.REDIS_URL:
        for key, old in list(_hubs.items()):  # hubs of loops that are gone (async_to_sync in commands, tests)
            if old.loop.is_closed():
                del _hubs[key]
        if hub is not None and hub.loop is loop:
            hub.close()  # REDIS_URL changed (tests): the old hub's tasks would talk to the old Redis
        hub = Hub(loop)
        _hubs[id(loop)] = hub
    return hub


def replies_reachable() -> bool:
    """Whether this event loop's reply listener is subscribed (False: Redis went away while calls waited)."""
    hub = _hubs.get(id(asyncio.get_running_loop()))
    return hub is None or hub.subscribed


def drain(reason: str) -> None:
    """Answer every call of this process that waits for a reply now (they fall back), and store no new job: the
    web process is stopping (librefang_site/asgi.py calls this on SIGTERM)."""
    for hub in list(_hubs.values()):
        hub.drain(reason)



# ---- queueing jobs ----

async def enqueue(hook: str, request: Any, *, kind: str = "hook", plugin: str = "",
                  store_within: float = 5.0, agent: str | None = None) -> str:
    """Fire-and-forget: once this returns the job is in Redis and is processed at least once. `agent`: route it
    to that agent's worker host (agent affinity, plugins_app/bus/affinity.py; the caller decides).
    Raises BusUnavailable / BusCapacity when it could not be stored."""
    hub = current_hub()
    job_id, fields = await job_fields_async(kind, hook, request, None, False, plugin)
    await hub.xadd(fields, store_within, await route(agent, hub.hosts, hub.r) if agent else "")
    return job_id


async def submit_and_wait(hook: str, request: Any, wait_secs: float, *, kind: str = "hook",
                          plugin: str = "", deadline_secs: float | None = None,
                          agent: str | None = None) -> Reply | None:
    """Enqueue a blocking job and wait for its Reply; None when no reply came within `wait_secs`. `agent` as
    for enqueue. Raises BusUnavailable / BusCapacity when the job could not be stored."""
    hub = current_hub()
    hub.ensure_running()
    job_id, fields = await job_fields_async(kind, hook, request, deadline_secs or wait_secs, True, plugin,
                                            reply_to=hub.channel)
    started = time.monotonic()
    fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    hub.waiters[job_id] = fut
    try:
        await hub.xadd(fields, wait_secs, await route(agent, hub.hosts, hub.r) if agent else "")
        return await hub.wait(job_id, fut, wait_secs - (time.monotonic() - started))
    finally:
        hub.waiters.pop(job_id, None)


def submit_and_wait_sync(kind: str, hook: str, request: Any, wait_secs: float, *, plugin: str = "",
                         agent: str | None = None) -> Reply | None:
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
