"""Names of everything the bus keeps in Redis, all under settings.LIBREFANG_REDIS_PREFIX (tests use their own)."""

from __future__ import annotations

from django.conf import settings

# The one consumer group of every job stream (the shared one and each host's).
GROUP = "engine"
# How long a reply list (and a prewarm answer list) outlives its last push.
REPLY_TTL_SECS = 60


def prefixed_key(*parts: str) -> str:
    return ":".join((settings.LIBREFANG_REDIS_PREFIX, *parts))


def stream_key() -> str:
    return prefixed_key("engine", "jobs")


def reply_key(job_id: str) -> str:
    return prefixed_key("engine", "reply", job_id)


def reply_channel_prefix() -> str:
    return prefixed_key("engine", "replies") + ":"


def heartbeat_key(worker: str) -> str:
    return prefixed_key("engine", "worker", worker)


def host_stream_key(host: str) -> str:
    """The stream of jobs routed to one worker host (agent affinity)."""
    return prefixed_key("engine", "jobs", "host", host)


def host_streams_key() -> str:
    """The set of host ids that ever read a host stream: where a live worker looks for dead hosts' jobs."""
    return prefixed_key("engine", "hosts")


def control_key() -> str:
    return prefixed_key("engine", "control")


def prewarm_answers_key(stamp: str) -> str:
    return prefixed_key("engine", "prewarm", stamp)


def rehome_lock_key(host: str) -> str:
    """Held by the one worker moving the jobs of a host that stopped heartbeating."""
    return prefixed_key("engine", "rehome", host)
