"""The worker loop in steps (`librefang worker`, plugins_app/management/commands/worker.py).

`read_once` takes up to the free slots' worth of new jobs and starts them; `reclaim_once` takes up jobs pending on
dead workers, our own lost deliveries, and moves the jobs of dead hosts (agent affinity, plugins_app/bus/affinity.py);
`cycle` is one turn of the loop. Each step raises what Redis raises: the caller (run, or a test) decides to back off.
Jobs run on a thread pool of `concurrency` threads; a semaphore of as many slots keeps the loop from reading more
than it can start.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable

from plugins_app.bus import REDIS_DOWN, Job, JobStream
from plugins_app.services import jobs
from plugins_app.services.engine import invocation_sink

log = logging.getLogger("librefang.worker")
RECLAIM_EVERY_SECS = 5.0
BACKOFF_FIRST_SECS = 0.1
BACKOFF_MAX_SECS = 2.0
SLOT_WAIT_SECS = 0.5


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


class WorkerLoop:
    def __init__(self, stream: JobStream, concurrency: int,
                 process: Callable[[Job, JobStream], str] | None = None):
        self.stream = stream
        self.concurrency = concurrency
        # Outcomes (JobRecord + ack) leave the job's thread once its reply is out (services/jobs.py OutcomeWriter).
        self.outcomes = jobs.OutcomeWriter(stream, traces=invocation_sink()) if process is None else None
        self.process = process or functools.partial(jobs.process, outcomes=self.outcomes)
        self.stop = threading.Event()
        self.stats = {"processed": 0, "inflight": 0, "started_at": time.time(), "last_read_at": None}
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(concurrency)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="job")
        self.group_ready = False
        self.last_reclaim = 0.0

    # ---- steps ----

    def prepare(self) -> None:
        """Create the consumer groups (once, and again after Redis came back empty) and send outcomes kept during
        an outage."""
        if not self.group_ready:
            self.stream.ensure_group()
            self.group_ready = True
        self.stream.flush_deferred()

    def reclaim_once(self) -> int:
        """Take up pending jobs of dead workers, lost deliveries and stuck jobs; move dead hosts' jobs to live
        hosts. Returns how many jobs this worker started."""
        self.last_reclaim = time.monotonic()
        moved = self.stream.rehome_dead_hosts()
        if moved:
            log.warning("moved %d job(s) of worker hosts that stopped heartbeating", moved)
        claimed = self.stream.reclaim()
        if claimed:
            log.warning("took up %d pending job(s) (dead workers or lost deliveries)", len(claimed))
        started = 0
        for job in claimed:
            if self._acquire_slot():
                self._submit(job)
                started += 1
            else:
                self.stream.release(job)  # stopping: left pending for another worker
        return started

    def read_once(self, block_ms: int = 1000) -> int:
        """Read as many new jobs as there are free slots (waiting up to `block_ms` for one) and start them.
        Returns how many started."""
        if not self.slots.acquire(timeout=SLOT_WAIT_SECS):
            return 0
        free = 1
        while free < self.concurrency and self.slots.acquire(blocking=False):
            free += 1
        try:
            batch = self.stream.read(count=free, block_ms=block_ms)
        except BaseException:
            for _ in range(free):  # give every slot back, or the worker wedges for good
                self.slots.release()
            raise
        with self.lock:
            self.stats["last_read_at"] = time.time()
        for _ in range(free - len(batch)):
            self.slots.release()
        for i, job in enumerate(batch):
            # Two streams may answer one read with up to `free` jobs each: the extra ones wait for a slot here.
            if i >= free and not self._acquire_slot():
                self.stream.release(job)
                continue
            self._submit(job)
        return len(batch)

    def cycle(self, block_ms: int = 1000) -> int:
        """One turn: prepare, reclaim when due, read. Returns how many jobs started."""
        self.prepare()
        started = 0
        if time.monotonic() - self.last_reclaim > RECLAIM_EVERY_SECS:
            started += self.reclaim_once()
        return started + self.read_once(block_ms)

    def run(self) -> None:
        """Cycle until stopped, backing off while Redis is unreachable."""
        backoff = Backoff("worker loop")
        while not self.stop.is_set():
            try:
                self.cycle()
                backoff.ok()
            except REDIS_DOWN as exc:
                self.stop.wait(backoff.failed(exc))
            except Exception as exc:
                log.exception("worker loop error")
                self.stop.wait(backoff.failed(exc))

    def finish(self) -> None:
        """Wait for the jobs in flight and their outcomes, then send what Redis could not take."""
        self.pool.shutdown(wait=True)
        if self.outcomes is not None:
            self.outcomes.close()
        try:
            self.stream.flush_deferred()
        except REDIS_DOWN:
            log.warning("Redis unreachable at shutdown: %d outcome(s) left for redelivery",
                        self.stream.deferred_count())

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.stats)

    # ---- running jobs ----

    def _run(self, job: Job) -> None:
        try:
            self.process(job, self.stream)
        except Exception:
            log.exception("job %s crashed; it stays pending and will be retried", job.id)
            self.stream.release(job)
        finally:
            with self.lock:
                self.stats["inflight"] -= 1
                self.stats["processed"] += 1
            self.slots.release()

    def _submit(self, job: Job) -> None:
        with self.lock:
            self.stats["inflight"] += 1
        self.pool.submit(self._run, job)

    def _acquire_slot(self) -> bool:
        while not self.slots.acquire(timeout=SLOT_WAIT_SECS):
            if self.stop.is_set():
                return False
        return True
