"""What a worker spends per job besides running the hook: CPU (time.process_time, this process and its threads)
and wall time of each step, over N jobs, against real Redis and a real SQLite database.

Steps, in the order plugins_app/services/jobs.py takes them: XREADGROUP (one job per read, as a worker with free
slots reads them as they come) with the signature check, the connection check (plugins_app/services/connections.py
refresh_connections), the reply (list + publish), and the outcome: JobRecord insert then XACK + XDEL, either per job
on the job's thread (`inline`) or handed to the outcome writer (`batched`, plugins_app/services/jobs.py
OutcomeWriter), whose thread's CPU is counted too.

    .venv/bin/python bench/worker_bookkeeping.py [jobs]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def setup(tmp: Path) -> None:
    os.environ.update({"DJANGO_SETTINGS_MODULE": "librefang_site.settings", "LIBREFANG_HOME": str(tmp / "home"),
                       "LIBREFANG_DB": str(tmp / "bench.sqlite3"),
                       "LIBREFANG_REDIS_PREFIX": f"lfbench-{uuid.uuid4().hex[:8]}"})
    os.environ.pop("DATABASE_URL", None)
    (tmp / "home").mkdir()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)


def put_jobs(n: int) -> None:
    from plugins_app import bus

    r = bus.client()
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        _, fields = bus.job_fields("hook", "after_turn", {"agent_id": f"a{i % 7}", "messages": []}, 60, True)
        pipe.xadd(bus.stream_key(), fields)
    pipe.execute()


def run(n: int, mode: str) -> dict:
    from plugins_app import bus
    from plugins_app.models import JobRecord
    from plugins_app.services import jobs
    from plugins_app.services.connections import refresh_connections

    stream = bus.JobStream(consumer=f"bench-{mode}-{uuid.uuid4().hex[:6]}")
    stream.ensure_group()
    put_jobs(n)
    writer = jobs.OutcomeWriter(stream) if mode == "batched" else None
    steps = ("read+verify", "refresh_connections", "reply", "outcome (record + ack)")
    cpu = dict.fromkeys(steps, 0.0)
    wall = dict.fromkeys(steps, 0.0)
    payload = {"ok": True, "source": "bench", "reply": {"type": "ok"}}
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for _ in range(n):
        marks = [(time.process_time(), time.perf_counter())]
        (job,) = stream.read(count=1, block_ms=1000)
        assert job.signed
        marks.append((time.process_time(), time.perf_counter()))
        refresh_connections()
        marks.append((time.process_time(), time.perf_counter()))
        stream.reply(job, bus.Reply.of(payload))
        marks.append((time.process_time(), time.perf_counter()))
        jobs.finish(job, stream, JobRecord.State.DONE, "bench", "", writer)
        marks.append((time.process_time(), time.perf_counter()))
        for step, (a, b) in zip(steps, zip(marks, marks[1:], strict=False), strict=True):
            cpu[step] += b[0] - a[0]
            wall[step] += b[1] - a[1]
    if writer is not None:
        writer.close()
    total_cpu, total_wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    assert JobRecord.objects.filter(worker=stream.consumer).count() == n
    assert bus.client().xlen(bus.stream_key()) == 0
    return {"mode": mode, "jobs": n,
            "cpu_ms_per_job": {k: round(v * 1000 / n, 3) for k, v in cpu.items()},
            "wall_ms_per_job_on_job_thread": {k: round(v * 1000 / n, 3) for k, v in wall.items()},
            "total_cpu_ms_per_job": round(total_cpu * 1000 / n, 3),
            "total_wall_ms_per_job": round(total_wall * 1000 / n, 3)}


def main(n: int = 1000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        setup(Path(tmp))
        results = [run(n, mode) for mode in ("inline", "batched", "inline", "batched")]
        print(json.dumps({"loadavg": os.getloadavg(), "results": results}, indent=1))
        from plugins_app import bus

        r = bus.client()
        for key in r.scan_iter(match=os.environ["LIBREFANG_REDIS_PREFIX"] + ":*"):
            r.delete(key)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
