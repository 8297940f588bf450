"""Agent affinity (docs/scale-out.md), the Redis side: a job its caller routes by agent id (`agent=` of enqueue and
submit_and_wait; plugins_app/services/affinity.py decides from the plugins' `affinity = "agent"`) goes to the stream
of one worker host, chosen by rendezvous hashing of the agent id over the hosts that heartbeat; the workers of that
host read it besides the shared stream, and a live worker moves the jobs of a host that stopped heartbeating to the
agent's new host. Nothing here knows about plugins."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time

import redis
import redis.asyncio as aredis

from plugins_app.bus.clients import REDIS_DOWN
from plugins_app.bus.keys import (
    GROUP,
    heartbeat_key,
    host_stream_key,
    host_streams_key,
    rehome_lock_key,
    stream_key,
)
from plugins_app.bus.replay import seen_key
from plugins_app.bus.signing import sign, signature_ok

HOSTS_TTL_SECS = 1.0
# Long enough for one worker to move a dead host's jobs; released as soon as it is done.
REHOME_LOCK_MS = 30_000


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


def _hosts_of(beats: list[str | None]) -> list[str]:
    return sorted({json.loads(raw).get("affinity_host") or "" for raw in beats if raw} - {""})


def live_hosts(r: redis.Redis) -> list[str]:
    """Host ids of the workers that heartbeat now."""
    keys = list(r.scan_iter(match=heartbeat_key("*"), count=100))
    return _hosts_of(r.mget(keys) if keys else [])


class LiveHosts:
    """live_hosts for the web tier, re-read at most once a second (one per event loop, kept by its hub)."""

    def __init__(self) -> None:
        self._at = 0.0
        self._hosts: list[str] = []

    async def get(self, r: aredis.Redis) -> list[str]:
        if time.monotonic() - self._at < HOSTS_TTL_SECS:
            return self._hosts
        keys = [k async for k in r.scan_iter(match=heartbeat_key("*"), count=100)]
        self._hosts = _hosts_of(await r.mget(keys) if keys else [])
        self._at = time.monotonic()
        return self._hosts


async def route(agent: str | None, hosts: LiveHosts, r: aredis.Redis) -> str:
    """The stream a job goes to: the stream of `agent`'s host when the caller routes it by agent (the caller
    decides: plugins_app/services/affinity.py) and a worker host is alive; the shared stream otherwise."""
    if not agent:
        return stream_key()
    try:
        return _stream_of(host_for(agent, await hosts.get(r)))
    except REDIS_DOWN:  # the XADD that follows reports the outage
        return stream_key()


def route_sync(agent: str | None, r: redis.Redis) -> str:
    """route() for sync callers (no cache: they queue a job now and then)."""
    if not agent:
        return stream_key()
    try:
        return _stream_of(host_for(agent, live_hosts(r)))
    except REDIS_DOWN:  # the XADD that follows reports the outage
        return stream_key()


def _stream_of(host: str | None) -> str:
    return host_stream_key(host) if host else stream_key()


# ---- hosts that died (run by the workers) ----

def rehome_dead_hosts(r: redis.Redis, consumer: str) -> int:
    """Move every job still in the stream of a host that stopped heartbeating (never read, or read by a worker
    that died) to the stream of its agent's host among the live ones. One worker does a host at a time (a lock
    in Redis). The moved copy is marked, so a job that did finish on the dead host is recognised as a
    duplicate by its JobRecord. Returns how many jobs moved."""
    known = r.smembers(host_streams_key())
    if not known:
        return 0
    live = live_hosts(r)
    moved = 0
    for host in sorted(set(known) - set(live)):
        lock = rehome_lock_key(host)
        if not r.set(lock, consumer, nx=True, px=REHOME_LOCK_MS):
            continue
        try:
            moved += _rehome(r, host_stream_key(host), live)
        finally:
            r.delete(lock)
    return moved


# XADD of a moved copy, and its job id's claim (plugins_app/bus/replay.py) handed to the copy in the same step: the
# copy is the job, not a replay of it.
_MOVE_SCRIPT = r"""
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV))
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('SET', KEYS[2], KEYS[1] .. '|' .. id, 'KEEPTTL') end
return id
"""


def _rehome(r: redis.Redis, source: str, live: list[str]) -> int:
    moved = 0
    move = r.register_script(_MOVE_SCRIPT)
    while True:
        entries = [(e, f) for e, f in r.xrange(source, "-", "+", count=100)]
        if not entries:
            return moved
        pipe = r.pipeline(transaction=False)
        for _entry_id, fields in entries:
            target, copy = stream_key(), dict(fields)
            if signature_ok(fields):  # never sign what we could not verify: it goes on as it came, to be refused
                try:
                    request = json.loads(fields.get("request") or "null")
                except ValueError:
                    request = None
                agent = request.get("agent_id") if isinstance(request, dict) else None
                target = _stream_of(host_for(str(agent), live) if agent else None)
                copy["moved"] = "1"
                copy["sig"] = sign(copy)
                move(keys=[target, seen_key(copy.get("id", ""))], args=[x for kv in copy.items() for x in kv],
                     client=pipe)
                continue
            pipe.xadd(target, copy)
        pipe.execute()
        ids = [e for e, _ in entries]
        pipe = r.pipeline(transaction=False)
        pipe.xack(source, GROUP, *ids)
        pipe.xdel(source, *ids)
        pipe.execute()
        moved += len(ids)
