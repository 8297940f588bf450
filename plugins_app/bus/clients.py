"""Redis clients of the bus, and what its callers catch when Redis is not there."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio as aredis
from django.conf import settings

log = logging.getLogger("librefang.bus")

# Enqueue path: find out fast that Redis is gone, so the agent gets its fallback (or 503) within the deadline.
CONNECT_TIMEOUT_SECS = 1.0
SOCKET_TIMEOUT_SECS = 3.0
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, OSError)


class BusUnavailable(Exception):
    """Redis could not be reached: nothing was stored."""


class BusCapacity(Exception):
    """Our own queue to Redis is full or too slow: nothing was stored."""


class BusDraining(BusUnavailable):
    """This web process is stopping: waiting calls are answered now instead of being cut off."""


# The sync client serves the worker (XREADGROUP blocks 1 s at most) and short commands; blocking waits in sync
# callers are cut into slices below the socket timeout.
CLIENT_OPTIONS = {"decode_responses": True, "socket_timeout": 10, "socket_connect_timeout": 2,
                  "socket_keepalive": True, "health_check_interval": 30}
ASYNC_OPTIONS = {"decode_responses": True, "socket_timeout": SOCKET_TIMEOUT_SECS,
                 "socket_connect_timeout": CONNECT_TIMEOUT_SECS, "socket_keepalive": True,
                 "health_check_interval": 30}
_sync_pools: dict[str, redis.ConnectionPool] = {}
_async_clients: dict[tuple[int, str], tuple[asyncio.AbstractEventLoop, aredis.Redis]] = {}


def client() -> redis.Redis:
    pool = _sync_pools.get(settings.REDIS_URL)
    if pool is None:
        pool = _sync_pools[settings.REDIS_URL] = redis.ConnectionPool.from_url(settings.REDIS_URL, **CLIENT_OPTIONS)
    return redis.Redis(connection_pool=pool)


def aclient() -> aredis.Redis:
    """One asyncio client per event loop for short commands (health, stats); waits queue for a connection."""
    loop = asyncio.get_running_loop()
    key = (id(loop), settings.REDIS_URL)
    cached = _async_clients.get(key)
    if cached is None or cached[0] is not loop:  # a new loop may reuse a closed one's id (tests, async_to_sync)
        pool = aredis.BlockingConnectionPool.from_url(settings.REDIS_URL, max_connections=32,
                                                      timeout=SOCKET_TIMEOUT_SECS, **ASYNC_OPTIONS)
        cached = _async_clients[key] = (loop, aredis.Redis(connection_pool=pool))
    return cached[1]


async def subscribe_forever(r: aredis.Redis, channel: str, *, on_message: Callable[[str], None],
                            on_subscribed: Callable[[], Awaitable[None]], on_lost: Callable[[], None],
                            on_idle: Callable[[bool], Awaitable[None]] | None = None, what: str = "listener") -> None:
    """Hold one subscription to `channel` on `r` and hand each message's data to `on_message`, until cancelled.

    Redis lost: `on_lost()`, then resubscribe with a capped backoff (0.1 s doubling to 2 s); `on_subscribed()` runs
    after every (re)subscription, before any message, so a caller can catch up on what was published meanwhile.
    `on_idle(quiet)` runs after each wait (quiet: a second passed with no message)."""
    backoff, up = 0.1, False
    task = asyncio.current_task()
    while True:
        pubsub = r.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            up, backoff = True, 0.1
            await on_subscribed()
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if task is not None and task.cancelling():
                    # redis-py's get_message can return although this task was cancelled (a websocket that joins
                    # and leaves a live feed at once: tests/app/test_consumers_dashboard.py); without this check the
                    # loop would never end
                    raise asyncio.CancelledError
                if msg is not None and msg.get("type") == "message":
                    on_message(msg["data"])
                if on_idle is not None:
                    await on_idle(msg is None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if task is not None and task.cancelling():  # a cancellation redis-py turned into an error: still ours
                raise asyncio.CancelledError from exc
            if up:
                log.warning("%s lost Redis (%s); reconnecting", what, exc)
            up = False
        finally:
            on_lost()
            try:
                await pubsub.aclose()
            except Exception:
                pass
        await asyncio.sleep(backoff)  # only after an error: the loop above never ends otherwise
        backoff = min(2.0, backoff * 2)
