"""The job stream: the only module that talks to the Redis Stream between web tier and workers.

Jobs go into one stream with one consumer group, so any number of workers on any number of machines share them.
A worker XACKs a job only after its outcome is stored; jobs pending on a worker whose heartbeat has stopped are
claimed by a live worker. Every job is signed (HMAC-SHA256, key in `$LIBREFANG_HOME/bus_key`): a worker runs
nothing it cannot verify.

Blocking hooks carry a deadline and a reply channel. Each web process (one per event loop) keeps ONE subscriber
connection on its own reply channel and resolves waiting calls by job id, so a waiting call holds no Redis
connection; the worker also pushes the reply onto a short-lived list, read when the subscriber was reconnecting.
XADDs go through one writer task that pipelines whatever is queued, so a burst queues instead of exhausting a pool.

Agent affinity (docs/scale-out.md): a job for an agent whose plugin asks for `affinity = "agent"` goes to the stream
of one worker host, chosen by rendezvous hashing of the agent id over the hosts that heartbeat; the workers of that
host read it besides the shared stream, and a live worker moves the jobs of a host that stopped heartbeating to the
agent's new host. A control stream, read by every worker, carries prewarm requests; workers answer on a list.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis
from django.conf import settings

log = logging.getLogger("librefang.bus")

GROUP = "engine"
HEARTBEAT_TTL_SECS = 6
REPLY_TTL_SECS = 60
# A pending job idle this long is claimed even if its worker still heartbeats (it is stuck on it).
STUCK_JOB_MS = 15 * 60 * 1000
# A job pending on THIS worker but not being worked on (its XREADGROUP answer was lost in a Redis outage, or it
# crashed mid-run) is taken up again once idle this long.
OWN_ORPHAN_MS = 5000
# Enqueue path: find out fast that Redis is gone, so the agent gets its fallback (or 503) within the deadline.
CONNECT_TIMEOUT_SECS = 1.0
SOCKET_TIMEOUT_SECS = 3.0
# Jobs waiting for the writer task beyond this are refused as our own capacity limit (never silently).
OUTBOX_MAX = 20_000
HOSTS_TTL_SECS = 1.0
CONTROL_MAXLEN = 100
# Long enough for one worker to move a dead host's jobs; released as soon as it is done.
REHOME_LOCK_MS = 30_000
WRITE_BATCH_MAX = 500
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, OSError)


class BusUnavailable(Exception):
    """Redis could not be reached: nothing was stored."""


class BusCapacity(Exception):
    """Our own queue to Redis is full or too slow: nothing was stored."""


class BusDraining(BusUnavailable):
    """This web process is stopping: waiting calls are answered now instead of being cut off."""


def _key(*parts: str) -> str:
    return ":".join((settings.LIBREFANG_REDIS_PREFIX, *parts))


def stream_key() -> str:
    return _key("engine", "jobs")


def reply_key(job_id: str) -> str:
    return _key("engine", "reply", job_id)


def reply_channel_prefix() -> str:
    return _key("engine", "replies") + ":"


def heartbeat_key(worker: str) -> str:
    return _key("engine", "worker", worker)


def host_stream_key(host: str) -> str:
    """The stream of jobs routed to one worker host (agent affinity)."""
    return _key("engine", "jobs", "host", host)


def host_streams_key() -> str:
    """The set of host ids that ever read a host stream: where a live worker looks for dead hosts' jobs."""
    return _key("engine", "hosts")


def control_key() -> str:
    return _key("engine", "control")


def prewarm_answers_key(stamp: str) -> str:
    return _key("engine", "prewarm", stamp)


def worker_host_id(home: str | os.PathLike) -> str:
    """What "one worker host" means for affinity: the machine and the $LIBREFANG_HOME its workers share (plugins
    keep their files there). LIBREFANG_WORKER_HOST names it explicitly."""
    named = os.environ.get("LIBREFANG_WORKER_HOST", "").strip()
    if named:
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in named)[:100]
    home_tag = hashlib.sha256(os.path.realpath(home).encode()).hexdigest()[:8]
    return f"{socket.gethostname()[:60]}-{home_tag}"


def host_for(agent_id: str, hosts: list[str]) -> str | None:
    """Rendezvous hashing: every web process picks the same host for an agent from the same live hosts, and a host
    leaving moves only its own agents."""
    if not hosts:
        return None
    return max(hosts, key=lambda h: hashlib.sha256(f"{h}\n{agent_id}".encode()).digest())


# ---- signing ----

_key_cache: dict[str, bytes] = {}
_key_lock = threading.Lock()


def bus_key_path() -> Path:
    configured = getattr(settings, "LIBREFANG_BUS_KEY_FILE", None) or os.environ.get("LIBREFANG_BUS_KEY_FILE")
    return Path(configured) if configured else Path(settings.LIBREFANG_HOME) / "bus_key"


def bus_key() -> bytes:
    """The shared signing key; whichever process comes first creates it (0600), atomically, so all agree."""
    path = bus_key_path()
    cached = _key_cache.get(str(path))
    if cached:
        return cached
    with _key_lock:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if not text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
            try:
                os.link(tmp, path)  # fails if another process won the race: then use its key
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
            text = path.read_text().strip()
        _key_cache[str(path)] = text.encode()
        return _key_cache[str(path)]


def _canonical(fields: dict[str, str]) -> bytes:
    return json.dumps(sorted((k, v) for k, v in fields.items() if k != "sig"), separators=(",", ":")).encode()


def sign(fields: dict[str, str]) -> str:
    return hmac.new(bus_key(), _canonical(fields), hashlib.sha256).hexdigest()


def signature_ok(fields: dict[str, str]) -> bool:
    given = fields.get("sig") or ""
    return bool(given) and hmac.compare_digest(given, sign(fields))


# ---- clients ----

# The sync client serves the worker (XREADGROUP blocks 1 s at most) and short commands; blocking waits in sync
# callers are cut into slices below the socket timeout.
CLIENT_OPTIONS = {"decode_responses": True, "socket_timeout": 10, "socket_connect_timeout": 2,
                  "socket_keepalive": True, "health_check_interval": 30}
ASYNC_OPTIONS = {"decode_responses": True, "socket_timeout": SOCKET_TIMEOUT_SECS,
                 "socket_connect_timeout": CONNECT_TIMEOUT_SECS, "socket_keepalive": True,
                 "health_check_interval": 30}
_sync_pools: dict[str, redis.ConnectionPool] = {}
_async_clients: dict[tuple[int, str], aredis.Redis] = {}


def client() -> redis.Redis:
    pool = _sync_pools.get(settings.REDIS_URL)
    if pool is None:
        pool = _sync_pools[settings.REDIS_URL] = redis.ConnectionPool.from_url(settings.REDIS_URL, **CLIENT_OPTIONS)
    return redis.Redis(connection_pool=pool)


def aclient() -> aredis.Redis:
    """One asyncio client per event loop for short commands (health, stats); waits queue for a connection."""
    key = (id(asyncio.get_running_loop()), settings.REDIS_URL)
    cl = _async_clients.get(key)
    if cl is None:
        pool = aredis.BlockingConnectionPool.from_url(settings.REDIS_URL, max_connections=32,
                                                      timeout=SOCKET_TIMEOUT_SECS, **ASYNC_OPTIONS)
        cl = aredis.Redis(connection_pool=pool)
        _async_clients[key] = cl
    return cl


@dataclass
class Job:
    id: str  # our job id (also the reply key suffix)
    entry_id: str  # the stream entry id
    kind: str  # "hook" | "test_hook" | ...
    hook: str
    request: Any
    deadline: float  # unix time; 0 = none (fire-and-forget)
    wants_reply: bool
    plugin: str = ""
    enqueued_at: float = 0.0
    deliveries: int = 1
    reply_to: str = ""  # the web process's reply channel ("" = only the reply list)
    signed: bool = True  # False: the entry's signature did not verify; it must never run
    origin: str = ""  # who queued it when not an agent over REST ("mcp"): its traces say so
    bundles: dict[str, str] | None = None  # plugin -> bundle hash to run (plugins_app/services/bundles.py)
    engine_config: str = ""  # config.toml text that goes with `bundles`
    stream: str = ""  # the stream it was read from ("" = the shared one)

    @property
    def expired(self) -> bool:
        return bool(self.deadline) and time.time() > self.deadline

    @property
    def key(self) -> tuple[str, str]:
        """Entry ids are unique per stream only."""
        return self.stream or stream_key(), self.entry_id


# Set by a caller (the /mcp server) around its calls: the jobs it queues carry this origin.
JOB_ORIGIN: contextvars.ContextVar[str] = contextvars.ContextVar("job_origin", default="")


def _fields(kind: str, hook: str, request: Any, deadline_secs: float | None, wants_reply: bool,
            plugin: str = "", reply_to: str = "") -> tuple[str, dict[str, str]]:
    job_id = uuid.uuid4().hex
    now = time.time()
    fields = {
        "id": job_id,
        "kind": kind,
        "hook": hook,
        "plugin": plugin,
        "request": json.dumps(request),
        "deadline": repr(now + deadline_secs) if deadline_secs else "0",
        "reply": "1" if wants_reply else "0",
        "reply_to": reply_to,
        "enqueued_at": repr(now),
    }
    if JOB_ORIGIN.get():
        fields["origin"] = JOB_ORIGIN.get()
    if kind in PINNED_KINDS:
        _pin_versions(fields)
    fields["sig"] = sign(fields)
    return job_id, fields


# Jobs that run plugin code name the exact plugin versions, when the operator turned pinning on (multi-host).
PINNED_KINDS = ("hook", "test_hook")


def _pin_versions(fields: dict[str, str]) -> None:
    from plugins_app.services.bundles import PinsUnavailable, job_pins

    try:
        pins = job_pins()
    except PinsUnavailable as exc:  # callers treat it like Redis down: the agent gets the default engine
        raise BusUnavailable(str(exc)) from exc
    if pins is not None:
        fields["bundles"] = json.dumps(pins[0], sort_keys=True)
        fields["engine_config"] = pins[1]


def _parse(entry_id: str, fields: dict[str, str], deliveries: int = 1, stream: str = "") -> Job:
    signed = signature_ok(fields)
    if fields.get("moved"):  # moved off a dead host's stream: it may have run there already (dedup by JobRecord)
        deliveries = max(deliveries, 2)
    try:
        request = json.loads(fields.get("request") or "null")
        deadline = float(fields.get("deadline") or 0)
        enqueued_at = float(fields.get("enqueued_at") or 0)
        bundles = json.loads(fields["bundles"]) if "bundles" in fields else None
        if bundles is not None and not (isinstance(bundles, dict)
                                        and all(isinstance(v, str) for v in bundles.values())):
            raise ValueError("bundles must map plugin names to hashes")
    except ValueError:
        request, deadline, enqueued_at, signed, bundles = None, 0.0, 0.0, False, None
    reply_to = fields.get("reply_to", "")
    if reply_to and not reply_to.startswith(reply_channel_prefix()):
        reply_to, signed = "", False
    return Job(
        id=fields.get("id", entry_id), entry_id=entry_id, kind=fields.get("kind", "hook"),
        hook=fields.get("hook", ""), request=request, deadline=deadline, wants_reply=fields.get("reply") == "1",
        plugin=fields.get("plugin", ""), enqueued_at=enqueued_at, deliveries=deliveries, reply_to=reply_to,
        signed=signed, origin=fields.get("origin", "")[:20], bundles=bundles,
        engine_config=fields.get("engine_config", ""), stream=stream,
    )


# ---- web tier (async) ----

class _Hub:
    """Per event loop: the writer task that pipelines XADDs and the one subscriber that resolves waiting calls."""

    def __init__(self) -> None:
        self.url = settings.REDIS_URL
        self.channel = reply_channel_prefix() + f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        pool = aredis.BlockingConnectionPool.from_url(self.url, max_connections=16,
                                                      timeout=SOCKET_TIMEOUT_SECS, **ASYNC_OPTIONS)
        self.r = aredis.Redis(connection_pool=pool)
        self.outbox: asyncio.Queue[tuple[str, dict[str, str], asyncio.Future]] = asyncio.Queue(maxsize=OUTBOX_MAX)
        self.waiters: dict[str, asyncio.Future] = {}
        self.delivered: list[str] = []  # reply lists to delete (their reply already came by the channel)
        self.subscribed = False
        self.draining = ""
        self.last_error: str = ""
        self._tasks: list[asyncio.Task] = []
        self._hosts: tuple[float, list[str]] = (0.0, [])

    async def live_hosts(self) -> list[str]:
        """Host ids of the workers that heartbeat, re-read at most once a second (routing by agent affinity)."""
        at, hosts = self._hosts
        if time.monotonic() - at < HOSTS_TTL_SECS:
            return hosts
        keys = [k async for k in self.r.scan_iter(match=heartbeat_key("*"), count=100)]
        beats = await self.r.mget(keys) if keys else []
        hosts = sorted({json.loads(raw).get("affinity_host") or "" for raw in beats if raw} - {""})
        self._hosts = (time.monotonic(), hosts)
        return hosts

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

    def deliver(self, job_id: str, raw: str) -> None:
        fut = self.waiters.get(job_id)
        if fut is not None and not fut.done():
            fut.set_result(json.loads(raw))

    async def _sweep(self) -> None:
        """Replies pushed while we were not subscribed are in their lists."""
        ids = [job_id for job_id, fut in self.waiters.items() if not fut.done()]
        for start in range(0, len(ids), 200):
            chunk = ids[start:start + 200]
            pipe = self.r.pipeline(transaction=False)
            for job_id in chunk:
                pipe.lpop(reply_key(job_id))
            for job_id, raw in zip(chunk, await pipe.execute(), strict=True):
                if raw:
                    self.deliver(job_id, raw)

    async def _drop_delivered(self) -> None:
        keys, self.delivered = self.delivered, []
        if keys:
            await self.r.unlink(*keys)

    async def _listen_loop(self) -> None:
        backoff = 0.1
        while True:
            pubsub = self.r.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.subscribed, backoff = True, 0.1
                await self._sweep()
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        job_id, _, raw = msg["data"].partition("\n")
                        self.deliver(job_id, raw)
                        self.delivered.append(reply_key(job_id))
                    if len(self.delivered) >= 200 or (msg is None and self.delivered):
                        await self._drop_delivered()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.subscribed:
                    log.warning("reply listener lost Redis (%s); reconnecting", exc)
                self.subscribed = False
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
            finally:
                self.subscribed = False
                try:
                    await pubsub.aclose()
                except Exception:
                    pass

    async def wait(self, job_id: str, fut: asyncio.Future, timeout: float) -> dict | None:
        try:
            return await asyncio.wait_for(fut, max(0.01, timeout))
        except TimeoutError:
            try:  # last chance: a reply published while the listener was reconnecting
                raw = await self.r.lpop(reply_key(job_id))
            except Exception:
                raw = None
            return json.loads(raw) if raw else None


_hubs: dict[int, _Hub] = {}


def _hub() -> _Hub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(id(loop))
    if hub is None or getattr(hub, "_loop", None) is not loop or hub.url != settings.REDIS_URL:
        for key, old in list(_hubs.items()):  # hubs of loops that are gone (async_to_sync in commands, tests)
            if old._loop.is_closed():  # type: ignore[attr-defined]
                del _hubs[key]
        if hub is not None and hub._loop is loop:  # type: ignore[attr-defined]
            hub.close()  # REDIS_URL changed (tests): the old hub's tasks would talk to the old Redis
        hub = _Hub()
        hub._loop = loop  # type: ignore[attr-defined]
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


async def _route(hub: _Hub, kind: str, plugin: str, request: Any) -> str:
    """The stream a job goes to: its agent's host stream when a plugin it may run asks for agent affinity and a
    worker host is alive; the shared stream otherwise."""
    agent = request.get("agent_id") if isinstance(request, dict) else None
    if kind not in PINNED_KINDS or not agent:
        return stream_key()
    from plugins_app.services.affinity import wants_agent_affinity

    try:
        wanted = wants_agent_affinity(kind, plugin)
    except Exception:  # a configuration that does not load: the job still goes out, as without affinity
        log.warning("agent affinity unknown for %s %s; shared stream", kind, plugin or "(chain)", exc_info=True)
        wanted = False
    if not wanted:
        return stream_key()
    try:
        host = host_for(str(agent), await hub.live_hosts())
    except REDIS_DOWN:
        host = None  # the XADD that follows reports the outage
    return host_stream_key(host) if host else stream_key()


async def enqueue(hook: str, request: Any, *, kind: str = "hook", plugin: str = "",
                  store_within: float = 5.0) -> str:
    """Fire-and-forget: once this returns the job is in Redis and is processed at least once.
    Raises BusUnavailable / BusCapacity when it could not be stored."""
    hub = _hub()
    job_id, fields = _fields(kind, hook, request, None, False, plugin)
    await hub.xadd(fields, store_within, await _route(hub, kind, plugin, request))
    return job_id


async def submit_and_wait(hook: str, request: Any, wait_secs: float, *, kind: str = "hook",
                          plugin: str = "", deadline_secs: float | None = None) -> dict | None:
    """Enqueue a blocking job and wait for its reply; None when no reply came within `wait_secs`.
    Raises BusUnavailable / BusCapacity when the job could not be stored."""
    hub = _hub()
    hub.ensure_running()
    job_id, fields = _fields(kind, hook, request, deadline_secs or wait_secs, True, plugin, reply_to=hub.channel)
    started = time.monotonic()
    fut: asyncio.Future = asyncio.get_running_loop().create_future()
    hub.waiters[job_id] = fut
    try:
        await hub.xadd(fields, wait_secs, await _route(hub, kind, plugin, request))
        return await hub.wait(job_id, fut, wait_secs - (time.monotonic() - started))
    finally:
        hub.waiters.pop(job_id, None)


def submit_and_wait_sync(kind: str, hook: str, request: Any, wait_secs: float, *, plugin: str = "") -> dict | None:
    """The blocking form of submit_and_wait, for sync callers (routes that run in a thread, commands)."""
    job_id, fields = _fields(kind, hook, request, wait_secs, True, plugin)
    r = client()
    try:
        r.xadd(stream_key(), fields)
    except REDIS_DOWN as exc:
        raise BusUnavailable(f"Redis unreachable ({type(exc).__name__}: {exc})") from exc
    end = time.monotonic() + wait_secs
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return None
        got = r.blpop([reply_key(job_id)], timeout=max(0.01, min(left, 5.0)))
        if got:
            return json.loads(got[1])


def worker_alive() -> bool:
    r = client()
    return any(True for _ in r.scan_iter(match=heartbeat_key("*"), count=100))


async def live_workers() -> list[dict]:
    """Heartbeats of live workers, each with `heartbeat_age_secs` (how long since it last beat)."""
    r = aclient()
    out = []
    now = time.time()
    async for key in r.scan_iter(match=heartbeat_key("*"), count=100):
        raw = await r.get(key)
        if raw:
            info = json.loads(raw)
            if info.get("beat_at"):
                info["heartbeat_age_secs"] = round(max(0.0, now - float(info["beat_at"])), 2)
            out.append(info)
    return out


async def ping() -> bool:
    try:
        return bool(await aclient().ping())
    except (redis.RedisError, OSError):
        return False


async def queue_stats() -> dict:
    """Stream length, the group's pending (delivered, not yet acked) and lag (not yet delivered) counts, over the
    shared stream and the host streams (agent affinity)."""
    r = aclient()
    total = {"length": 0, "pending": 0, "lag": 0}
    names = [stream_key(), *(host_stream_key(h) for h in sorted(await r.smembers(host_streams_key())))]
    for name in names:
        try:
            length = await r.xlen(name)
            groups = await r.xinfo_groups(name)
        except redis.ResponseError:
            continue
        group = next((g for g in groups if g.get("name") == GROUP), None)
        lag = group.get("lag") if group is not None else None
        total["length"] += length
        total["pending"] += int(group.get("pending") or 0) if group is not None else 0
        total["lag"] += int(lag) if lag is not None else length
    return total


# ---- worker side (sync; runs in the worker process) ----

@dataclass
class _Deferred:
    """Outcomes a worker could not hand to Redis (it was down): sent when it is back."""
    replies: list[tuple[Job, dict]] = field(default_factory=list)
    acks: list[Job] = field(default_factory=list)


class JobStream:
    def __init__(self, consumer: str | None = None, r: redis.Redis | None = None, host: str = ""):
        self.r = r or client()
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.stream = stream_key()
        self.host = host  # this worker's host id: it also reads that host's stream (agent affinity)
        self.host_stream = host_stream_key(host) if host else ""
        self.holding: set[tuple[str, str]] = set()  # (stream, entry id) read or claimed by us and not acked yet
        self._lock = threading.Lock()
        self._deferred = _Deferred()

    @property
    def streams(self) -> list[str]:
        return [self.stream, self.host_stream] if self.host_stream else [self.stream]

    def ensure_group(self) -> None:
        for name in self.streams:
            try:
                self.r.xgroup_create(name, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        if self.host:
            self.r.sadd(host_streams_key(), self.host)

    def _hold(self, jobs: list[Job]) -> list[Job]:
        with self._lock:
            self.holding.update(j.key for j in jobs)
        return jobs

    def release(self, job: Job) -> None:
        """The job is no longer ours to finish (it crashed): it may be taken up again."""
        with self._lock:
            self.holding.discard(job.key)

    def read(self, count: int, block_ms: int) -> list[Job]:
        """Up to `count` new jobs from each stream we read (the shared one and our host's)."""
        try:
            resp = self.r.xreadgroup(GROUP, self.consumer, {name: ">" for name in self.streams}, count=count,
                                     block=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):  # Redis came back empty: the group is gone
                self.ensure_group()
                return []
            raise
        jobs = []
        for name, entries in resp or []:
            for entry_id, fields in entries:
                if fields:
                    jobs.append(_parse(entry_id, fields, stream=name))
        return self._hold(jobs)

    def reclaim(self) -> list[Job]:
        """Claim jobs pending on workers that stopped heartbeating, our own orphans, and jobs stuck far too long."""
        claimed: list[Job] = []
        for name in self.streams:
            claimed += self._reclaim_stream(name)
        return self._hold(claimed)

    def _reclaim_stream(self, name: str) -> list[Job]:
        claimed: list[Job] = []
        try:
            summary = self.r.xpending(name, GROUP)
        except redis.ResponseError:
            return claimed
        for info in summary.get("consumers") or []:
            consumer = info["name"]
            if consumer == self.consumer:
                claimed += self._claim_orphans(name)
                continue
            if self.r.exists(heartbeat_key(consumer)):
                continue
            while True:
                pending = self.r.xpending_range(name, GROUP, min="-", max="+", count=100, consumername=consumer)
                if not pending:
                    break
                claimed += self._claim(name, pending, 0)
            self.r.xgroup_delconsumer(name, GROUP, consumer)
        _next, entries, *_ = self.r.xautoclaim(name, GROUP, self.consumer, STUCK_JOB_MS, "0-0", count=100)
        with self._lock:
            entries = [(e, f) for e, f in entries if (name, e) not in self.holding]
        return claimed + [_parse(e, f, 2, stream=name) for e, f in entries if f]

    def _claim_orphans(self, name: str) -> list[Job]:
        pending = self.r.xpending_range(name, GROUP, min="-", max="+", count=100,
                                        consumername=self.consumer, idle=OWN_ORPHAN_MS)
        with self._lock:
            pending = [p for p in pending if (name, p["message_id"]) not in self.holding]
        return self._claim(name, pending, OWN_ORPHAN_MS) if pending else []

    def _claim(self, name: str, pending: list[dict], min_idle_ms: int) -> list[Job]:
        ids = [p["message_id"] for p in pending]
        counts = {p["message_id"]: p["times_delivered"] for p in pending}
        out = []
        for entry_id, fields in self.r.xclaim(name, GROUP, self.consumer, min_idle_ms, ids):
            if fields:
                out.append(_parse(entry_id, fields, counts.get(entry_id, 1) + 1, stream=name))
            else:  # the entry was deleted but not acked
                self.r.xack(name, GROUP, entry_id)
        return out

    # -- agent affinity: hosts that died --

    def live_hosts(self) -> list[str]:
        keys = list(self.r.scan_iter(match=heartbeat_key("*"), count=100))
        beats = self.r.mget(keys) if keys else []
        return sorted({json.loads(raw).get("affinity_host") or "" for raw in beats if raw} - {""})

    def rehome_dead_hosts(self) -> int:
        """Move every job still in the stream of a host that stopped heartbeating (never read, or read by a worker
        that died) to the stream of its agent's host among the live ones. One worker does a host at a time (a lock
        in Redis). The moved copy is marked, so a job that did finish on the dead host is recognised as a
        duplicate by its JobRecord. Returns how many jobs moved."""
        known = self.r.smembers(host_streams_key())
        if not known:
            return 0
        live = self.live_hosts()
        moved = 0
        for host in sorted(set(known) - set(live)):
            lock = _key("engine", "rehome", host)
            if not self.r.set(lock, self.consumer, nx=True, px=REHOME_LOCK_MS):
                continue
            try:
                moved += self._rehome(host_stream_key(host), live)
            finally:
                self.r.delete(lock)
        return moved

    def _rehome(self, source: str, live: list[str]) -> int:
        moved = 0
        while True:
            entries = [(e, f) for e, f in self.r.xrange(source, "-", "+", count=100)]
            if not entries:
                return moved
            pipe = self.r.pipeline(transaction=False)
            for _entry_id, fields in entries:
                target, copy = self.stream, dict(fields)
                if signature_ok(fields):  # never sign what we could not verify: it goes on as it came, to be refused
                    try:
                        request = json.loads(fields.get("request") or "null")
                    except ValueError:
                        request = None
                    agent = request.get("agent_id") if isinstance(request, dict) else None
                    host = host_for(str(agent), live) if agent else None
                    target = host_stream_key(host) if host else self.stream
                    copy["moved"] = "1"
                    copy["sig"] = sign(copy)
                pipe.xadd(target, copy)
            pipe.execute()
            ids = [e for e, _ in entries]
            pipe = self.r.pipeline(transaction=False)
            pipe.xack(source, GROUP, *ids)
            pipe.xdel(source, *ids)
            pipe.execute()
            moved += len(ids)

    # -- outcomes --

    def reply(self, job: Job, payload: dict) -> None:
        """Hand the reply to the waiting web process; kept for later if Redis is unreachable."""
        try:
            self._send_reply(job, json.dumps(payload))
        except REDIS_DOWN:
            log.warning("Redis unreachable: reply to job %s deferred", job.id)
            with self._lock:
                self._deferred.replies.append((job, payload))

    def _send_reply(self, job: Job, data: str) -> None:
        key = reply_key(job.id)
        pipe = self.r.pipeline()  # MULTI: the list and the message appear together
        pipe.rpush(key, data)
        pipe.expire(key, REPLY_TTL_SECS)
        if job.reply_to:
            pipe.publish(job.reply_to, f"{job.id}\n{data}")
        pipe.execute()

    def ack(self, job: Job) -> bool:
        """XACK + XDEL. If Redis is unreachable the ack is kept and retried (the outcome is already stored, so a
        redelivery meanwhile is recognised as a duplicate)."""
        try:
            self._send_ack(job)
        except REDIS_DOWN:
            log.warning("Redis unreachable: ack of job %s deferred", job.id)
            with self._lock:
                self._deferred.acks.append(job)
            return False
        with self._lock:
            self.holding.discard(job.key)
        return True

    def ack_many(self, jobs: list[Job]) -> None:
        """ack() for many jobs in one round trip; kept and retried like ack() if Redis is unreachable."""
        try:
            pipe = self.r.pipeline(transaction=False)
            for job in jobs:
                pipe.xack(job.key[0], GROUP, job.entry_id)
                pipe.xdel(job.key[0], job.entry_id)
            results = pipe.execute(raise_on_error=False)
        except REDIS_DOWN:
            log.warning("Redis unreachable: acks of %d job(s) deferred", len(jobs))
            with self._lock:
                self._deferred.acks.extend(jobs)
            return
        for result in results:  # NOGROUP (Redis came back empty): nothing left to ack
            if isinstance(result, redis.ResponseError) and "NOGROUP" not in str(result):
                raise result
        with self._lock:
            self.holding.difference_update(j.key for j in jobs)

    def _send_ack(self, job: Job) -> None:
        name = job.key[0]
        try:
            pipe = self.r.pipeline()
            pipe.xack(name, GROUP, job.entry_id)
            pipe.xdel(name, job.entry_id)
            pipe.execute()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):  # Redis came back empty: nothing left to ack
                raise

    def deferred_count(self) -> int:
        with self._lock:
            return len(self._deferred.replies) + len(self._deferred.acks)

    def flush_deferred(self) -> None:
        """Send replies and acks kept during an outage; raises (keeping the rest) while Redis is still down."""
        with self._lock:
            if not self._deferred.replies and not self._deferred.acks:
                return
            pending, self._deferred = self._deferred, _Deferred()
        try:
            while pending.replies:
                job, payload = pending.replies[0]
                if not job.deadline or time.time() < job.deadline + REPLY_TTL_SECS:
                    self._send_reply(job, json.dumps(payload))
                pending.replies.pop(0)
            while pending.acks:
                self._send_ack(pending.acks[0])
                with self._lock:
                    self.holding.discard(pending.acks[0].key)
                pending.acks.pop(0)
        finally:
            with self._lock:
                self._deferred.replies[:0] = pending.replies
                self._deferred.acks[:0] = pending.acks

    def heartbeat(self, info: dict) -> None:
        self.r.set(heartbeat_key(self.consumer),
                   json.dumps({"worker": self.consumer, "beat_at": time.time(), "affinity_host": self.host, **info}),
                   ex=HEARTBEAT_TTL_SECS)

    def retire(self) -> None:
        self.r.delete(heartbeat_key(self.consumer))

    # -- control: prewarm requests to every worker --

    def control_cursor(self) -> str:
        """Where this worker starts reading the control stream: requests made from now on."""
        try:
            last = self.r.xrevrange(control_key(), "+", "-", count=1)
        except redis.ResponseError:
            last = []
        return last[0][0] if last else "0-0"

    def read_control(self, cursor: str, block_ms: int) -> tuple[str, list[dict[str, str]]]:
        """Control entries after `cursor` whose signature verifies; (new cursor, entries)."""
        resp = self.r.xread({control_key(): cursor}, count=10, block=block_ms)
        out = []
        for _name, entries in resp or []:
            for entry_id, fields in entries:
                cursor = entry_id
                if signature_ok(fields):
                    out.append(fields)
                else:
                    log.error("control entry %s ignored: signature missing or invalid", entry_id)
        return cursor, out

    def answer_prewarm(self, stamp: str, answer: dict) -> None:
        key = prewarm_answers_key(stamp)
        pipe = self.r.pipeline()
        pipe.rpush(key, json.dumps({"worker": self.consumer, **answer}))
        pipe.expire(key, REPLY_TTL_SECS)
        pipe.execute()


# ---- prewarm (web tier) ----

async def prewarm(plugins: list[str], wait_secs: float, pins: tuple[dict[str, str], str] | None = None) -> dict:
    """Ask every live worker to warm `plugins` (and fetch their pinned bundles); wait up to `wait_secs` for each
    worker that heartbeats now to answer. Returns {"stamp", "answers": [...], "missing": [worker, ...]}."""
    r = aclient()
    stamp = uuid.uuid4().hex
    fields = {"kind": "prewarm", "stamp": stamp, "plugins": json.dumps(plugins), "at": repr(time.time())}
    if pins is not None:
        fields["bundles"] = json.dumps(pins[0], sort_keys=True)
        fields["engine_config"] = pins[1]
    fields["sig"] = sign(fields)
    try:
        expected = {w["worker"]: w for w in await live_workers() if w.get("worker")}
        await r.xadd(control_key(), fields, maxlen=CONTROL_MAXLEN, approximate=True)
    except REDIS_DOWN as exc:
        raise BusUnavailable(f"Redis unreachable ({type(exc).__name__}: {exc})") from exc
    answers: dict[str, dict] = {}
    end = time.monotonic() + wait_secs
    while set(expected) - set(answers):
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            got = await r.blpop([prewarm_answers_key(stamp)], timeout=max(0.01, min(left, 1.0)))
        except REDIS_DOWN:
            break
        if got:
            answer = json.loads(got[1])
            answers[answer.get("worker", "")] = answer
    missing = [{"worker": w, "host": info.get("host", ""), "pid": info.get("pid")}
               for w, info in sorted(expected.items()) if w not in answers]
    return {"stamp": stamp, "answers": [answers[w] for w in sorted(answers)], "missing": missing}
