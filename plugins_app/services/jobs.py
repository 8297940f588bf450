"""What a worker does with one job from the bus. Kept as plain functions so tests can call them directly.

The reply goes out as soon as the hook has answered; the outcome (a JobRecord row, then XACK + XDEL) comes after
it, either on the job's thread or, in the worker, through the OutcomeWriter: one thread that stores the outcomes of
whatever jobs finished meanwhile in one INSERT and acks them in one Redis round trip (bench/worker_bookkeeping.py
has the numbers). Either way a job is acked only once its outcome is stored: a crash in between leaves it pending,
and its redelivery finds the JobRecord.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from django.db import IntegrityError

from engine import protocol as P
from engine.plugins.bundles import BundleError
from engine.ports import CURRENT_ORIGIN
from plugins_app.batching import take_lingering
from plugins_app.bus import SEEN_WINDOW_SECS, Job, JobStream, Reply
from plugins_app.models import JobRecord
from plugins_app.services import audit
from plugins_app.services.connections import refresh_connections
from plugins_app.services.engine import engine_for_job
from plugins_app.services.recording import DbInvocationSink

if TYPE_CHECKING:
    from engine.stack import EngineReply

log = logging.getLogger("librefang.worker")


# A job that crashed its worker this many times is recorded as failed instead of being tried forever.
MAX_DELIVERIES = 5
REJECTED = "rejected"


def process(job: Job, stream: JobStream, outcomes: OutcomeWriter | None = None) -> str:
    """Run a job, reply if asked, store its outcome, then XACK (through `outcomes` when given). Returns the outcome
    state."""
    refresh_connections()
    if not job.signed:
        # Anything on the stream we did not sign (forged by whoever reached Redis, or tampered with) never runs.
        return _reject(job, stream, "signature missing or invalid")
    if job.replay:
        # The same signed job XADDed again: another entry claimed this job id first (plugins_app/bus/replay.py).
        return _reject(job, stream, "replay: another stream entry already carried this job id", "bus.job_replayed")
    if job.deliveries > MAX_DELIVERIES and not JobRecord.objects.filter(job_id=job.id).exists():
        return finish(job, stream, JobRecord.State.FAILED, "", f"gave up after {job.deliveries - 1} deliveries",
                      outcomes)
    if (job.deliveries > 1 or time.time() - job.enqueued_at > SEEN_WINDOW_SECS) \
            and JobRecord.objects.filter(job_id=job.id).exists():
        # Delivered again after a crash between storing the outcome and XACK, or older than the replay claims
        # Redis keeps (a replay of a job that ran long ago): the work is already done. A first delivery of a recent
        # job cannot have been processed before, so it skips this query on the hot path.
        stream.ack(job)
        return "duplicate"
    if job.expired:
        return finish(job, stream, JobRecord.State.EXPIRED, "", "deadline passed before a worker picked the job up",
                      outcomes)
    try:
        engine = engine_for_job(job.bundles, job.engine_config)
    except BundleError as exc:  # the version the job names cannot be fetched: never run another one instead
        return _fail(job, stream, job.plugin, str(exc), outcomes)
    if job.plugin and job.kind in PLUGIN_HOOK_KINDS and not _plugin_enabled(engine, job.plugin):
        # Checked here, at run time, whoever queued the job: a disabled plugin's code never runs.
        return _fail(job, stream, job.plugin,
                     f"{P.PLUGIN_DISABLED}: plugin {job.plugin!r} is disabled or not installed", outcomes)
    try:
        if job.kind == "test_hook":
            attempt = engine.test_hook(job.plugin, job.hook, job.request or {})
            reply = Reply.of({**attempt.result.to_dict(), "trace_id": attempt.trace_id, "plugin": attempt.plugin,
                              "hook": attempt.hook})
            source, reason = job.plugin, (str(attempt.failure) if attempt.failure else "")
        # ---- WASM tool execution (job kind "tool", see plugins_app/services/tools.py) ----
        elif job.kind == "tool":
            from plugins_app.services.tools import run_tool_job

            payload = run_tool_job(job.request)
            reply = Reply.of(payload)
            source = f"tool:{job.plugin}"
            reason = str(payload.get("error") or payload.get("_tool_error", {}).get("message") or "")
        # ---- end of the tool branch ----
        elif job.kind == "install_deps":  # pip runs third-party build code: never in the web tier
            from plugins_app.services.plugins import run_install_deps

            payload = run_install_deps(job.plugin)
            reply = Reply.of(payload)
            source, reason = job.plugin, "" if payload.get("ok") else str(payload.get("error") or "")
        elif job.kind == "install_tool":  # an uploaded archive is unpacked here, under limits, never in the web tier
            from plugins_app.services.tools import run_install_job

            payload, source, reason = run_install_job(job.request)
            reply = Reply.of(payload)
        else:
            with _origin(job):
                answer = engine.handle(job.hook, job.request or {}, job_id=job.id)
            reply = agent_reply(job.hook, answer)
            source, reason = answer.source, answer.fallback_reason or ""
            if answer.aborted and answer.error:
                reason = (f"aborted: {answer.error.get('plugin')}: {answer.error.get('cause')}: "
                          f"{answer.error.get('message')}")
    except Exception as exc:  # an engine bug must not kill the worker or lose the job's answer
        log.exception("job %s (%s) failed", job.id, job.hook)
        if job.wants_reply:
            stream.reply(job, Reply.failure(f"{type(exc).__name__}: {exc}"))
        return finish(job, stream, JobRecord.State.FAILED, "", f"{type(exc).__name__}: {exc}", outcomes)
    if job.wants_reply:
        stream.reply(job, reply)
    return finish(job, stream, JobRecord.State.DONE, source, reason, outcomes)


def agent_reply(hook: str, answer: EngineReply) -> Reply:
    """What the agent gets for its hook call, made here once and passed on by the web tier as it is: the engine's
    result, or, when a plugin's on_hook_failure = "abort" aborted the turn (LibreFang), a 502 error instead of a
    fallback."""
    if not answer.aborted:
        return Reply.of(answer.to_dict())
    err = answer.error or {}
    message = (f"{err.get('plugin', 'a plugin')} failed its {hook} hook and its on_hook_failure policy is abort: "
               f"{err.get('message', '')}").strip()
    return Reply.of({"error": {"code": "hook_aborted", "message": message,
                               "details": {**err, "trace_ids": answer.trace_ids}}}, 502)


PLUGIN_HOOK_KINDS = ("hook", "test_hook")


def _plugin_enabled(engine, name: str) -> bool:
    catalog = engine.catalog
    return catalog.exists(name) and bool(catalog.get(name).enabled)


def _fail(job: Job, stream: JobStream, source: str, reason: str, outcomes: OutcomeWriter | None) -> str:
    log.warning("job %s (%s) refused: %s", job.id, job.hook, reason)
    if job.wants_reply:
        stream.reply(job, Reply.failure(reason))
    return finish(job, stream, JobRecord.State.FAILED, source, reason, outcomes)


def finish(job: Job, stream: JobStream, state: str, source: str, reason: str,
           outcomes: OutcomeWriter | None = None) -> str:
    """Store the job's outcome, then ack it: here, or handed to the outcome writer."""
    if outcomes is not None:
        outcomes.put(_record(job, state, source, reason, stream), job)
    else:
        _store(job, state, source, reason, stream)
        stream.ack(job)
    return state


def _reject(job: Job, stream: JobStream, why: str, action: str = "bus.job_rejected") -> str:
    """Drop (XACK + XDEL) an entry we will not run, and leave a trace of it in the log and the audit trail."""
    details = {"entry_id": job.entry_id, "kind": job.kind[:40], "hook": job.hook[:40], "plugin": job.plugin[:128],
               "job_id": job.id[:64], "why": why}
    log.error("dropped job stream entry %s: %s (%s)", job.entry_id, why, details)
    stream.ack(job)
    audit.record(f"worker:{stream.consumer}", action, job.plugin or job.hook, ok=False, details=details)
    return REJECTED


def _record(job: Job, state: str, source: str, reason: str, stream: JobStream) -> JobRecord:
    return JobRecord(job_id=job.id, hook=job.hook, state=state, source=source[:300], fallback_reason=reason,
                     deliveries=job.deliveries, worker=stream.consumer)


def _store(job: Job, state: str, source: str, reason: str, stream: JobStream) -> None:
    for attempt in range(5):
        try:
            _record(job, state, source, reason, stream).save(force_insert=True)
            return
        except IntegrityError:
            return
        except Exception:
            if attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))


class OutcomeWriter:
    """The worker's outcome thread: stores the JobRecords of the jobs finished since its last round in one INSERT
    and acks those jobs in one Redis round trip (plugins_app/bus/stream.py JobStream.ack_many). A bounded queue: when the
    database is slower than the hooks, job threads wait here instead of piling outcomes up in memory."""

    QUEUE_MAX = 1000
    BATCH_MAX = 500
    # Wait this long after an outcome for more to share its batch: a write at once (an INSERT, a commit, a Redis
    # round trip) would compete for a core with the web tier handing the reply back, and under load fewer, larger
    # batches cost less per job (see bench/README.md). A crash meanwhile leaves those jobs pending: they are
    # redelivered and find no JobRecord, as for a crash before their outcome.
    LINGER_SECS = 0.05

    def __init__(self, stream: JobStream, traces: DbInvocationSink | None = None):
        self.stream = stream
        self.traces = traces  # see _traced
        self._q: queue.Queue[tuple[JobRecord, Job, int] | None] = queue.Queue(maxsize=self.QUEUE_MAX)
        self._thread = threading.Thread(target=self._run, name="job-outcomes", daemon=True)
        self._thread.start()

    def put(self, record: JobRecord, job: Job) -> None:
        # the job's invocations were queued to the trace writer before its outcome: they lie before this mark
        self._q.put((record, job, self.traces.mark() if self.traces is not None else 0))

    def close(self, timeout: float = 30.0) -> None:
        """Store and ack everything queued so far, then stop."""
        self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch = [self._q.get()]
            if batch[0] is not None:
                take_lingering(self._q, batch, self.BATCH_MAX, self.LINGER_SECS)
            stopping = None in batch  # close()'s sentinel, the last thing queued
            batch = [item for item in batch if item is not None]
            if batch:
                self._write(batch)
            if stopping:
                return

    def _write(self, batch: list[tuple[JobRecord, Job, int]]) -> None:
        batch = self._traced(batch)
        if not batch:
            return
        for attempt in range(5):
            try:
                refresh_connections()
                JobRecord.objects.bulk_create([r for r, _, _ in batch], ignore_conflicts=True)
                break
            except Exception:
                if attempt == 4:  # not stored: not acked either; the jobs are redelivered and run again
                    log.exception("outcomes of %d job(s) not stored; they stay pending", len(batch))
                    for _, job, _ in batch:
                        self.stream.release(job)
                    return
                time.sleep(0.05 * (attempt + 1))
        self.stream.ack_many([job for _, job, _ in batch])

    TRACES_WAIT_SECS = 60.0

    def _traced(self, batch: list[tuple[JobRecord, Job, int]]) -> list[tuple[JobRecord, Job, int]]:
        """The jobs of `batch` whose traces are stored, once they are. A job acked before its traces were written
        lost them for good if the worker died in between (an acked job is never delivered again): its outcome
        waits for the trace writer, and a job whose traces could not be stored is left pending, to run again."""
        if self.traces is None or not batch:
            return batch
        if not self.traces.wait_handled(max(mark for _, _, mark in batch), self.TRACES_WAIT_SECS):
            log.warning("traces of %d finished job(s) not written within %gs; they stay pending", len(batch),
                        self.TRACES_WAIT_SECS)
            unwritten = {job.id for _, job, _ in batch}
        else:
            unwritten = self.traces.take_unwritten([job.id for _, job, _ in batch])
        for _, job, _ in batch:
            if job.id in unwritten:
                self.stream.release(job)
        return [item for item in batch if item[1].id not in unwritten]


@contextlib.contextmanager
def _origin(job: Job):
    """Stamp the invocations of a job queued with an origin (e.g. "mcp") with it (engine.ports.CURRENT_ORIGIN)."""
    token = CURRENT_ORIGIN.set(job.origin) if job.origin else None
    try:
        yield
    finally:
        if token is not None:
            CURRENT_ORIGIN.reset(token)
