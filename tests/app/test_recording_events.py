"""The invocation writer (plugins_app/services/recording.py) tells dashboards which metrics moved after each batch,
with one PUBLISH that the web processes' metrics feeds (plugins_app/events.py LiveFeed) receive."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from engine.ports import Invocation
from plugins_app import bus, events
from plugins_app.models import HookMetric
from plugins_app.services.recording import DbInvocationSink
from tests.app.recording_fixtures import _release_writer_connection  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def _call(plugin: str) -> Invocation:
    return Invocation(trace_id=uuid.uuid4().hex[:16], plugin=plugin, hook="ingest", agent_id="a1",
                      started_at=time.time(), elapsed_ms=3.0, ok=True)


def test_each_batch_is_announced_with_one_publish():
    live = bus.client().pubsub(ignore_subscribe_messages=True)
    live.subscribe(events._metrics_channel())
    sink = DbInvocationSink()
    for plugin in ("one", "two"):
        sink.record(_call(plugin))
        sink.flush()
    got = []
    end = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < end:
        msg = live.get_message(timeout=0.2)
        if msg is not None:
            got.append(json.loads(msg["data"]))
    live.close()
    assert got == [[{"plugin": "one", "hook": "ingest"}], [{"plugin": "two", "hook": "ingest"}]]
    assert HookMetric.objects.get(plugin="two").calls == 1
