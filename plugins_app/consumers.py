"""Websockets: live stderr for one plugin (/ws/stderr/<plugin>/) or all (/ws/stderr/).

HTML fragments for the htmx ws extension by default; `?format=json` sends {"seq","plugin","hook","line","ts"}.
A (re)connecting client first gets the stored tail (lines with seq > `?after=`), then live lines; lines that
arrive while the tail is being sent are de-duplicated by seq. Accepts the session cookie or `?token=`.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from plugins_app import events
from plugins_app.auth import allows, lookup
from plugins_app.models import Role

CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403


def _authorized(scope, token: str | None) -> bool:
    user = scope.get("user")
    if user is not None and user.is_authenticated:
        return True
    found = lookup(token) if token else None
    return found is not None and allows(found, Role.VIEWER)


class StderrConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.format = (query.get("format") or ["html"])[0]
        token = (query.get("token") or [None])[0]
        try:
            self.after = int((query.get("after") or ["0"])[0])
        except ValueError:
            self.after = 0
        self.plugin = self.scope["url_route"]["kwargs"].get("plugin")
        if not await sync_to_async(_authorized)(self.scope, token):
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.group = events.stderr_group(self.plugin)
        self.seen: set[int] = set()
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        backlog = await sync_to_async(events.tail)(self.plugin, self.after)
        await self._send_lines(backlog)

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        return  # the stream is one-way; the browser's messages (htmx ws) are ignored

    async def stderr_lines(self, event):
        await self._send_lines(event["lines"])

    async def _send_lines(self, lines: list[dict]) -> None:
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
        import json

        await self.send(text_data=json.dumps({k: ln.get(k) for k in ("seq", "plugin", "hook", "line", "ts")}))
