"""`librefang worker`: consume hook jobs from the Redis Stream and run them through the engine.

A thin loop around plain functions (services.jobs.process): read up to `concurrency` jobs, run each on a thread,
heartbeat so other workers know we are alive, and claim the pending jobs of workers that died.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import socket
import threading
import time

from django.core.management.base import BaseCommand

from plugins_app import events
from plugins_app.bus import JobStream
from plugins_app.services import jobs
from plugins_app.services.engine import get_engine, invocation_sink

log = logging.getLogger("librefang.worker")
RECLAIM_EVERY_SECS = 5.0
HEARTBEAT_EVERY_SECS = 2.0


class Command(BaseCommand):
    help = "Run a hook worker: consume jobs from Redis and run plugin hooks."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int,
                            default=int(os.environ.get("LIBREFANG_WORKER_CONCURRENCY", "16")),
                            help="jobs run at the same time (default 16)")
        parser.add_argument("--name", default=None, help="consumer name (default host-pid-random)")

    def handle(self, *args, concurrency: int, name: str | None, **options):
        stream = JobStream(consumer=name)
        stream.ensure_group()
        stop = threading.Event()
        stats = {"processed": 0, "inflight": 0, "started_at": time.time()}
        lock = threading.Lock()

        def on_signal(signum, frame):
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        def beat() -> None:
            while not stop.is_set():
                try:
                    with lock:
                        info = dict(stats)
                    stream.heartbeat({"pid": os.getpid(), "host": socket.gethostname(), **info,
                                      "concurrency": concurrency})
                except Exception:
                    log.warning("heartbeat failed", exc_info=True)
                stop.wait(HEARTBEAT_EVERY_SECS)

        get_engine()  # build caches before the first job
        threading.Thread(target=beat, name="heartbeat", daemon=True).start()
        slots = threading.BoundedSemaphore(concurrency)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="job")

        def run(job) -> None:
            try:
                jobs.process(job, stream)
            except Exception:
                log.exception("job %s crashed; it stays pending and will be retried", job.id)
            finally:
                with lock:
                    stats["inflight"] -= 1
                    stats["processed"] += 1
                slots.release()

        def submit(batch) -> None:
            for job in batch:
                with lock:
                    stats["inflight"] += 1
                pool.submit(run, job)

        self.stdout.write(f"worker {stream.consumer} ready (concurrency {concurrency})")
        self.stdout.flush()
        last_reclaim = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() - last_reclaim > RECLAIM_EVERY_SECS:
                    last_reclaim = time.monotonic()
                    claimed = stream.reclaim()
                    if claimed:
                        log.warning("claimed %d pending job(s) of dead workers", len(claimed))
                        for job in claimed:
                            slots.acquire()
                            submit([job])
                if not slots.acquire(timeout=0.5):
                    continue
                free = 1
                while free < concurrency and slots.acquire(blocking=False):
                    free += 1
                batch = stream.read(count=free, block_ms=1000)
                for _ in range(free - len(batch)):
                    slots.release()
                submit(batch)
            except Exception:
                log.exception("worker loop error; retrying in 1s")
                stop.wait(1.0)
        self.stdout.write("worker stopping: finishing jobs in flight")
        pool.shutdown(wait=True)
        invocation_sink().flush()
        events.publisher().flush()
        stream.retire()
