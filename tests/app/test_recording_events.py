"""The invocation writer (plugins_app/services/recording.py) tells dashboards which metrics moved after each batch,
from one event loop of its own: not a thread, an event loop and a Redis connection per batch (async_to_sync)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from engine.ports import Invocation
from plugins_app import events
from plugins_app.models import HookMetric
from plugins_app.services.recording import DbInvocationSink
from tests.app.recording_fixtures import _release_writer_connection  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


class Layer:
    def __init__(self):
        self.sent = []

    async def group_send(self, group, message):
        self.sent.append((group, message, asyncio.get_running_loop()))


def _call(plugin: str) -> Invocation:
    return Invocation(trace_id=uuid.uuid4().hex[:16], plugin=plugin, hook="ingest", agent_id="a1",
                      started_at=time.time(), elapsed_ms=3.0, ok=True)


def test_each_batch_is_announced_on_the_writers_own_loop(monkeypatch):
    layer = Layer()
    made = []
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(events, "async_to_sync", lambda fn: made.append(fn) or (lambda *a: None))
    sink = DbInvocationSink()
    for plugin in ("one", "two"):
        sink.record(_call(plugin))
        sink.flush()
    assert made == []
    assert [(g, m["changes"]) for g, m, _ in layer.sent] == [
        (events.METRICS_GROUP, [{"plugin": "one", "hook": "ingest"}]),
        (events.METRICS_GROUP, [{"plugin": "two", "hook": "ingest"}])]
    assert layer.sent[0][2] is layer.sent[1][2]  # one loop, kept
    assert HookMetric.objects.get(plugin="two").calls == 1
