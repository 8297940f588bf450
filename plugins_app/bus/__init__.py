"""The job bus: the only package that talks to the Redis job stream between web tier and workers.

Jobs are signed stream entries in one consumer group, so any number of workers on any number of machines share
them; a worker XACKs a job only after its outcome is stored. Read it in this order:

- keys.py      the Redis key names (all under LIBREFANG_REDIS_PREFIX)
- clients.py   the sync and asyncio clients, REDIS_DOWN and the exceptions callers catch, one resilient
               subscription loop (the reply listener's, and the live feeds' in plugins_app/events.py)
- signing.py   the shared key and the HMAC every job, control entry and reply carries
- job.py       the fields of one job (job_fields), the Job a worker reads back (parse_job), the Reply it answers
               with (status + JSON body, passed on to an agent as it is)
- replay.py    at most once per job id: the claim a worker takes on each job it reads, replays refused
- hub.py       web side: enqueue, submit_and_wait, submit_and_wait_sync (`agent=`: the caller routes by agent),
               through one hub per event loop (the writer task that pipelines XADDs, the one reply listener, drain)
- status.py    ping, live workers, queue depth (health, dashboard, CLI)
- affinity.py  agent affinity (docs/scale-out.md): host ids, rendezvous choice, moving a dead host's jobs; which
               jobs ask for it is the caller's decision (plugins_app/services/affinity.py)
- stream.py    worker side: JobStream (read, reclaim, reply, ack, deferred outcomes, heartbeat)
- control.py   the control stream: prewarm requests to every worker and their answers

Callers import from `plugins_app.bus` only (the names below); nothing outside this package uses the stream's Redis
keys (tests/app/test_bus_boundary.py checks it).
"""

from plugins_app.bus.affinity import host_for, worker_host_id
from plugins_app.bus.clients import (
    REDIS_DOWN,
    BusCapacity,
    BusDraining,
    BusUnavailable,
    aclient,
    client,
    subscribe_forever,
)
from plugins_app.bus.control import prewarm
from plugins_app.bus.hub import drain, enqueue, replies_reachable, submit_and_wait, submit_and_wait_sync
from plugins_app.bus.job import FAILED, JOB_ORIGIN, PINNED_KINDS, Job, Reply, job_fields, parse_job, to_json
from plugins_app.bus.keys import GROUP, heartbeat_key, host_stream_key, prefixed_key, reply_key, stream_key
from plugins_app.bus.replay import SEEN_WINDOW_SECS
from plugins_app.bus.signing import bus_key, bus_key_path, open_reply, seal_reply, sign, signature_ok
from plugins_app.bus.status import live_workers, ping, queue_stats, worker_alive
from plugins_app.bus.stream import JobStream

__all__ = [
    "FAILED", "GROUP", "JOB_ORIGIN", "PINNED_KINDS", "REDIS_DOWN", "SEEN_WINDOW_SECS", "BusCapacity", "BusDraining",
    "BusUnavailable", "Job", "JobStream", "Reply", "aclient", "bus_key", "bus_key_path", "client", "drain", "enqueue",
    "heartbeat_key", "host_for", "host_stream_key", "job_fields", "live_workers", "open_reply", "parse_job", "ping",
    "prefixed_key", "prewarm", "queue_stats", "replies_reachable", "reply_key", "seal_reply", "sign", "signature_ok",
    "stream_key", "submit_and_wait", "submit_and_wait_sync", "subscribe_forever", "to_json", "worker_alive",
    "worker_host_id",
]
