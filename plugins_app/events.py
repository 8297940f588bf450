"""Live events: the only module that talks to the Channels layer, and the one that carries live stderr.

stderr lines get a global sequence number and are kept in a capped tail in Redis, so a browser that (re)connects
first renders the recent past, then live lines, without losing or repeating any. Publishing runs on one background
thread per process that batches lines, so a chatty hook never waits on Redis; a batch is numbered, stored and
published in one Redis script, and each web process holds one subscription for all its stderr websockets
(LiveFeed) while any is open; metrics changes travel the same way. Plugin changes (rare) go through the Channels
layer's group.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
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
# A hook's line is most often followed closely by its answer: publishing at once would take the worker's GIL and
# a core just as the answer is being handed back.
# Waiting this long first moves that work past the answer (see bench/README.md) and batches a flood of lines; a
# browser sees a line this much later.
LINGER_SECS = 0.005
_GROUP_OK = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")


def _name_part(plugin: str) -> str:
    # a plugin's part of its tail's key: short and plain, whatever the name
    return plugin if _GROUP_OK.match(plugin) else "h" + hashlib.sha1(plugin.encode()).hexdigest()[:20]


PLUGINS_GROUP = "plugins"
EVERY_PLUGIN = "*"  # a metrics change that concerns every plugin (plugins_app/services/metrics.py reset_metrics)


def _tail_key(plugin: str) -> str:
    return bus.prefixed_key("stderr", "tail", _name_part(plugin))


def _seq_key() -> str:
    return bus.prefixed_key("stderr", "seq")


def _dropped_key() -> str:
    return bus.prefixed_key("stderr", "dropped")


def _epoch_key() -> str:
    return bus.prefixed_key("stderr", "epoch")


def _trimmed_key() -> str:
    return bus.prefixed_key("stderr", "trimmed")


def _live_channel() -> str:
    return bus.prefixed_key("stderr", "live")


def _metrics_channel() -> str:
    return bus.prefixed_key("metrics", "live")


def tail(plugin: str | None, after_seq: int = 0, limit: int = TAIL_LEN) -> list[dict]:
    """Recent lines (oldest first) with seq > after_seq."""
    return _newer(bus.client().lrange(_tail_key(plugin or ALL), -limit, -1), after_seq)


def recent_lines(plugin: str | None, limit: int = 200) -> list[dict]:
    """The newest lines of a plugin's stored tail (all plugins' for None) for a page's first render; none while
    Redis is unreachable (the page still renders, and its websocket fills the panel once Redis is back)."""
    try:
        return tail(plugin)[-limit:]
    except bus.REDIS_DOWN as exc:
        log.warning("stderr tail unavailable: Redis unreachable (%s)", exc)
        return []


async def atail(plugin: str | None, after_seq: int = 0, epoch: str | None = None) -> tuple[list[dict], int]:
    """The lines still kept with seq > after_seq (or of another epoch than `epoch`), and the seq of the newest line
    the tail no longer keeps when that is > after_seq (else 0): a viewer resuming after `after_seq` missed this
    plugin's lines up to it (if the numbering is still the one it knows). Tried again for a second or so: a feed
    that has just resubscribed after a Redis restart catches up through a pool whose connections may all be stale."""
    key = _tail_key(plugin or ALL)
    pauses = iter((0.05, 0.2, 1.0))
    while True:
        try:
            async with bus.aclient().pipeline(transaction=True) as pipe:
                raw, lost = await pipe.lrange(key, -TAIL_LEN, -1).hget(_trimmed_key(), key).execute()
            lost = int(lost or 0)
            return _newer(raw, after_seq, epoch), (lost if lost > after_seq else 0)
        except bus.REDIS_DOWN:
            pause = next(pauses, None)
            if pause is None:
                raise
            await asyncio.sleep(pause)


def _newer(raw: list[str], after_seq: int, epoch: str | None = None) -> list[dict]:
    """Lines after `after_seq`; with `epoch` (the numbering the viewer knows), every line of another numbering too."""
    lines = [json.loads(x) for x in raw]
    return [x for x in lines if x["seq"] > after_seq or (epoch is not None and x.get("epoch") != epoch)]


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
        self._redis = bus.client()

    def write(self, batch: list[dict]) -> None:
        """Redis down: keep the batch and retry with a capped backoff (0.1 s doubling to 2 s) while new lines
        queue up (beyond QUEUE_MAX they are counted as dropped); another error drops the batch, counted."""
        delay = 0.0
        while True:
            try:
                self._publish(self._redis, batch)
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

    def _publish(self, r: Any, batch: list[dict]) -> int:
        """Number the batch's lines (the `seq` browsers order by and count gaps with), append them to their plugin's
        tail and the "all" tail, and publish them to the web processes' stderr feeds (LiveFeed), in one script: numbering,
        storing and publishing are one step for every worker, so live lines arrive in seq order. Returns the first
        line's seq."""
        dropped = self.take_dropped()
        keys = [_seq_key(), _dropped_key(), _trimmed_key(), _epoch_key(), _tail_key(ALL),
                *(_tail_key(item["plugin"]) for item in batch)]
        try:
            return int(r.register_script(_TAIL_SCRIPT)(
                keys, [_live_channel(), TAIL_LEN, dropped, os.urandom(4).hex(), *(json.dumps(i) for i in batch)]))
        except BaseException:
            self.count_dropped(dropped)
            raise


# KEYS: seq counter, dropped counter, the "trimmed" hash, the epoch, the "all" tail, then each line's own tail; ARGV:
# the live channel, tail length, lines dropped since the last batch, an epoch to take if there is none, then each
# line as a JSON object, into which its number goes as "seq" and the epoch as "epoch". A tail over its length loses
# its oldest lines, and the hash keeps, per tail, the seq of the newest line it lost: a viewer resuming after an
# older seq learns that lines between are gone (`atail`). A counter that starts again (Redis lost its data) comes
# with a new epoch, so viewers holding the old numbers start over instead of taking new lines for repeats.
_TAIL_SCRIPT = """
local n = #ARGV - 4
local first = redis.call('INCRBY', KEYS[1], n) - n + 1
local epoch = redis.call('GET', KEYS[4])
if first == 1 or not epoch then
  epoch = ARGV[4]
  redis.call('SET', KEYS[4], epoch)
end
local tails, lines = {}, {}
for i = 1, n do
  local line = '{"seq": ' .. (first + i - 1) .. ', "epoch": "' .. epoch .. '", ' .. string.sub(ARGV[i + 4], 2)
  redis.call('RPUSH', KEYS[i + 5], line)
  tails[KEYS[i + 5]] = true
  lines[i] = line
end
redis.call('RPUSH', KEYS[5], unpack(lines))
tails[KEYS[5]] = true
local keep = tonumber(ARGV[2])
for key in pairs(tails) do
  local over = redis.call('LLEN', key) - keep
  if over > 0 then
    local lost = string.match(redis.call('LINDEX', key, over - 1), '^{"seq": (%d+)')
    redis.call('HSET', KEYS[3], key, lost)
    redis.call('LTRIM', key, -keep, -1)
  end
end
if tonumber(ARGV[3]) > 0 then redis.call('INCRBY', KEYS[2], ARGV[3]) end
redis.call('PUBLISH', ARGV[1], '[' .. table.concat(lines, ',') .. ']')
return first
"""


class LiveFeed:
    """What workers publish on one Redis channel, for the websockets of one event loop (one per web process under
    daphne): ONE subscription, held only while a websocket of this loop watches, each message (JSON) handed to every
    watcher's `live(payload)`. Whenever the subscription is (re)made, every watcher's `catch_up()` runs: for stderr
    (plugins_app/consumers.py) a line published while Redis was away, or before the watcher joined, is read back
    from the stored tail, so it still arrives, once and in order."""

    def __init__(self, channel: str) -> None:
        self.loop = asyncio.get_running_loop()
        self.channel = channel
        self.watchers: set[Any] = set()
        self.subscribed = False
        self._task: asyncio.Task | None = None

    def join(self, watcher: Any) -> None:
        self.watchers.add(watcher)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._subscription())
        elif self.subscribed:
            watcher.catch_up()

    def leave(self, watcher: Any) -> None:
        self.watchers.discard(watcher)
        if not self.watchers and self._task is not None:
            self._task.cancel()  # nobody of this process watches: Redis sends it nothing
            self._task, self.subscribed = None, False

    async def _subscription(self) -> None:
        """One subscription's life. Its callbacks act only while it is the feed's current one: a cancelled
        subscription still closing must not mark its successor's state."""
        task = asyncio.current_task()

        def lost() -> None:
            if self._task is task:
                self.subscribed = False

        async def subscribed() -> None:
            if self._task is task:
                self.subscribed = True
                for watcher in list(self.watchers):
                    watcher.catch_up()

        await bus.subscribe_forever(bus.aclient(), self.channel, on_message=self._on_message,
                                    on_subscribed=subscribed, on_lost=lost, what=f"live feed {self.channel}")

    def _on_message(self, data: str) -> None:
        try:
            payload = json.loads(data)
        except ValueError:  # not ours (anyone may PUBLISH): ignored, the subscription stays
            log.warning("live feed %s: ignored a message that is not JSON", self.channel)
            return
        for watcher in list(self.watchers):
            try:
                watcher.live(payload)
            except Exception:  # one websocket's trouble is not the others'
                log.exception("live feed %s: a watcher failed on a message", self.channel)


_feeds: dict[tuple[int, str], LiveFeed] = {}


def _feed(channel: str) -> LiveFeed:
    loop = asyncio.get_running_loop()
    feed = _feeds.get((id(loop), channel))
    if feed is None or feed.loop is not loop:  # (a new loop may reuse a closed one's id: tests)
        for key, old in list(_feeds.items()):  # feeds of loops that are gone
            if old.loop.is_closed():
                del _feeds[key]
        feed = _feeds[(id(loop), channel)] = LiveFeed(channel)
    return feed


def stderr_feed() -> LiveFeed:
    """This event loop's feed of numbered stderr batches (lists of lines), made on first use."""
    return _feed(_live_channel())


def metrics_feed() -> LiveFeed:
    """This event loop's feed of metrics changes (lists of {"plugin", "hook"}), made on first use."""
    return _feed(_metrics_channel())


_publisher: StderrPublisher | None = None


def publisher() -> StderrPublisher:
    global _publisher
    if _publisher is None:
        _publisher = StderrPublisher()
    return _publisher


def metrics_changed(changes: list[dict]) -> None:
    """Tell dashboards which plugin/hook metrics moved (they re-render from the database): one PUBLISH, which the
    web processes' metrics feeds get while a dashboard watches."""
    if not changes:
        return
    try:
        bus.client().publish(_metrics_channel(), json.dumps(changes))
    except bus.REDIS_DOWN as exc:  # Redis outage: a metrics feed that comes back re-renders what it shows
        log.warning("could not publish metrics changes: Redis unreachable (%s)", exc)
    except Exception:  # never the caller's failure (the worker's invocation writer, a reset)
        log.warning("could not publish metrics changes", exc_info=True)


def plugin_changed(name: str, what: str) -> None:
    message = {"type": "plugin.changed", "plugin": name, "what": what}
    try:
        async_to_sync(get_channel_layer().group_send)(PLUGINS_GROUP, message)
    except bus.REDIS_DOWN as exc:  # Redis outage: dashboards re-read the database when they reconnect
        log.warning("could not publish %s event: Redis unreachable (%s)", message["type"], exc)
    except Exception:
        log.warning("could not publish %s event", message["type"], exc_info=True)
