"""`librefang worker`: consume hook jobs from the Redis Stream and run them through the engine.

The loop itself is plugins_app/services/worker_loop.py (read_once, reclaim_once, cycle); this command adds the
heartbeat thread (so other workers know we are alive, and which host we are for agent affinity) and the control
thread (prewarm requests, plugins_app/services/prewarm_worker.py). `--once` runs one reclaim + read cycle, waits for the
jobs it started and exits.

Redis may go away at any moment: every step here survives it. A failed read gives its slots back, the loop waits
with a capped backoff (0.1 s doubling to 2 s) and resumes by itself; replies and acks of jobs finished meanwhile are
kept and sent when Redis is back (plugins_app/bus/stream.py, JobStream.flush_deferred).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from engine.plugins.bundles import cache_usage
from engine.process import sandbox, warmstart
from plugins_app import events
from plugins_app.bus import REDIS_DOWN, JobStream, worker_host_id
from plugins_app.services import audit, bundles, data_disks, prewarm_worker
from plugins_app.services.engine import get_engine, invocation_sink
from plugins_app.services.worker_loop import Backoff, WorkerLoop

log = logging.getLogger("librefang.worker")
HEARTBEAT_EVERY_SECS = 2.0
CONTROL_BLOCK_MS = 1000


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
        parser.add_argument("--once", action="store_true",
                            help="run one reclaim + read cycle, wait for the jobs it started, and exit")

    def handle(self, *args, concurrency: int, name: str | None, once: bool = False, **options):
        stream = JobStream(consumer=name, host=worker_host_id(settings.LIBREFANG_HOME))
        loop = WorkerLoop(stream, concurrency)

        def on_signal(signum, frame):
            loop.stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        data_disks.mount_installed()  # what plugins kept, where the service looks (plugins_app/services/data_disks.py)
        get_engine()  # build caches before the first job
        # Start-up's objects live as long as the worker: out of the cyclic collector, so a full collection (the GIL
        # held, hooks waiting) walks only what came after, not every object start-up made (see librefang_site/web.py).
        gc.collect()
        gc.freeze()
        threading.Thread(target=self._beat, args=(loop, concurrency), name="heartbeat", daemon=True).start()
        if not once:
            threading.Thread(target=self._control, args=(loop,), name="control", daemon=True).start()
        try:  # a marker on the dashboard's charts (plugins_app/selectors/metrics.py markers)
            audit.record(f"worker:{stream.consumer}", "worker.start", socket.gethostname(),
                         details={"pid": os.getpid()})
        except Exception:  # the database may be down: the worker serves anyway
            log.warning("could not record the worker's start", exc_info=True)
        self.stdout.write(f"worker {stream.consumer} ready (concurrency {concurrency}, host {stream.host})")
        self.stdout.flush()
        if once:
            started = 0
            try:
                loop.prepare()
                started = loop.reclaim_once() + loop.read_once(block_ms=1000)
            except REDIS_DOWN as exc:
                log.warning("worker --once: Redis unreachable (%s)", exc)
            self.stdout.write(f"worker --once: {started} job(s) started")
        else:
            loop.run()
            self.stdout.write("worker stopping: finishing jobs in flight")
        loop.finish()
        loop.stop.set()
        invocation_sink().flush()
        events.publisher().flush()
        try:
            stream.retire()
        except REDIS_DOWN:
            pass

    @staticmethod
    def _beat(loop: WorkerLoop, concurrency: int) -> None:
        stream, bundle_cache = loop.stream, _BundleCacheUsage()
        backoff = Backoff("heartbeat")
        while not loop.stop.is_set():
            try:
                stream.heartbeat({"pid": os.getpid(), "host": socket.gethostname(), **loop.snapshot(),
                                  "concurrency": concurrency, "deferred": stream.deferred_count(),
                                  "load": _load_average(), "bundle_cache": bundle_cache.usage(),
                                  "zygote_pids": warmstart.zygote_pids(),
                                  "sandbox_degraded": sandbox.degraded_reasons()})
                backoff.ok()
                loop.stop.wait(HEARTBEAT_EVERY_SECS)
            except REDIS_DOWN as exc:
                loop.stop.wait(backoff.failed(exc))
            except Exception:
                log.warning("heartbeat failed", exc_info=True)
                loop.stop.wait(HEARTBEAT_EVERY_SECS)

    @staticmethod
    def _control(loop: WorkerLoop) -> None:
        """Prewarm requests: every worker reads every request posted after it started, warms, answers."""
        stream = loop.stream
        backoff = Backoff("control")
        cursor = None
        while not loop.stop.is_set():
            try:
                if cursor is None:
                    cursor = stream.control_cursor()
                cursor, entries = stream.read_control(cursor, CONTROL_BLOCK_MS)
                backoff.ok()
                for fields in entries:
                    if fields.get("kind") == "prewarm" and fields.get("stamp"):
                        started = time.monotonic()
                        answer = prewarm_worker.warm_here(fields)
                        log.info("prewarm %s: %.0f ms", fields["stamp"][:8], (time.monotonic() - started) * 1000)
                        stream.answer_prewarm(fields["stamp"], answer)
            except REDIS_DOWN as exc:
                loop.stop.wait(backoff.failed(exc))
            except Exception:
                log.warning("control read failed", exc_info=True)
                loop.stop.wait(HEARTBEAT_EVERY_SECS)
