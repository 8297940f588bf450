"""The worker loop in steps (plugins_app/services/worker_loop.py), agent affinity on the job stream and prewarm
through the control stream (plugins_app/bus/), against real Redis and the real engine."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
import uuid

import pytest
from django.core.management import call_command

from engine.process import warmstart
from plugins_app import bus
from plugins_app.bus import control
from plugins_app.management.commands.worker import Command as WorkerCommand
from plugins_app.models import JobRecord, Role
from plugins_app.services import affinity, hooks
from plugins_app.services import prewarm as prewarm_service
from plugins_app.services.tokens import create_token
from plugins_app.services.worker_loop import WorkerLoop
from tests.app.recording_fixtures import _flush_recording, _release_writer_connection  # noqa: F401
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def prefix(settings):
    settings.LIBREFANG_REDIS_PREFIX = name = f"lfloop-{uuid.uuid4().hex[:8]}"
    affinity.forget()
    yield name
    r = bus.client()
    for key in r.scan_iter(match=name + ":*"):
        r.delete(key)
    affinity.forget()


def put(hook: str, request: dict, *, stream: str | None = None, kind: str = "hook") -> str:
    job_id, fields = bus.job_fields(kind, hook, request, None, False)
    bus.client().xadd(stream or bus.stream_key(), fields)
    return job_id


def new_stream(host: str = "", beat: bool = False) -> bus.JobStream:
    s = bus.JobStream(consumer=f"test-{uuid.uuid4().hex[:6]}", host=host)
    s.ensure_group()
    if beat:
        s.heartbeat({"pid": 0, "host": "test"})
    return s


class Recorder:
    """Stands in for services.jobs.process where only the loop's bookkeeping is under test: it acks each job."""

    def __init__(self):
        self.jobs: list[bus.Job] = []
        self.lock = threading.Lock()

    def __call__(self, job, stream):
        with self.lock:
            self.jobs.append(job)
        stream.ack(job)
        return "done"


def pending(name: str) -> int:
    return int(bus.client().xpending(name, bus.GROUP)["pending"])


# ---- the loop's steps ----

def test_read_once_starts_the_new_jobs_and_each_is_acked():
    stream = new_stream()
    ids = {put("after_turn", {"agent_id": "a"}), put("after_turn", {"agent_id": "b"})}
    rec = Recorder()
    loop = WorkerLoop(stream, 4, process=rec)
    assert loop.read_once(block_ms=200) == 2
    loop.finish()
    assert {j.id for j in rec.jobs} == ids and all(j.signed for j in rec.jobs)
    assert pending(stream.stream) == 0 and bus.client().xlen(stream.stream) == 0
    assert loop.snapshot()["processed"] == 2 and loop.snapshot()["inflight"] == 0
    assert loop.read_once(block_ms=50) == 0


def test_read_once_takes_no_more_than_its_free_slots_from_one_stream():
    stream = new_stream()
    for i in range(5):
        put("after_turn", {"agent_id": f"a{i}"})
    rec = Recorder()
    loop = WorkerLoop(stream, 2, process=rec)
    assert loop.read_once(block_ms=200) == 2
    loop.finish()
    assert len(rec.jobs) == 2 and bus.client().xlen(stream.stream) == 3  # the rest wait for a later read


def test_reclaim_once_takes_up_the_jobs_of_a_worker_that_stopped_heartbeating():
    dead = new_stream()
    job_id = put("after_turn", {"agent_id": "a"})
    assert [j.id for j in dead.read(count=10, block_ms=100)] == [job_id]  # read, then the worker died
    rec = Recorder()
    loop = WorkerLoop(new_stream(beat=True), 2, process=rec)
    assert loop.reclaim_once() == 1
    loop.finish()
    (job,) = rec.jobs
    assert job.id == job_id and job.deliveries == 2
    assert pending(dead.stream) == 0


def test_a_read_over_two_streams_runs_every_job_even_beyond_the_free_slots():
    stream = new_stream(host="hostA")
    ids = {put("after_turn", {"agent_id": "a"}), put("after_turn", {"agent_id": "b"}, stream=stream.host_stream)}
    rec = Recorder()
    loop = WorkerLoop(stream, 1, process=rec)
    assert loop.read_once(block_ms=200) == 2  # one from each stream: the second waited for the slot
    loop.finish()
    assert {j.id for j in rec.jobs} == ids
    assert {j.key[0] for j in rec.jobs} == {stream.stream, stream.host_stream}
    assert pending(stream.stream) == 0 and pending(stream.host_stream) == 0


COUNTING_AFTER_TURN = """
import json, os, sys
sys.stdin.read()
with open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "runs"), "a") as fh:
    fh.write("x")
print(json.dumps({"type": "ok"}))
"""


def test_worker_once_runs_one_cycle_with_the_real_engine_and_exits(home):
    make_plugin(home.plugins_dir, "counter", {"after_turn": COUNTING_AFTER_TURN})
    write_config(home.root, plugin="counter")
    job_id = put("after_turn", {"agent_id": "a", "messages": [{"role": "user", "content": "hi"}]})
    out = io.StringIO()
    call_command("worker", "--once", "--concurrency", "2", stdout=out)
    assert "1 job(s) started" in out.getvalue()
    assert JobRecord.objects.get(job_id=job_id).state == JobRecord.State.DONE
    assert (home.data_dir("counter") / "runs").read_text() == "x"
    r = bus.client()
    assert r.xlen(bus.stream_key()) == 0 and not list(r.scan_iter(match=bus.heartbeat_key("*")))  # retired
    out = io.StringIO()
    call_command("worker", "--once", stdout=out)
    assert "0 job(s) started" in out.getvalue()


# ---- agent affinity ----

async def test_jobs_of_an_agent_go_to_one_live_host_when_its_plugin_asks_for_affinity(home):
    make_plugin(home.plugins_dir, "sticky", {"ingest": PY_ECHO_INGEST}, top_extra='affinity = "agent"')
    make_plugin(home.plugins_dir, "loose", {"ingest": PY_ECHO_INGEST})
    write_config(home.root, plugin="sticky")
    a, b = new_stream(host="hostA", beat=True), new_stream(host="hostB", beat=True)
    r = bus.client()
    for agent in ("agent-1", "agent-2", "agent-3", "agent-4"):
        for _ in range(3):  # as an agent's call comes in (plugins_app/services/hooks.py decides the routing)
            assert (await hooks.call_hook("after_turn", {"agent_id": agent, "messages": []})).status == 202
        home_stream = bus.host_stream_key(bus.host_for(agent, ["hostA", "hostB"]))
        entries = r.xrange(home_stream)
        assert sum(json.loads(f["request"])["agent_id"] == agent for _, f in entries) == 3
    counts = {s.host: r.xlen(s.host_stream) for s in (a, b)}
    assert sum(counts.values()) == 12 and r.xlen(bus.stream_key()) == 0
    # a job without an agent, and every job once the configured plugin asks for no affinity, use the shared stream
    assert (await hooks.call_hook("after_turn", {"messages": []})).status == 202
    write_config(home.root, plugin="loose")
    affinity.forget()
    assert (await hooks.call_hook("after_turn", {"agent_id": "agent-1", "messages": []})).status == 202
    assert r.xlen(bus.stream_key()) == 2 and sum(r.xlen(s.host_stream) for s in (a, b)) == 12
    # the test console routes by the plugin it names, whatever the configuration (no worker answers: unavailable)
    agent_stream = bus.host_stream_key(bus.host_for("agent-1", ["hostA", "hostB"]))
    before = r.xlen(agent_stream)
    reply = await hooks.test_hook("sticky", "ingest", {"agent_id": "agent-1", "message": "m"}, 0.1)
    assert reply["error"]["kind"] == "worker_unavailable"
    assert r.xlen(agent_stream) == before + 1 and r.xlen(bus.stream_key()) == 2
    stats = await bus.queue_stats()  # health and the dashboard count the host streams' backlog too
    assert stats["length"] == 15 and stats["lag"] == 15 and stats["pending"] == 0


def test_sync_callers_route_jobs_by_agent_affinity_like_async_ones(home):
    make_plugin(home.plugins_dir, "sticky", {"ingest": PY_ECHO_INGEST}, top_extra='affinity = "agent"')
    write_config(home.root, plugin="sticky")
    streams = {s.host: s for s in (new_stream(host="hostA", beat=True), new_stream(host="hostB", beat=True))}
    chosen = streams[bus.host_for("agent-7", ["hostA", "hostB"])]
    seen: list[bus.Job] = []

    def answer_one():  # the chosen host's worker: replies to the first job it reads, from whichever stream
        while not seen:
            for job in chosen.read(count=1, block_ms=200):
                seen.append(job)
                chosen.reply(job, bus.Reply.of({"echo": job.request}))
                chosen.ack(job)

    worker = threading.Thread(target=answer_one, daemon=True)
    worker.start()
    request = {"agent_id": "agent-7", "message": "m"}  # the caller decides the routing, as services/hooks.py does
    reply = bus.submit_and_wait_sync("hook", "ingest", request, 20, agent=affinity.agent_to_route(request))
    worker.join(5)
    assert reply.data() == {"echo": {"agent_id": "agent-7", "message": "m"}}
    (job,) = seen
    assert job.key[0] == chosen.host_stream  # the agent's host stream, not the shared one


def test_the_same_agent_keeps_its_host_while_others_come_and_go():
    hosts = [f"h{i}" for i in range(5)]
    agents = [f"agent-{i}" for i in range(200)]
    before = {a: bus.host_for(a, hosts) for a in agents}
    assert len(set(before.values())) == 5  # spread over every host
    after = {a: bus.host_for(a, hosts[:-1]) for a in agents}
    moved = {a for a in agents if before[a] != after[a]}
    assert moved == {a for a in agents if before[a] == "h4"}  # only the leaving host's agents move
    assert bus.host_for("x", []) is None


def test_a_live_worker_moves_a_dead_hosts_jobs_to_the_agents_new_host():
    dead = new_stream(host="hostDead")
    put("after_turn", {"agent_id": "a1"}, stream=dead.host_stream)
    read_id = put("ingest", {"agent_id": "a2"}, stream=dead.host_stream)
    assert [j.id for j in dead.read(count=1, block_ms=100) if j.key[0] == dead.host_stream]  # one read, then died
    forged = {"id": "f1", "kind": "hook", "hook": "after_turn", "request": json.dumps({"agent_id": "a3"}),
              "sig": "0" * 64}
    bus.client().xadd(dead.host_stream, forged)
    live = new_stream(host="hostLive", beat=True)

    assert live.rehome_dead_hosts() == 3
    r = bus.client()
    assert r.xlen(dead.host_stream) == 0 and pending(dead.host_stream) == 0
    moved = [bus.parse_job(e, f, stream=live.host_stream) for e, f in r.xrange(live.host_stream)]
    assert sorted(j.request["agent_id"] for j in moved if j.signed) == ["a1", "a2"]
    assert all(j.deliveries == 2 for j in moved if j.signed)  # checked against JobRecord before running again
    assert read_id in {j.id for j in moved}
    assert all(j.signed for j in moved)
    # the forged entry goes on as it came, to the shared stream, where a worker refuses and audits it
    (refused,) = [bus.parse_job(e, f) for e, f in r.xrange(bus.stream_key())]
    assert refused.id == "f1" and not refused.signed
    assert live.rehome_dead_hosts() == 0


def test_a_host_that_heartbeats_keeps_its_jobs():
    busy = new_stream(host="hostBusy", beat=True)
    put("after_turn", {"agent_id": "a1"}, stream=busy.host_stream)
    assert new_stream(host="hostOther", beat=True).rehome_dead_hosts() == 0
    assert bus.client().xlen(busy.host_stream) == 1


# ---- prewarm through the control stream ----

@pytest.fixture
def owner_api(client):
    token = create_token("t-owner", Role.OWNER)[1]

    def post(path, prefix="/api"):
        return client.post(prefix + path, HTTP_AUTHORIZATION=f"Bearer {token}")
    return post


@pytest.fixture
def control_worker(monkeypatch):
    """A worker's heartbeat and control thread (plugins_app/management/commands/worker.py), in this process, with
    warm start on whatever mode the suite runs in (it is asked to prewarm)."""
    monkeypatch.setenv("LIBREFANG_WARM_START", "1")
    loops = []

    def start(answering: bool = True) -> WorkerLoop:
        loop = WorkerLoop(new_stream(host=f"h-{uuid.uuid4().hex[:4]}", beat=True), 1)
        loops.append(loop)
        threading.Thread(target=WorkerCommand._beat, args=(loop, 1), daemon=True).start()
        if answering:
            threading.Thread(target=WorkerCommand._control, args=(loop,), name=_control_thread(loop),
                             daemon=True).start()
        return loop

    warmstart.shutdown()
    yield start
    for loop in loops:
        loop.stop.set()
        loop.finish()
    warmstart.shutdown()


def _control_thread(loop: WorkerLoop) -> str:
    return f"control-{loop.stream.consumer}"


def _reading_control(loop: WorkerLoop) -> bool:
    """The loop's control thread is in its read of the control stream (plugins_app/bus/control.py read_after)."""
    thread = next((t for t in threading.enumerate() if t.name == _control_thread(loop)), None)
    frame = sys._current_frames().get(thread.ident) if thread else None
    while frame is not None and frame.f_code is not control.read_after.__code__:
        frame = frame.f_back
    return frame is not None


def wait_for_control_reader(loop: WorkerLoop, *others: WorkerLoop) -> None:
    """Until `loop` reads the control stream (it reads requests made after its start only) and every worker named
    has a heartbeat (a prewarm waits for the workers that heartbeat as it asks)."""
    r = bus.client()
    wait_until(lambda: _reading_control(loop), 30, f"{_control_thread(loop)} reading the control stream")
    for worker in (loop, *others):
        key = bus.heartbeat_key(worker.stream.consumer)
        wait_until(lambda key=key: r.exists(key), 30, f"the heartbeat {key}")


def forge_prewarm_answer(worker: str) -> None:
    """Answer the next prewarm request in `worker`'s name, unsigned, as anyone with Redis access could."""
    r = bus.client()
    key = bus.prefixed_key("engine", "control")
    last = r.xrevrange(key, "+", "-", count=1)
    cursor = last[0][0] if last else "0-0"
    for _name, entries in r.xread({key: cursor}, block=5000) or []:
        for _entry_id, fields in entries:
            r.rpush(bus.prefixed_key("engine", "prewarm", fields["stamp"]),
                    json.dumps({"worker": worker, "plugins": [], "zygote_pids": [1], "error": ""}))


def test_prewarm_reports_the_zygotes_each_worker_confirmed_and_the_workers_that_did_not_answer(
        home, owner_api, control_worker, monkeypatch):
    make_plugin(home.plugins_dir, "warmme", {"ingest": PY_ECHO_INGEST, "after_turn": PY_ECHO_INGEST})
    make_plugin(home.plugins_dir, "shelly", {"ingest": "cat >/dev/null; echo '{}'\n"}, runtime="bash", ext="sh")
    monkeypatch.setattr(prewarm_service, "WAIT_SECS", 3.0)
    answering = control_worker()
    silent = control_worker(answering=False)
    wait_for_control_reader(answering, silent)
    assert warmstart.zygote_pids() == []

    forger = threading.Thread(target=forge_prewarm_answer, args=(silent.stream.consumer,), daemon=True)
    forger.start()
    r = owner_api("/plugins/warmme/prewarm", prefix="/api/v1")
    assert r.status_code == 200, r.content
    forger.join(5)
    body = r.json()
    assert body["plugins"] == ["warmme"] and body["warmed_everywhere"] is False
    (worker,) = body["workers"]
    assert worker["worker"] == answering.stream.consumer and worker["ok"] and worker["error"] == ""
    (plugin,) = worker["plugins"]
    assert sorted(plugin["warmed"]) == ["after_turn", "ingest"] and plugin["zygotes"] == 1
    assert worker["zygote_pids"] == warmstart.zygote_pids() != []
    assert [m["worker"] for m in body["missing"]] == [silent.stream.consumer]

    r = owner_api("/plugins/prewarm")
    assert r.status_code == 200, r.content
    (worker,) = r.json()["workers"]
    by_name = {p["plugin"]: p for p in worker["plugins"]}
    assert set(by_name) == {"shelly", "warmme"}
    assert by_name["shelly"]["warmed"] == [] and "nothing to warm" in by_name["shelly"]["skipped"]["ingest"]


def test_prewarm_refuses_a_disabled_or_unknown_plugin(home, owner_api):
    make_plugin(home.plugins_dir, "off", {"ingest": PY_ECHO_INGEST})
    (home.plugin_dir("off") / ".disabled").touch()
    r = owner_api("/plugins/off/prewarm")
    assert r.status_code == 409 and r.json()["error"]["code"] == "plugin_disabled"
    assert owner_api("/plugins/ghost/prewarm").status_code == 404
    r = owner_api("/plugins/prewarm")  # no worker alive: nothing is claimed
    assert r.status_code == 200 and r.json()["workers"] == [] and r.json()["warmed_everywhere"] is False


def test_prewarm_takes_librefangs_plugin_list_and_answers_per_plugin(home, client, control_worker, monkeypatch):
    make_plugin(home.plugins_dir, "warmme", {"ingest": PY_ECHO_INGEST})
    make_plugin(home.plugins_dir, "off", {"ingest": PY_ECHO_INGEST})
    (home.plugin_dir("off") / ".disabled").touch()
    monkeypatch.setattr(prewarm_service, "WAIT_SECS", 3.0)
    token = create_token("t-owner2", Role.OWNER)[1]
    worker = control_worker()
    wait_for_control_reader(worker)

    r = client.post("/api/plugins/prewarm", {"plugins": ["warmme", "ghost", "off"]}, content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["plugins"] == ["warmme"]  # only what can run was sent to the workers
    assert body["results"]["warmme"] == {"ok": True, "message": "pre-warmed on 1 worker(s)"}
    assert body["results"]["ghost"]["ok"] is False and "not installed" in body["results"]["ghost"]["message"]
    assert body["results"]["off"]["ok"] is False and "disabled" in body["results"]["off"]["message"]
    assert body["warmed_everywhere"] is False  # two of the three asked for were not warmed
    (answer,) = body["workers"]
    assert [p["plugin"] for p in answer["plugins"]] == ["warmme"] and answer["zygote_pids"] == warmstart.zygote_pids()

    r = client.post("/api/plugins/prewarm", {"plugins": "warmme"}, content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 400  # not a list: refused, nothing warmed


def test_the_plugin_page_button_and_the_cli_show_each_workers_answer(home, client, control_worker, monkeypatch):
    from django.contrib.auth.models import User
    from django.core.management.base import CommandError

    make_plugin(home.plugins_dir, "warmme", {"ingest": PY_ECHO_INGEST})
    monkeypatch.setattr(prewarm_service, "WAIT_SECS", 3.0)
    client.force_login(User.objects.create_user("staff", "", "pw", is_staff=True))
    assert client.post("/plugins/warmme/prewarm/").status_code == 403  # an admin may not: owner, as the API
    client.force_login(User.objects.create_superuser("boss", "", "pw"))
    assert 'id="parity-prewarm-form"' in client.get("/plugins/warmme/").content.decode()
    html = client.post("/plugins/warmme/prewarm/").content.decode()
    assert 'id="parity-prewarm-none"' in html and "nothing was warmed" in html

    loop = control_worker()
    silent = control_worker(answering=False)
    wait_for_control_reader(loop, silent)
    html = client.post("/plugins/warmme/prewarm/").content.decode()
    assert f'data-worker="{loop.stream.consumer}" data-state="warmed"' in html and "<code>ingest</code>" in html
    assert f'data-worker="{silent.stream.consumer}" data-state="missing"' in html

    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_:  # one worker did not answer: not warmed everywhere
        call_command("plugin", "prewarm", "warmme", "--wait", "2", stdout=out)
    assert exit_.value.code == 1
    text = out.getvalue()
    assert f"({loop.stream.consumer}): zygotes [" in text and "warmme: warmed ingest" in text
    assert f"({silent.stream.consumer}): no answer, not warmed" in text
    with pytest.raises(CommandError) as err:
        call_command("plugin", "prewarm", "ghost")
    assert err.value.returncode == 3


# ---- outcomes off the job's thread ----

def test_the_outcome_writer_stores_then_acks_and_keeps_the_acks_while_redis_is_away():
    import redis

    from plugins_app.services import jobs

    stream = new_stream()
    ids = [put("after_turn", {"agent_id": f"a{i}"}) for i in range(3)]
    batch = stream.read(count=10, block_ms=200)
    writer = jobs.OutcomeWriter(stream)
    for job in batch[:2]:
        assert jobs.finish(job, stream, JobRecord.State.DONE, "src", "", writer) == JobRecord.State.DONE
    writer.close()
    assert set(JobRecord.objects.values_list("job_id", flat=True)) == set(ids[:2])
    assert pending(stream.stream) == 1 and {j.key for j in batch[2:]} == stream.holding

    stream.r = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)  # Redis is gone
    writer = jobs.OutcomeWriter(stream)
    jobs.finish(batch[2], stream, JobRecord.State.DONE, "src", "", writer)
    writer.close()
    assert JobRecord.objects.filter(job_id=ids[2]).exists() and stream.deferred_count() == 1
    stream.r = bus.client()
    stream.flush_deferred()
    assert pending(stream.stream) == 0 and not stream.holding


def test_outcomes_finished_within_the_linger_share_one_insert_and_one_ack(monkeypatch):
    from plugins_app.services import jobs

    monkeypatch.setattr(jobs.OutcomeWriter, "LINGER_SECS", 1.0)  # far longer than two finishes take
    stream = new_stream()
    ids = [put("after_turn", {"agent_id": f"a{i}"}) for i in range(2)]
    batch = stream.read(count=10, block_ms=200)
    sizes, acks = [], []
    real_insert, real_ack = JobRecord.objects.bulk_create, stream.ack_many
    monkeypatch.setattr(JobRecord.objects, "bulk_create", lambda rows, **kw: sizes.append(len(rows))
                        or real_insert(rows, **kw))
    monkeypatch.setattr(stream, "ack_many", lambda done: acks.append(len(done)) or real_ack(done))
    writer = jobs.OutcomeWriter(stream)
    for job in batch:
        jobs.finish(job, stream, JobRecord.State.DONE, "src", "", writer)
    writer.close()
    assert sizes == [2] and acks == [2]
    assert set(JobRecord.objects.values_list("job_id", flat=True)) == set(ids) and pending(stream.stream) == 0


def test_a_job_is_acknowledged_only_once_its_traces_are_stored(home, monkeypatch):
    """A worker killed after a job's ack and before its trace's INSERT loses the trace for good (an acked job is
    never delivered again): the outcome writer must wait for the job's traces."""
    from plugins_app.models import HookTrace

    make_plugin(home.plugins_dir, "counter", {"after_turn": COUNTING_AFTER_TURN})
    write_config(home.root, plugin="counter")
    ids = {put("after_turn", {"agent_id": f"a{i}", "messages": [{"role": "user", "content": "hi"}]})
           for i in range(40)}
    stream = new_stream()
    loop = WorkerLoop(stream, 8)
    untraced_at_ack: list[str] = []
    real_ack = stream.ack_many

    def ack_many(done):
        traced = set(HookTrace.objects.filter(job_id__in=[j.id for j in done]).values_list("job_id", flat=True))
        untraced_at_ack.extend(j.id for j in done if j.id not in traced)
        return real_ack(done)

    monkeypatch.setattr(stream, "ack_many", ack_many)
    end = time.monotonic() + 60
    while JobRecord.objects.filter(job_id__in=ids).count() < len(ids) and time.monotonic() < end:
        loop.cycle(block_ms=100)
    loop.finish()
    assert JobRecord.objects.filter(job_id__in=ids, state=JobRecord.State.DONE).count() == len(ids)
    assert untraced_at_ack == [], f"{len(untraced_at_ack)} of {len(ids)} jobs acked before their trace was stored"
