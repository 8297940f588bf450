"""One pattern used twice (stderr lines to Redis, invocation records to the database): callers queue an item and
return at once; one daemon thread per process takes what is queued in batches and writes them, so a hook's reply
never waits on Redis or the database."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("librefang.batching")


class BatchWriter(Generic[T]):
    """Subclasses set the class attributes and implement `write(batch)`; `start()` runs once in the writer thread
    (e.g. to open connections there). With `queue_max`, items beyond it are dropped and counted (`take_dropped`),
    never silently."""

    thread_name = "batch-writer"
    batch_max = 500
    linger_secs = 0.0  # wait this long after the first item for more to share the batch
    queue_max = 0  # 0: unbounded

    def __init__(self) -> None:
        self._q: queue.Queue[T] = queue.Queue(maxsize=self.queue_max)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._dropped = 0
        # Items queued and items handled (written or failed) since start: the queue is FIFO, so once `handled`
        # reaches what `queued` was at some moment, every item queued before that moment has been handled.
        self._queued = 0
        self._handled = 0
        self._progress = threading.Condition(threading.Lock())

    def put(self, item: T) -> None:
        self._ensure_thread()
        with self._lock:  # the count and the queue's order agree (see mark)
            try:
                self._q.put_nowait(item)
            except queue.Full:
                self._dropped += 1
                return
            self._queued += 1

    def mark(self) -> int:
        """A position in the queue: what the calling thread queued so far lies at or before it."""
        with self._lock:
            return self._queued

    def wait_handled(self, mark: int, timeout: float) -> bool:
        """Wait until every item up to `mark` has been written (or its write failed); False after `timeout`."""
        with self._progress:
            return self._progress.wait_for(lambda: self._handled >= mark, timeout)

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything queued so far is written (tests, shutdown)."""
        end = time.monotonic() + timeout
        while self._q.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)

    def count_dropped(self, n: int) -> None:
        with self._lock:
            self._dropped += n

    def take_dropped(self) -> int:
        """Items dropped since the last call (the count starts again from zero)."""
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        return dropped

    def start(self) -> None:
        """Called once in the writer thread before the first batch."""

    def write(self, batch: list[T]) -> None:
        raise NotImplementedError

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
                    self._thread.start()

    def _next_batch(self) -> list[T]:
        batch = [self._q.get()]
        take_lingering(self._q, batch, self.batch_max, self.linger_secs)
        return batch

    def _run(self) -> None:
        # The thread blocks on the queue itself: no executor hop per batch, nothing left to join at interpreter exit.
        self.start()
        while True:
            batch = self._next_batch()
            try:
                self.write(batch)
            except Exception:
                log.exception("%s: writing %d item(s) failed", self.thread_name, len(batch))
            finally:
                for _ in batch:
                    self._q.task_done()
                with self._progress:
                    self._handled += len(batch)
                    self._progress.notify_all()


def take_lingering(q: queue.Queue, batch: list, batch_max: int, linger_secs: float) -> None:
    """Add to `batch` (which holds the first item) what `q` holds once `linger_secs` have passed, up to `batch_max`.
    The writer sleeps through its linger rather than waiting on the queue: every put would wake it, only for it to
    wait again (a thread switch per item, on the job threads' cores). A batch already full does not wait."""
    if linger_secs and q.qsize() < batch_max - len(batch):
        time.sleep(linger_secs)
    while len(batch) < batch_max:
        try:
            batch.append(q.get_nowait())
        except queue.Empty:
            return
