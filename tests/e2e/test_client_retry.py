"""librefang-client's retries through a Redis outage: with the service's own redis-server (tests/own_redis.py)
killed, after_turn answers 503 + Retry-After (nothing stored); the client waits as told and sends it again until
Redis is back, and the caller gets the accepted job, not an error; the turn is then remembered. A deadline shorter
than the outage ends in `Unavailable` with the service's code."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from librefang_client import LibreFang, Unavailable

from tests.own_redis import service_with_own_redis
from tests.waiting import wait_until

OUTAGE_SECS = 4.0
TURN = [{"role": "user", "content": "My locker code is 4711"},
        {"role": "assistant", "content": "Noted: your locker code is 4711."}]


@pytest.fixture
def outage_service(tmp_path):
    with service_with_own_redis(tmp_path) as (service, redis):
        yield service, redis


def test_it_stores_after_turn_through_a_redis_outage_without_the_caller_seeing_an_error(outage_service):
    service, redis = outage_service
    statuses: list[tuple[int, str | None]] = []
    http = httpx.Client(event_hooks={"response": [
        lambda r: statuses.append((r.status_code, r.headers.get("Retry-After")))]})
    lf = LibreFang(service.url, service.token, http=http, deadline=60)
    assert lf.after_turn("gym-bot", [{"role": "user", "content": "warm-up"}]).accepted

    redis.kill()
    with pytest.raises(Unavailable) as short:  # a deadline shorter than the outage
        lf.after_turn("gym-bot", TURN, deadline=0.5)
    assert short.value.status == 503 and short.value.code == "bus_unavailable" and short.value.retry_after >= 1

    restart = threading.Timer(OUTAGE_SECS, redis.start)
    restart.start()
    sent = time.monotonic()
    try:
        accepted = lf.after_turn("gym-bot", TURN, peer_id="kim")
    finally:
        restart.join()
    assert accepted.accepted and accepted.job_id
    assert time.monotonic() - sent >= OUTAGE_SECS - 1  # it was answered after Redis came back, not before
    refused = [s for s in statuses[2:] if s[0] == 503]
    assert refused and all(retry_after for _, retry_after in refused), statuses
    assert statuses[-1][0] == 202

    memories = wait_until(lambda: lf.memories.list("gym-bot", peer_id="kim", include_shared=False).items, 30,
                          "the turn stored by a worker")
    assert memories and "locker code is 4711" in memories[0].content
