"""Websockets: live stderr for one plugin (/ws/stderr/<plugin>/) or all (/ws/stderr/), and live metrics
(/ws/metrics/?view=list|plugin|engine[&plugin=<name>]) as HTML fragments re-rendered from the database.

HTML fragments for the htmx ws extension by default; `?format=json` sends {"seq","epoch","plugin","hook","line","ts"}.
A (re)connecting client first gets the stored tail (lines with seq > `?after=`), then live lines; lines that
arrive while the tail is being sent are de-duplicated by seq. A client resuming after lines the tail no longer keeps
(it keeps the last events.TAIL_LEN per plugin) is told so first: `{"missed": {"after", "through", "kept"}}` in JSON,
a notice line in HTML. Seqs count within an epoch: when Redis lost the counter, lines come with a new one and a
viewer that knows the old (`?epoch=`, or from lines it was sent) is told `{"renumbered": {"epoch"}}` (a notice line
in HTML) and starts counting again. Accepts the session cookie, or an API token (viewer and up) as
`Authorization: Bearer <token>` or `?token=` (browsers cannot set a websocket's headers).
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from plugins_app import events
from plugins_app.auth import allows, headers_bearer, lookup
from plugins_app.models import Role
from plugins_app.selectors import dashboard

log = logging.getLogger("librefang.dashboard")
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404


def _token(scope, query: dict[str, list[str]]) -> str:
    """The API token a websocket client sent: its Authorization header, else `?token=`."""
    return headers_bearer(scope.get("headers") or []) or (query.get("token") or [""])[0]


def _authorized(scope, token: str) -> bool:
    user = scope.get("user")
    if user is not None and user.is_authenticated:
        return True
    found = lookup(token) if token else None
    return found is not None and allows(found, Role.VIEWER)


class StderrConsumer(AsyncWebsocketConsumer):
    """Joins its web process's stderr feed (plugins_app/events.py LiveFeed): live batches and catch-ups from the
    stored tail are sent one after another, in the order they came (one lock), so lines never overtake each other."""

    feed: events.LiveFeed | None = None
    pending: frozenset[asyncio.Task] | set[asyncio.Task] = frozenset()

    async def connect(self):
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.format = (query.get("format") or ["html"])[0]
        token = _token(self.scope, query)
        try:
            self.after = int((query.get("after") or ["0"])[0])
        except ValueError:
            self.after = 0
        self.epoch = (query.get("epoch") or [None])[0] or None  # the numbering `after` belongs to
        self.plugin = self.scope["url_route"]["kwargs"].get("plugin")
        if not await sync_to_async(_authorized)(self.scope, token):
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.seen: set[int] = set()
        self.sending = asyncio.Lock()
        self.pending: set[asyncio.Task] = set()
        await self.accept()
        self.feed = events.stderr_feed()
        self.feed.join(self)  # the stored tail first, once the feed is subscribed (catch_up)

    async def disconnect(self, code):
        if self.feed is not None:
            self.feed.leave(self)
        for task in self.pending:
            task.cancel()

    async def receive(self, text_data=None, bytes_data=None):
        return  # the stream is one-way; the browser's messages (htmx ws) are ignored

    def live(self, lines: list[dict]) -> None:
        mine = lines if self.plugin is None else [ln for ln in lines if ln["plugin"] == self.plugin]
        if mine:
            self._in_turn(self._send_lines(mine))

    def catch_up(self) -> None:
        self._in_turn(self._send_tail())

    def _in_turn(self, step) -> None:
        task = asyncio.ensure_future(self._locked(step))  # tasks take the (FIFO) lock in the order made
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _locked(self, step) -> None:
        try:
            async with self.sending:
                await step
        except Exception as exc:  # Redis gone mid catch-up, or the socket closed: the next catch-up resumes
            log.info("stderr websocket: %s", exc)
        finally:
            step.close()  # a step cancelled before its turn never ran

    async def _send_tail(self) -> None:
        after = max(self.seen, default=self.after)
        lines, lost = await events.atail(self.plugin, after, self.epoch)
        same_numbering = not lines or self.epoch is None or lines[-1].get("epoch") == self.epoch
        if lost and after and same_numbering:  # resuming, not a first look: say that lines are gone, never skip
            await self._send_missed(after, lost)
        await self._send_lines(lines)

    def _renumbered(self, epoch: str | None) -> bool:
        """Whether these lines start a new numbering (Redis lost the counter): forget the old numbers, or new lines
        would be dropped as repeats of them."""
        if epoch is None or epoch == self.epoch:
            return False
        known, self.epoch = self.epoch, epoch
        if known is None:
            return False
        self.seen, self.after = set(), 0
        return True

    async def _send_missed(self, after: int, through: int) -> None:
        await self._send_notice({"missed": {"after": after, "through": through, "kept": events.TAIL_LEN}},
                                "plugins_app/partials/stderr_missed.html")

    async def _send_notice(self, notice: dict, template: str) -> None:
        """A message that is not a line: the JSON object as it is, or its template's notice line in HTML."""
        if self.format == "json":
            await self.send(text_data=json.dumps(notice))
        else:
            [context] = notice.values()
            await self.send(text_data=await sync_to_async(render_to_string)(template, context))

    async def _send_lines(self, lines: list[dict]) -> None:
        if lines and self._renumbered(lines[-1].get("epoch")):
            lines = [ln for ln in lines if ln.get("epoch") == self.epoch]
            await self._send_notice({"renumbered": {"epoch": self.epoch}}, "plugins_app/partials/stderr_renumbered.html")
        # De-duplicate by seq (not by "greater than the last one"): two workers may publish interleaved batches.
        fresh = [ln for ln in lines if ln["seq"] > self.after and ln["seq"] not in self.seen]
        if not fresh:
            return
        self.seen.update(ln["seq"] for ln in fresh)
        if len(self.seen) > 20_000:
            self.seen = set(sorted(self.seen)[-10_000:])
        if self.format == "json":
            for ln in fresh:
                await self.send_json_line(ln)
        else:
            html = await sync_to_async(render_to_string)("plugins_app/partials/stderr_lines.html",
                                                          {"lines": fresh, "show_plugin": self.plugin is None})
            await self.send(text_data=html)

    async def send_json_line(self, ln: dict) -> None:
        await self.send(text_data=json.dumps({k: ln.get(k) for k in ("seq", "epoch", "plugin", "hook", "line", "ts")}))


class NotFoundConsumer(AsyncWebsocketConsumer):
    """Any websocket path no route matches (e.g. `/ws/stderr/../../x/`): accept, then close with 4404 and a reason,
    so the client learns why instead of the server failing the handshake with a 500."""

    async def connect(self):
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND, reason="no such websocket route")

    async def receive(self, text_data=None, bytes_data=None):
        return


METRICS_VIEWS = ("list", "plugin", "engine", "chart")  # chart: JSON {"changed": [{"plugin", "hook"}]} for charts
THROTTLE_SECS = 0.25  # at most one re-render per this interval: a burst of calls becomes one message
GATHER_SECS = 0.03  # a first change waits only this long for its siblings (one recording batch)


class MetricsConsumer(AsyncWebsocketConsumer):
    """Pushes re-rendered rows when workers report metrics.changed or a plugin's state changes.

    view=list: plugin rows of the plugins page; view=plugin&plugin=<name>: that plugin's hook rows, state and
    recent traces; view=engine: engine-wide per-hook totals and the chain. Every fragment is an hx-swap-oob
    element, so the htmx ws extension swaps it by id."""

    feed: events.LiveFeed | None = None
    caught_up = False  # the feed's first subscription is behind it

    async def connect(self):
        query = parse_qs(self.scope.get("query_string", b"").decode())
        token = _token(self.scope, query)
        self.view = (query.get("view") or ["list"])[0]
        self.plugin = (query.get("plugin") or [None])[0]
        if not await sync_to_async(_authorized)(self.scope, token):
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        if self.view not in METRICS_VIEWS or (self.view == "plugin" and not self.plugin):
            await self.close(code=4400)
            return
        self.pending: dict[str, set[str]] = {}
        self.state_changed: dict[str, str] = {}
        self.flusher: asyncio.Task | None = None
        self.last_flush = 0.0
        self.groups_joined = [events.PLUGINS_GROUP]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        self.feed = events.metrics_feed()
        self.feed.join(self)

    async def disconnect(self, code):
        if self.feed is not None:
            self.feed.leave(self)
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "flusher", None):
            self.flusher.cancel()

    async def receive(self, text_data=None, bytes_data=None):
        return

    def catch_up(self) -> None:
        """The metrics feed (re)subscribed: what changed while it was away is not known, so everything shown is
        re-rendered (nothing on the first subscription: the page was rendered just before)."""
        if self.caught_up:
            self.live([{"plugin": events.EVERY_PLUGIN, "hook": "*"}])
        self.caught_up = True

    def live(self, changes: list[dict]) -> None:
        for change in changes:
            plugin, hook = change.get("plugin"), change.get("hook")
            if plugin == events.EVERY_PLUGIN and self.view == "plugin":  # a reset of all metrics concerns this plugin too
                plugin = self.plugin
            if not plugin or (self.view == "plugin" and plugin != self.plugin):
                continue
            self.pending.setdefault(plugin, set()).add(hook)
        self._schedule()

    async def plugin_changed(self, event):
        plugin = event.get("plugin")
        if not plugin or (self.view == "plugin" and plugin != self.plugin):
            return
        self.state_changed[plugin] = event.get("what", "")
        self.pending.setdefault(plugin, set())
        self._schedule()

    def _schedule(self) -> None:
        if self.pending and (self.flusher is None or self.flusher.done()):
            self.flusher = asyncio.ensure_future(self._flush_later())

    async def _flush_later(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(GATHER_SECS, self.last_flush + THROTTLE_SECS - loop.time()))
        self.last_flush = loop.time()
        pending, self.pending = self.pending, {}
        states, self.state_changed = self.state_changed, {}
        if self.view == "chart":  # static/js/app.js reloads the chart data the change concerns
            changed = [{"plugin": p, "hook": h} for p, hooks in sorted(pending.items())
                       for h in sorted({h or "*" for h in hooks} or {"*"})]
            await self.send(text_data=json.dumps({"changed": changed}))
            if self.pending:
                self._schedule()
            return
        try:
            for html in await sync_to_async(render_metrics_fragments)(self.view, pending, states):
                await self.send(text_data=html)
        except Exception:  # a failed render must not end live updates for this browser
            log.exception("rendering metrics fragments for view %s failed", self.view)
        if self.pending:
            self._schedule()


def render_metrics_fragments(view: str, pending: dict[str, set[str]], states: dict[str, str]) -> list[str]:
    """The OOB fragments one metrics consumer sends for a batch of changes (sync: reads the database).

    Table fragments (tbody/tr) and the rest go out as separate messages: htmx parses one message in one context, and
    a <form> parsed in table context loses its children (the HTML parser closes it at once), while <tr> parsed in
    body context is dropped.
    """
    parts: list[str] = []  # table rows
    other: list[str] = []  # everything else
    if view == "list":
        if events.EVERY_PLUGIN in pending:  # all metrics reset, or a feed that was away: every row
            pending = {row["plugin"].name: set() for row in dashboard.plugin_rows()}
        if states:  # enabled/disabled/config changes move the serving chain shown in the page head
            other.append(render_to_string("plugins_app/partials/engine_summary.html",
                                          {"chain": dashboard.plugin_selectors.active_chain(), "oob": True}))
        for name in sorted(pending):
            row = dashboard.plugin_row(name)
            what = states.get(name, "")
            if row is None:
                parts.append(f'<tr id="plugin-row-{_safe_id(name)}" hx-swap-oob="delete"></tr>')
            elif what in ("created", "installed", "scaffolded"):
                parts.append(render_to_string("plugins_app/partials/plugin_row_new.html", {"row": row}))
                # hide the empty-state message by swapping in a hidden stand-in: the target always exists, so
                # a second "created" in a row never swaps into nothing (htmx:oobErrorNoTarget)
                other.append('<div id="plugins-empty" hx-swap-oob="outerHTML" hidden></div>')
            else:
                parts.append(render_to_string("plugins_app/partials/plugin_row.html", {"row": row, "oob": True}))
    elif view == "plugin":
        for name in pending:
            rows = dashboard.hook_rows(name)
            parts.append(render_to_string("plugins_app/partials/hook_rows.html",
                                          {"hook_rows": rows, "oob": True}))
            parts.append(render_to_string("plugins_app/partials/trace_rows.html",
                                          {"traces": dashboard.recent_traces(name), "oob": True}))
            if name in states:
                summary = dashboard.plugin_selectors.get_plugin(name)
                if summary is not None:
                    other.append(render_to_string("plugins_app/partials/plugin_state.html",
                                                  {"plugin": summary, "oob": True}))
                    other.append(render_to_string("plugins_app/partials/toggle_form.html",
                                                  {"plugin": summary, "oob": True}))
    else:
        parts.append(render_to_string("plugins_app/partials/engine_hook_rows.html",
                                      {"engine_hooks": dashboard.engine_hook_totals(), "oob": True}))
        if states:
            other.append(render_to_string("plugins_app/partials/engine_chain.html",
                                          {"engine": dashboard.engine_state(), "oob": True}))
    return [msg for msg in ("\n".join(parts), "\n".join(other)) if msg.strip()]


def _safe_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
