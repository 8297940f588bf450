"""The job stream: the only module that talks to the Redis Stream between web tier and workers.

Jobs go into one stream with one consumer group, so any number of workers on any number of machines share them.
A worker XACKs a job only after its outcome is stored; jobs pending on a worker whose heartbeat has stopped are
claimed by a live worker. Blocking hooks carry a deadline and a reply key the web tier waits on.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis
from django.conf import settings

GROUP = "engine"
HEARTBEAT_TTL_SECS = 6
REPLY_TTL_SECS = 120
# A pending job idle this long is claimed even if its worker still heartbeats (it is stuck on it).
STUCK_JOB_MS = 15 * 60 * 1000


def _key(*parts: str) -> str:
    return ":".join((settings.LIBREFANG_REDIS_PREFIX, *parts))


def stream_key() -> str:
    return _key("engine", "jobs")


def reply_key(job_id: str) -> str:
    return _key("engine", "reply", job_id)


def heartbeat_key(worker: str) -> str:
    return _key("engine", "worker", worker)


# redis-py 8 defaults to a 5 s socket timeout, which cuts blocking reads (BLPOP until a hook's deadline,
# XREADGROUP BLOCK) short; blocking calls here carry their own timeouts, so reads may wait.
CLIENT_OPTIONS = {"decode_responses": True, "socket_timeout": None, "socket_connect_timeout": 5,
                  "socket_keepalive": True, "health_check_interval": 30}
_sync_pool: redis.ConnectionPool | None = None
_async_clients: dict[int, aredis.Redis] = {}


def client() -> redis.Redis:
    global _sync_pool
    if _sync_pool is None:
        _sync_pool = redis.ConnectionPool.from_url(settings.REDIS_URL, **CLIENT_OPTIONS)
    return redis.Redis(connection_pool=_sync_pool)


def aclient() -> aredis.Redis:
    """One pooled asyncio client per event loop (daphne runs one loop; tests may run several)."""
    loop = asyncio.get_running_loop()
    cl = _async_clients.get(id(loop))
    if cl is None:
        cl = aredis.Redis.from_url(settings.REDIS_URL, **CLIENT_OPTIONS)
        _async_clients[id(loop)] = cl
    return cl


@dataclass
class Job:
    id: str  # our job id (also the reply key suffix)
    entry_id: str  # the stream entry id
    kind: str  # "hook" | "test_hook"
    hook: str
    request: Any
    deadline: float  # unix time; 0 = none (fire-and-forget)
    wants_reply: bool
    plugin: str = ""
    enqueued_at: float = 0.0
    deliveries: int = 1

    @property
    def expired(self) -> bool:
        return bool(self.deadline) and time.time() > self.deadline


def _fields(kind: str, hook: str, request: Any, deadline_secs: float | None, wants_reply: bool,
            plugin: str = "") -> tuple[str, dict[str, str]]:
    job_id = uuid.uuid4().hex
    now = time.time()
    return job_id, {
        "id": job_id,
        "kind": kind,
        "hook": hook,
        "plugin": plugin,
        "request": json.dumps(request),
        "deadline": repr(now + deadline_secs) if deadline_secs else "0",
        "reply": "1" if wants_reply else "0",
        "enqueued_at": repr(now),
    }


def _parse(entry_id: str, fields: dict[str, str], deliveries: int = 1) -> Job:
    return Job(
        id=fields.get("id", entry_id), entry_id=entry_id, kind=fields.get("kind", "hook"),
        hook=fields.get("hook", ""), request=json.loads(fields.get("request") or "null"),
        deadline=float(fields.get("deadline") or 0), wants_reply=fields.get("reply") == "1",
        plugin=fields.get("plugin", ""), enqueued_at=float(fields.get("enqueued_at") or 0), deliveries=deliveries,
    )


# ---- web tier (async) ----

async def enqueue(hook: str, request: Any, *, kind: str = "hook", plugin: str = "") -> str:
    """Fire-and-forget: processed at least once, even across a worker crash."""
    job_id, fields = _fields(kind, hook, request, None, False, plugin)
    await aclient().xadd(stream_key(), fields)
    return job_id


async def submit_and_wait(hook: str, request: Any, wait_secs: float, *, kind: str = "hook",
                          plugin: str = "", deadline_secs: float | None = None) -> dict | None:
    """Enqueue a blocking job and wait for its reply; None when no reply came within `wait_secs`."""
    job_id, fields = _fields(kind, hook, request, deadline_secs or wait_secs, True, plugin)
    r = aclient()
    await r.xadd(stream_key(), fields)
    got = await r.blpop([reply_key(job_id)], timeout=max(0.01, wait_secs))
    if got is None:
        return None
    return json.loads(got[1])


def submit_and_wait_sync(kind: str, hook: str, request: Any, wait_secs: float, *, plugin: str = "") -> dict | None:
    """The blocking form of submit_and_wait, for sync callers (routes that run in a thread, commands)."""
    job_id, fields = _fields(kind, hook, request, wait_secs, True, plugin)
    r = client()
    r.xadd(stream_key(), fields)
    got = r.blpop([reply_key(job_id)], timeout=max(0.01, wait_secs))
    return json.loads(got[1]) if got else None


def worker_alive() -> bool:
    r = client()
    return any(True for _ in r.scan_iter(match=heartbeat_key("*"), count=100))


async def live_workers() -> list[dict]:
    r = aclient()
    out = []
    async for key in r.scan_iter(match=heartbeat_key("*"), count=100):
        raw = await r.get(key)
        if raw:
            out.append(json.loads(raw))
    return out


async def ping() -> bool:
    try:
        return bool(await aclient().ping())
    except (redis.RedisError, OSError):
        return False


async def queue_stats() -> dict:
    r = aclient()
    try:
        length = await r.xlen(stream_key())
        pending = await r.xpending(stream_key(), GROUP)
    except redis.ResponseError:
        return {"length": 0, "pending": 0}
    return {"length": length, "pending": pending.get("pending", 0) if isinstance(pending, dict) else 0}


# ---- worker side (sync; runs in the worker process) ----

class JobStream:
    def __init__(self, consumer: str | None = None, r: redis.Redis | None = None):
        self.r = r or client()
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.stream = stream_key()

    def ensure_group(self) -> None:
        try:
            self.r.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, count: int, block_ms: int) -> list[Job]:
        try:
            resp = self.r.xreadgroup(GROUP, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                self.ensure_group()
                return []
            raise
        jobs = []
        for _stream, entries in resp or []:
            for entry_id, fields in entries:
                if fields:
                    jobs.append(_parse(entry_id, fields))
        return jobs

    def reclaim(self) -> list[Job]:
        """Claim jobs pending on workers that stopped heartbeating (and jobs stuck far too long)."""
        claimed: list[Job] = []
        try:
            summary = self.r.xpending(self.stream, GROUP)
        except redis.ResponseError:
            return claimed
        for info in summary.get("consumers") or []:
            name = info["name"]
            if name == self.consumer or self.r.exists(heartbeat_key(name)):
                continue
            while True:
                pending = self.r.xpending_range(self.stream, GROUP, min="-", max="+", count=100, consumername=name)
                if not pending:
                    break
                ids = [p["message_id"] for p in pending]
                counts = {p["message_id"]: p["times_delivered"] for p in pending}
                for entry_id, fields in self.r.xclaim(self.stream, GROUP, self.consumer, 0, ids):
                    if fields:
                        claimed.append(_parse(entry_id, fields, counts.get(entry_id, 1) + 1))
                    else:  # the entry was deleted but not acked
                        self.r.xack(self.stream, GROUP, entry_id)
            self.r.xgroup_delconsumer(self.stream, GROUP, name)
        _next, entries, *_ = self.r.xautoclaim(self.stream, GROUP, self.consumer, STUCK_JOB_MS, "0-0", count=100)
        for entry_id, fields in entries:
            if fields:
                claimed.append(_parse(entry_id, fields, 2))
        return claimed

    def reply(self, job: Job, payload: dict) -> None:
        key = reply_key(job.id)
        pipe = self.r.pipeline()
        pipe.rpush(key, json.dumps(payload))
        pipe.expire(key, REPLY_TTL_SECS)
        pipe.execute()

    def ack(self, job: Job) -> None:
        pipe = self.r.pipeline()
        pipe.xack(self.stream, GROUP, job.entry_id)
        pipe.xdel(self.stream, job.entry_id)
        pipe.execute()

    def heartbeat(self, info: dict) -> None:
        self.r.set(heartbeat_key(self.consumer), json.dumps({"worker": self.consumer, **info}), ex=HEARTBEAT_TTL_SECS)

    def retire(self) -> None:
        self.r.delete(heartbeat_key(self.consumer))
