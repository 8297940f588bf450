"""Live events: the only module that talks to the Channels layer.

stderr lines get a global sequence number and are kept in a capped tail in Redis, so a browser that (re)connects
first renders the recent past, then live lines, without losing or repeating any. Publishing runs on one background
thread per process that batches lines, so a chatty hook never waits on Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from plugins_app import bus
from plugins_app.batching import BatchWriter

log = logging.getLogger("librefang.events")
TAIL_LEN = 500  # lines kept per plugin (and for "all") for reconnecting browsers
ALL = "_all"
BATCH_MAX = 200
QUEUE_MAX = 50_000  # beyond this, lines are dropped and counted (never silently)
# A hook's line is most often followed by its answer within a millisecond or two: publishing at once (a tail
# write and two channel-layer sends) took the worker's GIL and a core just as the answer was being handed back.
# Waiting this long first moves that work past the answer (warm REST call p50 -0.47 ms, bench/README.md) and
# batches a flood of lines; a browser sees a line this much later.
LINGER_SECS = 0.005
_GROUP_OK = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")


def _name_part(plugin: str) -> str:
    # Channels group names: ASCII alphanumerics, '-', '_', '.', under 100 chars.
    return plugin if _GROUP_OK.match(plugin) else "h" + hashlib.sha1(plugin.encode()).hexdigest()[:20]


def stderr_group(plugin: str | None) -> str:
    return f"stderr.{_name_part(plugin) if plugin else ALL}"


METRICS_GROUP = "metrics"
PLUGINS_GROUP = "plugins"


def _tail_key(plugin: str) -> str:
    return bus.prefixed_key("stderr", "tail", _name_part(plugin))


def _seq_key() -> str:
    return bus.prefixed_key("stderr", "seq")


def _dropped_key() -> str:
    return bus.prefixed_key("stderr", "dropped")


def tail(plugin: str | None, after_seq: int = 0, limit: int = TAIL_LEN) -> list[dict]:
    """Recent lines (oldest first) with seq > after_seq."""
    raw = bus.client().lrange(_tail_key(plugin or ALL), -limit, -1)
    lines = [json.loads(x) for x in raw]
    return [x for x in lines if x["seq"] > after_seq]


def dropped_count() -> int:
    return int(bus.client().get(_dropped_key()) or 0)


class StderrPublisher(BatchWriter[dict]):
    """Implements engine.ports.StderrSink: queue the line and return at once."""

    thread_name = "stderr-publisher"
    batch_max = BATCH_MAX
    linger_secs = LINGER_SECS
    queue_max = QUEUE_MAX

    def line(self, plugin: str, hook: str, line: str, trace_id: str) -> None:
        self.put({"plugin": plugin, "hook": hook, "line": line[:8192], "ts": time.time(), "trace_id": trace_id})

    def start(self) -> None:
        # the writer thread drives its own event loop, only to publish a batch
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._layer = get_channel_layer()
        self._redis = bus.client()

    def write(self, batch: list[dict]) -> None:
        """Redis down: keep the batch and retry with a capped backoff (0.1 s doubling to 2 s) while new lines
        queue up (beyond QUEUE_MAX they are counted as dropped); another error drops the batch, counted."""
        delay = 0.0
        while True:
            try:
                self._loop.run_until_complete(self._publish(self._layer, self._redis, batch))
                if delay:
                    log.warning("stderr publisher: Redis is back")
                return
            except bus.REDIS_DOWN as exc:
                if not delay:
                    log.warning("stderr publisher: Redis unreachable (%s); holding %d line(s)", exc, len(batch))
                delay = min(2.0, delay * 2 or 0.1)
                time.sleep(delay)
            except Exception:
                log.exception("publishing %d stderr lines failed", len(batch))
                self.count_dropped(len(batch))
                return

    async def _publish(self, layer: Any, r: Any, batch: list[dict]) -> None:
        dropped = self.take_dropped()
        try:
            self._store_tail(r, batch, dropped)
        except BaseException:
            self.count_dropped(dropped)
            raise
        by_plugin: dict[str, list[dict]] = {}
        for item in batch:
            by_plugin.setdefault(item["plugin"], []).append(item)
        try:  # the lines are in the tail already: a browser that missed them live re-reads them there
            for plugin, lines in by_plugin.items():
                await layer.group_send(stderr_group(plugin), {"type": "stderr.lines", "lines": lines})
            await layer.group_send(stderr_group(None), {"type": "stderr.lines", "lines": batch})
        except Exception as exc:
            log.warning("live stderr not pushed to browsers (%s); kept in the tail", exc)

    def _store_tail(self, r: Any, batch: list[dict], dropped: int) -> None:
        """Number the batch's lines (the `seq` browsers order by and count gaps with) and append them to their
        plugin's tail and the "all" tail, in one script: numbering and appending are one step for every worker."""
        keys = [_seq_key(), _dropped_key(), _tail_key(ALL), *(_tail_key(item["plugin"]) for item in batch)]
        first = int(r.register_script(_TAIL_SCRIPT)(keys, [TAIL_LEN, dropped, *(json.dumps(i) for i in batch)]))
        for i, item in enumerate(batch):
            item["seq"] = first + i


# KEYS: seq counter, dropped counter, the "all" tail, then each line's own tail; ARGV: tail length, lines dropped
# since the last batch, then each line as a JSON object, into which its number goes as "seq".
_TAIL_SCRIPT = """
local n = #ARGV - 2
local first = redis.call('INCRBY', KEYS[1], n) - n + 1
local tails = {}
for i = 1, n do
  local line = '{"seq": ' .. (first + i - 1) .. ', ' .. string.sub(ARGV[i + 2], 2)
  redis.call('RPUSH', KEYS[i + 3], line)
  redis.call('RPUSH', KEYS[3], line)
  tails[KEYS[i + 3]] = true
end
tails[KEYS[3]] = true
for key in pairs(tails) do redis.call('LTRIM', key, -tonumber(ARGV[1]), -1) end
if tonumber(ARGV[2]) > 0 then redis.call('INCRBY', KEYS[2], ARGV[2]) end
return first
"""


_publisher: StderrPublisher | None = None


def publisher() -> StderrPublisher:
    global _publisher
    if _publisher is None:
        _publisher = StderrPublisher()
    return _publisher


def metrics_changed(changes: list[dict], loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Tell dashboards which plugin/hook metrics moved (they re-render from the database). `loop`: an event loop the
    calling thread keeps for its sends (the worker's invocation writer, plugins_app/services/recording.py); without
    one, async_to_sync makes a thread, an event loop and a Redis connection for each event (≈3 ms of CPU)."""
    if changes:
        _send_sync(METRICS_GROUP, {"type": "metrics.changed", "changes": changes}, loop)


def plugin_changed(name: str, what: str) -> None:
    _send_sync(PLUGINS_GROUP, {"type": "plugin.changed", "plugin": name, "what": what})


def _send_sync(group: str, message: dict, loop: asyncio.AbstractEventLoop | None = None) -> None:
    try:
        if loop is None:
            async_to_sync(get_channel_layer().group_send)(group, message)
        else:
            loop.run_until_complete(get_channel_layer().group_send(group, message))
    except bus.REDIS_DOWN as exc:  # Redis outage: dashboards re-read the database when they reconnect
        log.warning("could not publish %s event: Redis unreachable (%s)", message.get("type"), exc)
    except Exception:
        log.warning("could not publish %s event", message.get("type"), exc_info=True)

