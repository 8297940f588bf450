"""The job bus runs only what it signed (plugins_app/bus/signing.py, plugins_app/services/jobs.py): entries forged or
tampered with on the stream, and any hook of a disabled plugin, never run. Real Redis, real engine, real hooks."""

from __future__ import annotations

import json
import stat
import uuid

import pytest
import redis

from plugins_app import bus
from plugins_app.bus import signing
from plugins_app.models import AuditEntry, JobRecord
from plugins_app.services import jobs
from tests.app.recording_fixtures import _flush_recording, _release_writer_connection  # noqa: F401
from tests.plugin_factory import make_plugin, write_config

pytestmark = pytest.mark.django_db(transaction=True)

# Leaves a mark in its data directory: the proof that it ran.
MARKING_INGEST = """
import json, os, sys
sys.stdin.read()
open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "ran"), "a").write("x")
print(json.dumps({"type": "ingest_result", "memories": []}))
"""
REQUEST = {"agent_id": "a", "message": "hello", "peer_id": None}


@pytest.fixture
def stream(settings, home):
    settings.LIBREFANG_REDIS_PREFIX = f"lfsig-{uuid.uuid4().hex[:8]}"
    s = bus.JobStream(consumer=f"test-{uuid.uuid4().hex[:6]}")
    s.ensure_group()
    yield s
    for key in s.r.scan_iter(match=settings.LIBREFANG_REDIS_PREFIX + ":*"):
        s.r.delete(key)


@pytest.fixture
def marker(home):
    make_plugin(home.plugins_dir, "marker", {"ingest": MARKING_INGEST})
    write_config(home.root, plugin="marker")
    return home.data_dir("marker") / "ran"


def put(stream, fields: dict[str, str]) -> list[bus.Job]:
    stream.r.xadd(stream.stream, fields)
    return stream.read(count=10, block_ms=100)


def signed_fields(kind="hook", hook="ingest", request=REQUEST, plugin=""):
    _job_id, fields = bus.job_fields(kind, hook, request, 30, False, plugin)
    return fields


def assert_dropped_and_audited(stream, job, marker):
    assert jobs.process(job, stream) == jobs.REJECTED
    assert not marker.exists(), "a job that failed its signature ran"
    assert stream.r.xlen(stream.stream) == 0  # XDELed
    assert stream.r.xpending(stream.stream, bus.GROUP)["pending"] == 0  # XACKed
    entry = AuditEntry.objects.get(action="bus.job_rejected")
    assert entry.ok is False and entry.details["entry_id"] == job.entry_id
    assert not JobRecord.objects.filter(job_id=job.id).exists()


def test_it_runs_a_job_it_signed(stream, marker):
    (job,) = put(stream, signed_fields())
    assert job.signed
    assert jobs.process(job, stream) == JobRecord.State.DONE
    assert marker.exists()


def test_it_drops_and_audits_an_unsigned_entry_without_running_it(stream, marker):
    fields = signed_fields()
    del fields["sig"]
    (job,) = put(stream, fields)
    assert_dropped_and_audited(stream, job, marker)


def test_it_drops_an_entry_signed_with_another_key(stream, marker):
    import hashlib
    import hmac

    fields = signed_fields()
    fields["sig"] = hmac.new(b"not-our-key", signing.canonical(fields), hashlib.sha256).hexdigest()
    (job,) = put(stream, fields)
    assert_dropped_and_audited(stream, job, marker)


def test_it_drops_a_signed_entry_whose_fields_were_changed(stream, marker):
    fields = signed_fields()
    fields["request"] = json.dumps({**REQUEST, "message": "something else"})
    (job,) = put(stream, fields)
    assert_dropped_and_audited(stream, job, marker)


def test_it_never_runs_a_test_hook_of_a_disabled_plugin_even_when_signed(stream, marker, home):
    (home.plugins_dir / "marker" / ".disabled").touch()
    _job_id, fields = bus.job_fields("test_hook", "ingest", REQUEST, 30, True, "marker")
    (job,) = put(stream, fields)
    assert job.signed
    assert jobs.process(job, stream) == JobRecord.State.FAILED
    assert not marker.exists()
    reply = bus.Reply.from_wire(bus.open_reply(job.id, stream.r.lpop(bus.reply_key(job.id))))
    assert reply.failed and reply.body.startswith("plugin_disabled")
    assert stream.r.xlen(stream.stream) == 0


def test_it_keeps_the_key_owner_only_and_shared_by_every_process(home, settings):
    path = bus.bus_key_path()
    assert path == home.root / "bus_key"
    key = bus.bus_key()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip().encode() == key and len(key) == 64
    signing._key_cache.clear()  # another process reads the same file
    assert bus.bus_key() == key


def test_it_retries_an_ack_kept_while_redis_was_unreachable(stream, marker):
    (job,) = put(stream, signed_fields())
    good = stream.r
    stream.r = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)  # nothing listens there
    try:
        assert jobs.process(job, stream) == JobRecord.State.DONE  # finished while Redis is "down"
        assert stream.deferred_count() == 1 and job.key in stream.holding
        with pytest.raises(bus.REDIS_DOWN):
            stream.flush_deferred()
        assert stream.deferred_count() == 1
    finally:
        stream.r = good
    stream.flush_deferred()
    assert stream.deferred_count() == 0 and not stream.holding
    assert stream.r.xlen(stream.stream) == 0
    assert stream.r.xpending(stream.stream, bus.GROUP)["pending"] == 0
