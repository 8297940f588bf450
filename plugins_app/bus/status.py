"""What health, the dashboard and the CLI read about the bus: is Redis up, which workers heartbeat, how deep the
queue is."""

from __future__ import annotations

import json
import time

import redis

from plugins_app.bus.clients import aclient, client
from plugins_app.bus.keys import GROUP, heartbeat_key, host_stream_key, host_streams_key, stream_key


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

