"""What the worker's own code spends on one ingest job besides `engine.invoke.invoke` (the bench's "engine warm"
figure), against real Redis and a real SQLite database, with plugin `bench_py` (the reflect hook) configured as in
`make bench`. See bench/README.md ("The worker's job path").

Each job is signed and queued as the web tier queues it (reply channel included), read with XREADGROUP, and run by
plugins_app/services/jobs.py `process` with the worker's outcome writer. Per job, on the job's thread:

- read:  XREADGROUP + parse + signature check
- pre:   `process` starts → `invoke` starts (connection check, engine view, enabled check, normalise, chain, filters)
- post:  `invoke` returns → the reply is handed to Redis (default recall, merge, reply shaping, JSON)
- reply: the reply's MULTI (RPUSH + EXPIRE + PUBLISH)
- tail:  reply sent → `process` returns (outcome handed to the writer)

`--stub` replaces the hook's process (the runtime engine/invoke.py `runtime_for` picks) by an instant echo, so CPU per
job is our code alone (all threads: the job's, the outcome writer's, the invocation writer's); without it the warm
hook runs.

    .venv/bin/python bench/worker_job.py [jobs] [--stub] [--rounds R]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REQUEST = {"agent_id": "bench", "message": "what did we decide about the launch date?", "peer_id": "u1"}


def setup(tmp: Path) -> None:
    home = tmp / "home"
    os.environ.update({"DJANGO_SETTINGS_MODULE": "librefang_site.settings", "LIBREFANG_HOME": str(home),
                       "LIBREFANG_DB": str(tmp / "bench.sqlite3"),
                       "LIBREFANG_REDIS_PREFIX": f"lfbench-{uuid.uuid4().hex[:8]}"})
    os.environ.pop("DATABASE_URL", None)
    hooks = home / "plugins" / "bench_py" / "hooks"
    hooks.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fixtures" / "wasm" / "reflect.py", hooks / "ingest.py")
    (hooks.parent / "plugin.toml").write_text('name = "bench_py"\nversion = "0.1.0"\n\n[hooks]\nruntime = "python"\n'
                                              'ingest = "hooks/ingest.py"\nhook_timeout_secs = 60\n')
    import django

    django.setup()
    from django.core.management import call_command

    from tests.plugin_factory import write_config

    write_config(home, plugin="bench_py")
    call_command("migrate", "--noinput", verbosity=0)


def run(n: int, stub: bool) -> dict:
    import engine.invoke
    import engine.stack
    from engine.process.hook_call import HookResult
    from plugins_app import bus
    from plugins_app.bus.keys import reply_channel_prefix
    from plugins_app.services import jobs

    marks: dict[str, float] = {}
    real_invoke, real_runtime_for = engine.stack.invoke, engine.invoke.runtime_for

    def timed_invoke(*args, **kw):
        marks["invoke0"], marks["invoke0_cpu"] = time.perf_counter(), time.thread_time()
        try:
            return real_invoke(*args, **kw)
        finally:
            marks["invoke1"], marks["invoke1_cpu"] = time.perf_counter(), time.thread_time()

    class Echo:
        name = "echo"

        def run(self, call, on_stderr=None):
            return HookResult(True, reply=dict(call.request))

    stream = bus.JobStream(consumer=f"bench-{uuid.uuid4().hex[:6]}")
    real_send = stream._send_reply

    def timed_send(job, data):
        marks["reply0"] = time.perf_counter()
        real_send(job, data)
        marks["reply1"] = time.perf_counter()

    stream._send_reply = timed_send
    stream.ensure_group()
    writer = jobs.OutcomeWriter(stream)
    r = bus.client()
    channel = reply_channel_prefix() + "bench"
    steps = ("read", "pre", "post", "reply", "tail")
    per: dict[str, list[float]] = {s: [] for s in steps}
    outside, outside_cpu = [], []
    engine.stack.invoke = timed_invoke
    if stub:
        engine.invoke.runtime_for = lambda call: Echo()
    try:
        for i in range(n + 20):  # the first 20 warm up (zygote, caches, connections) and are not counted
            _, fields = bus.job_fields("hook", "ingest", dict(REQUEST), 60, True, reply_to=channel)
            r.xadd(bus.stream_key(), fields)
            t0 = time.perf_counter()
            (job,) = stream.read(count=1, block_ms=1000)
            t1, c1 = time.perf_counter(), time.thread_time()
            state = jobs.process(job, stream, writer)
            t2, c2 = time.perf_counter(), time.thread_time()
            assert state == "done", state
            if i < 20:
                continue
            m = marks
            for step, (a, b) in zip(steps, [(t0, t1), (t1, m["invoke0"]), (m["invoke1"], m["reply0"]),
                                             (m["reply0"], m["reply1"]), (m["reply1"], t2)], strict=True):
                per[step].append((b - a) * 1000)
            outside.append(((t2 - t1) - (m["invoke1"] - m["invoke0"])) * 1000)
            outside_cpu.append(((c2 - c1) - (m["invoke1_cpu"] - m["invoke0_cpu"])) * 1000)
        cpu0 = time.process_time()
        wall0 = time.perf_counter()
        for _ in range(n):  # all threads' CPU, with the outcome and invocation writers settled after the loop
            _, fields = bus.job_fields("hook", "ingest", dict(REQUEST), 60, True, reply_to=channel)
            r.xadd(bus.stream_key(), fields)
            (job,) = stream.read(count=1, block_ms=1000)
            jobs.process(job, stream, writer)
        writer.close()
        from plugins_app.services.engine import invocation_sink

        invocation_sink().flush()
        cpu_all = (time.process_time() - cpu0) * 1000 / n
        wall_all = (time.perf_counter() - wall0) * 1000 / n
    finally:
        engine.stack.invoke, engine.invoke.runtime_for = real_invoke, real_runtime_for
    return {"mode": "stub" if stub else "warm hook", "jobs": n,
            "p50_ms": {s: round(statistics.median(v), 3) for s, v in per.items()},
            "outside_invoke_p50_ms": round(statistics.median(outside), 3),
            "outside_invoke_thread_cpu_p50_ms": round(statistics.median(outside_cpu), 3),
            "loop_all_threads_cpu_ms_per_job": round(cpu_all, 3), "loop_wall_ms_per_job": round(wall_all, 3)}


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 300
    stub = "--stub" in sys.argv
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 1
    with tempfile.TemporaryDirectory(prefix="lf-workerjob-") as tmp:
        setup(Path(tmp))
        try:
            results = [run(n, stub) for _ in range(rounds)]
        finally:
            from plugins_app import bus

            r = bus.client()
            for key in r.scan_iter(match=os.environ["LIBREFANG_REDIS_PREFIX"] + ":*"):
                r.delete(key)
            from engine.process import warmstart

            warmstart.shutdown()
    print(json.dumps({"loadavg": os.getloadavg(), "results": results}, indent=1))


def _own_mounts() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import mount_namespace

    mount_namespace.enter()


if __name__ == "__main__":
    _own_mounts()  # the data disks its homes get stay in its own mount namespace (tests/mount_namespace.py)
    main()
