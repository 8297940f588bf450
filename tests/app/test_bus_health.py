"""/api/health tells the truth (plugins_app/api/health.py, plugins_app/selectors/health.py): never `ok` while Redis
is down or no worker heartbeats; lag, pending and heartbeat ages come from Redis itself."""

from __future__ import annotations

import time
import uuid

import pytest

from plugins_app import bus
from plugins_app.selectors.health import assess

pytestmark = pytest.mark.django_db


@pytest.fixture
def prefix(settings):
    settings.LIBREFANG_REDIS_PREFIX = name = f"lfhealth-{uuid.uuid4().hex[:8]}"
    r = bus.client()
    yield name
    for key in r.scan_iter(match=name + ":*"):
        r.delete(key)


def health(client):
    r = client.get("/api/health")
    return r.status_code, r.json()


def beat(stream: bus.JobStream, last_read_at: float | None) -> None:
    stream.heartbeat({"pid": 1, "last_read_at": last_read_at})


def test_it_is_down_with_503_when_redis_is_unreachable(client, prefix, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    status, body = health(client)
    assert status == 503 and body["status"] == "down" and body["redis"] is False
    assert "redis unreachable" in body["problems"]


def test_it_is_degraded_with_503_without_a_live_worker(client, prefix):
    status, body = health(client)
    assert status == 503 and body["status"] == "degraded" and body["redis"] is True
    assert body["problems"] == ["no live worker (no heartbeat)"]


def test_it_is_ok_with_a_live_worker_and_reports_ages_lag_and_pending(client, prefix):
    stream = bus.JobStream(consumer="w1")
    stream.ensure_group()
    beat(stream, time.time())
    status, body = health(client)
    assert status == 200 and body["status"] == "ok", body
    (worker,) = body["workers"]
    assert worker["worker"] == "w1" and 0 <= worker["heartbeat_age_secs"] < 5
    assert 0 <= body["last_read_age_secs"] < 5
    assert body["queue"] == {"length": 0, "pending": 0, "lag": 0}
    _job_id, fields = bus.job_fields("hook", "after_turn", {}, None, False)
    stream.r.xadd(stream.stream, fields)
    stream.r.xadd(stream.stream, fields)
    stream.read(count=1, block_ms=10)  # one delivered (pending), one still waiting (lag)
    assert health(client)[1]["queue"] == {"length": 2, "pending": 1, "lag": 1}


def test_it_is_degraded_when_jobs_wait_and_no_worker_reads(client, prefix):
    stream = bus.JobStream(consumer="w2")
    stream.ensure_group()
    _job_id, fields = bus.job_fields("hook", "after_turn", {}, None, False)
    stream.r.xadd(stream.stream, fields)
    beat(stream, time.time() - 60)  # alive, but its loop has not read for a minute (wedged)
    status, body = health(client)
    assert status == 503 and body["status"] == "degraded"
    assert body["problems"] == ["1 job(s) waiting and no worker read the stream for 60s"]


def test_it_counts_a_worker_the_supervisor_restarts_or_gave_up_as_degraded():
    worker = {"slot": "worker 1", "role": "worker", "state": "backoff", "failed_starts": 2,
              "last_exit": {"pid": 7, "code": None, "signal": "SIGKILL", "cause": "SIGKILL (possibly out of memory)"}}
    sup = {"stopping": False, "children": [{"slot": "web", "role": "web", "state": "running"}, worker]}

    def judged():
        return assess(redis_ok=True, db_ok=True, workers=[{"worker": "w"}], queue={}, read_age=0.5,
                      supervisor_doc=sup)

    assert judged() == ("degraded", ["supervisor: worker 1 is restarting"])
    worker.update(state="fatal", failed_starts=6)
    assert judged() == ("degraded", ["supervisor: worker 1 given up: SIGKILL (possibly out of memory), 6 failed starts"])
    sup["stopping"] = True  # the service is stopping everything: nothing to report
    assert judged() == ("ok", [])
    sup["stopping"] = False
    for state in ("starting", "running"):
        worker["state"] = state
        assert judged() == ("ok", [])


def test_it_says_loudly_when_a_worker_runs_hooks_with_a_degraded_sandbox(client, prefix):
    from engine.process import sandbox

    stream = bus.JobStream(consumer="w1")
    stream.ensure_group()
    stream.heartbeat({"pid": 7, "host": "h1", "last_read_at": time.time(), "sandbox_degraded": []})
    status, body = health(client)
    own = sandbox.degraded_reasons()
    assert body["sandbox"] == {"degraded": bool(own), "reasons": own}
    stream.heartbeat({"pid": 7, "host": "h1", "last_read_at": time.time(),
                      "sandbox_degraded": ["the service is not root: hooks run as the service's own user"]})
    status, body = health(client)
    assert body["sandbox"]["degraded"] is True
    assert "worker h1/7: the service is not root: hooks run as the service's own user" in body["sandbox"]["reasons"]
