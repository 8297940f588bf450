"""The web tier's side of the job bus (plugins_app/bus/hub.py), against real Redis: one reply listener per event loop
resolves many waiting calls, a reply the listener missed is still read from its list, and an unreachable Redis is
reported at once as BusUnavailable (never a stored-looking success)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from plugins_app import bus
from plugins_app.bus.hub import current_hub
from plugins_app.services import hooks as hook_service


@pytest.fixture
def prefix(settings):
    settings.LIBREFANG_REDIS_PREFIX = name = f"lfrep-{uuid.uuid4().hex[:8]}"
    r = bus.client()
    yield name
    for key in r.scan_iter(match=name + ":*"):
        r.delete(key)


def echo_worker(stream: bus.JobStream, jobs: int, *, drop_channel: bool = False) -> threading.Thread:
    """A stand-in for `librefang worker` that answers each job with its own request."""

    def run() -> None:
        done = 0
        end = time.monotonic() + 30
        while done < jobs and time.monotonic() < end:
            for job in stream.read(count=100, block_ms=200):
                assert job.signed
                if drop_channel:
                    job.reply_to = ""  # as if the web process's listener was away when the reply came
                stream.reply(job, bus.Reply.of({"echo": job.request}))
                stream.ack(job)
                done += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def new_stream() -> bus.JobStream:
    s = bus.JobStream(consumer=f"test-{uuid.uuid4().hex[:6]}")
    s.ensure_group()
    return s


async def test_it_answers_many_waiting_calls_through_one_listener(prefix):
    worker = echo_worker(new_stream(), 200)
    replies = await asyncio.gather(*(bus.submit_and_wait("ingest", {"n": i}, 20) for i in range(200)))
    assert [r.data()["echo"]["n"] for r in replies] == list(range(200))  # each call got its own reply
    worker.join(5)
    hub = current_hub()
    assert not hub.waiters
    pool = hub.r.connection_pool
    opened = len(pool._available_connections) + len(pool._in_use_connections)
    assert opened <= 4, f"200 waiting calls opened {opened} Redis connections"  # writer, listener, sweep


async def test_it_reads_a_reply_the_listener_missed_from_its_list(prefix):
    echo_worker(new_stream(), 1, drop_channel=True)
    started = time.monotonic()
    reply = await bus.submit_and_wait("ingest", {"n": 1}, 1.5)
    assert reply == bus.Reply(200, '{"echo": {"n": 1}}')
    assert time.monotonic() - started < 5


async def test_it_reports_an_unreachable_redis_at_once(prefix, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(bus.BusUnavailable):
        await bus.submit_and_wait("ingest", {"n": 1}, 10)
    with pytest.raises(bus.BusUnavailable):
        await bus.enqueue("after_turn", {"n": 1})
    assert time.monotonic() - started < 5


@pytest.mark.django_db
async def test_it_answers_503_with_retry_after_for_after_turn_it_could_not_store(prefix, settings, home):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    answer = await hook_service.call_hook(
        "after_turn", {"agent_id": "a", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status == 503
    assert answer.headers["Retry-After"] == str(hook_service.RETRY_AFTER_SECS)
    body = answer.data()
    assert body["error"]["code"] == "bus_unavailable" and "not stored" in body["error"]["message"]


@pytest.mark.django_db(transaction=True)
async def test_it_falls_back_with_the_reason_when_redis_is_unreachable(prefix, settings, home):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    answer = await hook_service.call_hook("ingest", {"agent_id": "a", "message": "m", "peer_id": None})
    body = answer.data()
    assert answer.status == 200 and body["source"] == "default"
    assert body["fallback_reason"].startswith("bus_unavailable: Redis unreachable")
    from plugins_app.models import JobRecord

    record = await JobRecord.objects.aget(worker="web", hook="ingest")
    assert record.fallback_reason == body["fallback_reason"] and record.source == "default"
