"""The worker side of the job stream: read, reclaim, reply, ack, heartbeat.

Jobs go into one stream with one consumer group, so any number of workers on any number of machines share them.
A worker XACKs a job only after its outcome is stored; jobs pending on a worker whose heartbeat has stopped are
claimed by a live worker. Replies and acks a worker could not send (Redis down) are kept and sent when it is back.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import redis

from plugins_app.bus import affinity, control
from plugins_app.bus.clients import REDIS_DOWN, client
from plugins_app.bus.job import Job, Reply, parse_job
from plugins_app.bus.keys import (
    GROUP,
    REPLY_TTL_SECS,
    heartbeat_key,
    host_stream_key,
    host_streams_key,
    reply_key,
    stream_key,
)
from plugins_app.bus.replay import mark_replays
from plugins_app.bus.signing import seal_reply

log = logging.getLogger("librefang.bus")

HEARTBEAT_TTL_SECS = 6
# A pending job idle this long is claimed even if its worker still heartbeats (it is stuck on it).
STUCK_JOB_MS = 15 * 60 * 1000
# A job pending on THIS worker but not being worked on (its XREADGROUP answer was lost in a Redis outage, or it
# crashed mid-run) is taken up again once idle this long.
OWN_ORPHAN_MS = 5000


# The reply in one command: RPUSH + EXPIRE of the reply list, and PUBLISH of "<job id>\n<reply>" on the waiting web
# process's channel (a script runs atomically, as the MULTI it replaces did: the list and the message appear
# together). One command to pack and one answer to parse on the job's thread instead of five.
_REPLY_SCRIPT = r"""
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\n' .. ARGV[1]) end
return 1
"""


@dataclass
class _Deferred:
    """Outcomes a worker could not hand to Redis (it was down): sent when it is back."""
    replies: list[tuple[Job, Reply]] = field(default_factory=list)
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
        self._reply_script = self.r.register_script(_REPLY_SCRIPT)  # run on self.r, whatever it is then

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
                    jobs.append(parse_job(entry_id, fields, stream=name))
        return self._hold(mark_replays(self.r, jobs))

    def reclaim(self) -> list[Job]:
        """Claim jobs pending on workers that stopped heartbeating, our own orphans, and jobs stuck far too long."""
        claimed: list[Job] = []
        for name in self.streams:
            claimed += self._reclaim_stream(name)
        return self._hold(mark_replays(self.r, claimed))

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
        return claimed + [parse_job(e, f, 2, stream=name) for e, f in entries if f]

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
                out.append(parse_job(entry_id, fields, counts.get(entry_id, 1) + 1, stream=name))
            else:  # the entry was deleted but not acked
                self.r.xack(name, GROUP, entry_id)
        return out

    # -- agent affinity: hosts that died --

    def rehome_dead_hosts(self) -> int:
        """Move the jobs of hosts that stopped heartbeating to their agents' live hosts (affinity.rehome_dead_hosts);
        returns how many moved."""
        return affinity.rehome_dead_hosts(self.r, self.consumer)

    # -- outcomes --

    def reply(self, job: Job, reply: Reply) -> None:
        """Hand the reply to the waiting web process; kept for later if Redis is unreachable."""
        try:
            self._send_reply(job, reply)
        except REDIS_DOWN:
            log.warning("Redis unreachable: reply to job %s deferred", job.id)
            with self._lock:
                self._deferred.replies.append((job, reply))

    def _send_reply(self, job: Job, reply: Reply) -> None:
        self._reply_script(keys=[reply_key(job.id)], args=[seal_reply(job.id, reply.wire()), REPLY_TTL_SECS,
                                                          job.reply_to or "", job.id], client=self.r)

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
                job, reply = pending.replies[0]
                if not job.deadline or time.time() < job.deadline + REPLY_TTL_SECS:
                    self._send_reply(job, reply)
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

    # -- control: prewarm requests to every worker (plugins_app/bus/control.py) --

    def control_cursor(self) -> str:
        """Where this worker starts reading the control stream: requests made from now on."""
        return control.cursor_now(self.r)

    def read_control(self, cursor: str, block_ms: int) -> tuple[str, list[dict[str, str]]]:
        """Control entries after `cursor` whose signature verifies; (new cursor, entries)."""
        return control.read_after(self.r, cursor, block_ms)

    def answer_prewarm(self, stamp: str, answer: dict) -> None:
        control.answer_prewarm(self.r, self.consumer, stamp, answer)
