"""`librefang worker`: consume hook jobs from the Redis Stream and run them through the engine.

A thin loop around plain functions (services.jobs.process): read up to `concurrency` jobs, run each on a thread,
heartbeat so other workers know we are alive, and claim the pending jobs of workers that died.

Redis may go away at any moment: every step here survives it. A failed read gives its slots back, the loop waits
with a capped backoff (0.1 s doubling to 2 s) and resumes by itself; replies and acks of jobs finished meanwhile are
kept and sent when Redis is back (plugins_app/bus.py, JobStream.flush_deferred).
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

from engine.plugins.bundles import cache_usage
from plugins_app import events
from plugins_app.bus import REDIS_DOWN, JobStream
from plugins_app.services import bundles, jobs
from plugins_app.services.engine import get_engine, invocation_sink

log = logging.getLogger("librefang.worker")
RECLAIM_EVERY_SECS = 5.0
HEARTBEAT_EVERY_SECS = 2.0
BACKOFF_FIRST_SECS = 0.1
BACKOFF_MAX_SECS = 2.0


class Backoff:
    """Capped exponential backoff that logs once per outage, not once per attempt."""

    def __init__(self, what: str):
        self.what = what
        self.delay = 0.0

    def failed(self, exc: BaseException) -> float:
        if not self.delay:
            log.warning("%s: Redis unreachable (%s: %s); retrying", self.what, type(exc).__name__, exc)
        self.delay = min(BACKOFF_MAX_SECS, self.delay * 2 or BACKOFF_FIRST_SECS)
        return self.delay

    def ok(self) -> None:
        if self.delay:
            log.warning("%s: Redis is back", self.what)
        self.delay = 0.0


def _load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


class _BundleCacheUsage:
    """Size of this host's bundle cache for the heartbeat: re-measured (a walk of the tree) when the list of
    bundles changes, and at least every 60 s."""

    EVERY_SECS = 60.0

    def __init__(self) -> None:
        self._at = 0.0
        self._names: list[str] | None = None
        self._value: dict = {}

    def usage(self) -> dict:
        root = bundles.cache_root()
        try:
            names = sorted(os.listdir(root))
        except OSError:
            names = []
        if names != self._names or time.monotonic() - self._at > self.EVERY_SECS:
            self._value = cache_usage(root)
            self._names, self._at = names, time.monotonic()
        return self._value


class Command(BaseCommand):
    help = "Run a hook worker: consume jobs from Redis and run plugin hooks."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int,
                            default=int(os.environ.get("LIBREFANG_WORKER_CONCURRENCY", "16")),
                            help="jobs run at the same time (default 16, env LIBREFANG_WORKER_CONCURRENCY)")
        parser.add_argument("--name", default=None, help="consumer name (default host-pid-random)")

    def handle(self, *args, concurrency: int, name: str | None, **options):
        stream = JobStream(consumer=name)
        stop = threading.Event()
        stats = {"processed": 0, "inflight": 0, "started_at": time.time(), "last_read_at": None}
        lock = threading.Lock()

        def on_signal(signum, frame):
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        bundle_cache = _BundleCacheUsage()

        def beat() -> None:
            backoff = Backoff("heartbeat")
            while not stop.is_set():
                try:
                    with lock:
                        info = dict(stats)
                    stream.heartbeat({"pid": os.getpid(), "host": socket.gethostname(), **info,
                                      "concurrency": concurrency, "deferred": stream.deferred_count(),
                                      "load": _load_average(), "bundle_cache": bundle_cache.usage()})
                    backoff.ok()
                    stop.wait(HEARTBEAT_EVERY_SECS)
                except REDIS_DOWN as exc:
                    stop.wait(backoff.failed(exc))
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
                stream.release(job)
            finally:
                with lock:
                    stats["inflight"] -= 1
                    stats["processed"] += 1
                slots.release()

        def submit(job) -> None:
            with lock:
                stats["inflight"] += 1
            pool.submit(run, job)

        def acquire_slot() -> bool:
            while not slots.acquire(timeout=0.5):
                if stop.is_set():
                    return False
            return True

        self.stdout.write(f"worker {stream.consumer} ready (concurrency {concurrency})")
        self.stdout.flush()
        backoff = Backoff("worker loop")
        last_reclaim = 0.0
        group_ready = False
        while not stop.is_set():
            try:
                if not group_ready:
                    stream.ensure_group()
                    group_ready = True
                stream.flush_deferred()
                if time.monotonic() - last_reclaim > RECLAIM_EVERY_SECS:
                    claimed = stream.reclaim()
                    last_reclaim = time.monotonic()
                    if claimed:
                        log.warning("took up %d pending job(s) (dead workers or lost deliveries)", len(claimed))
                    for job in claimed:
                        if acquire_slot():
                            submit(job)
                        else:
                            stream.release(job)  # stopping: left pending for another worker
                if not slots.acquire(timeout=0.5):
                    continue
                free = 1
                while free < concurrency and slots.acquire(blocking=False):
                    free += 1
                try:
                    batch = stream.read(count=free, block_ms=1000)
                except BaseException:
                    for _ in range(free):  # give every slot back, or the worker wedges for good
                        slots.release()
                    raise
                with lock:
                    stats["last_read_at"] = time.time()
                for _ in range(free - len(batch)):
                    slots.release()
                for job in batch:
                    submit(job)
                backoff.ok()
            except REDIS_DOWN as exc:
                stop.wait(backoff.failed(exc))
            except Exception as exc:
                log.exception("worker loop error")
                stop.wait(backoff.failed(exc))
        self.stdout.write("worker stopping: finishing jobs in flight")
        pool.shutdown(wait=True)
        try:
            stream.flush_deferred()
        except REDIS_DOWN:
            log.warning("Redis unreachable at shutdown: %d outcome(s) left for redelivery", stream.deferred_count())
        invocation_sink().flush()
        events.publisher().flush()
        try:
            stream.retire()
        except REDIS_DOWN:
            pass
