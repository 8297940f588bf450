"""What a worker does with a job (plugins_app/services/jobs.py), with real Redis and the real engine."""

from __future__ import annotations

import time
import uuid

import pytest

from plugins_app import bus
from plugins_app.models import JobRecord
from plugins_app.services import jobs
from tests.app.recording_fixtures import _flush_recording, _release_writer_connection  # noqa: F401
from tests.plugin_factory import make_plugin, write_config

pytestmark = pytest.mark.django_db(transaction=True)


FAIL = "import sys; sys.stdin.read(); print('nope', file=sys.stderr); sys.exit(4)"


def job_for(hook, request, deadline_in=60.0):
    return bus.Job(id=uuid.uuid4().hex, entry_id="0-1", kind="hook", hook=hook, request=request,
                   deadline=time.time() + deadline_in, wants_reply=True)


def reply_of(stream, job) -> bus.Reply | None:
    raw = stream.r.lrange(bus.reply_key(job.id), 0, -1)
    return bus.Reply.from_wire(bus.open_reply(job.id, raw[0])) if raw else None


@pytest.fixture
def stream():
    s = bus.JobStream(consumer=f"test-{uuid.uuid4().hex[:6]}")
    s.ensure_group()
    return s


def test_it_replies_with_the_abort_error_and_records_why(home, stream):
    make_plugin(home.plugins_dir, "strict", {"assemble": FAIL}, toml_extra='on_hook_failure = "abort"')
    write_config(home.root, plugin="strict")
    job = job_for("assemble", {"agent_id": "a", "messages": [{"role": "user", "content": "hi"}]})
    assert jobs.process(job, stream) == JobRecord.State.DONE
    reply = reply_of(stream, job)  # what the agent gets, as the web tier passes it on
    assert reply.status == 502
    error = reply.data()["error"]
    assert error["code"] == "hook_aborted"
    assert error["message"] == "strict failed its assemble hook and its on_hook_failure policy is abort: exit code 4: nope"
    assert error["details"] == {"kind": "aborted", "plugin": "strict", "hook": "assemble", "cause": "script_error",
                                "message": "exit code 4: nope", "trace_ids": error["details"]["trace_ids"]}
    assert len(error["details"]["trace_ids"]) == 1
    record = JobRecord.objects.get(job_id=job.id)
    assert record.fallback_reason == "aborted: strict: script_error: exit code 4: nope"


def test_it_replies_with_the_fallback_under_warn(home, stream):
    make_plugin(home.plugins_dir, "lenient", {"assemble": FAIL})
    write_config(home.root, plugin="lenient")
    job = job_for("assemble", {"agent_id": "a", "messages": [{"role": "user", "content": "hi"}]})
    jobs.process(job, stream)
    reply = reply_of(stream, job).data()
    assert "aborted" not in reply and reply["source"] == "default"
    assert reply["messages"] == [{"role": "user", "content": "hi"}]
    assert JobRecord.objects.get(job_id=job.id).fallback_reason == "lenient: script_error: exit code 4: nope"


def test_it_drops_a_job_whose_deadline_passed_and_never_runs_it(home, stream):
    make_plugin(home.plugins_dir, "late", {"assemble": FAIL})
    write_config(home.root, plugin="late")
    job = job_for("assemble", {"messages": []}, deadline_in=-1)
    assert jobs.process(job, stream) == JobRecord.State.EXPIRED
    assert reply_of(stream, job) is None
    assert not (home.data_dir("late")).exists()  # the hook never ran (it would have created its data dir)


COUNTING_AFTER_TURN = """
import json, os, sys
sys.stdin.read()
with open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "runs"), "a") as fh:
    fh.write("x")
print(json.dumps({"type": "ok"}))
"""


def test_it_acks_a_redelivered_job_whose_outcome_is_stored_without_running_it_again(home, stream):
    make_plugin(home.plugins_dir, "counter", {"after_turn": COUNTING_AFTER_TURN})
    write_config(home.root, plugin="counter")
    job = job_for("after_turn", {"agent_id": "a", "messages": [{"role": "user", "content": "hi"}]})
    job.wants_reply = False
    assert jobs.process(job, stream) == JobRecord.State.DONE
    job.deliveries = 2  # claimed again after a worker died between storing the outcome and XACK
    assert jobs.process(job, stream) == "duplicate"
    assert (home.data_dir("counter") / "runs").read_text() == "x"
