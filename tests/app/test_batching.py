"""plugins_app/batching.py: what is queued within a writer's linger goes out in one batch, in order; the stderr
publisher lingers (plugins_app/events.py LINGER_SECS) so its Redis work comes after the answer it follows."""

from __future__ import annotations

import threading

from plugins_app.batching import BatchWriter
from plugins_app.events import StderrPublisher


class Recorder(BatchWriter[int]):
    thread_name = "test-batches"
    linger_secs = 0.5  # far longer than the puts below take, even on a loaded machine

    def __init__(self):
        super().__init__()
        self.batches: list[list[int]] = []
        self.written = threading.Event()

    def write(self, batch):
        self.batches.append(list(batch))
        self.written.set()


def test_items_queued_within_the_linger_share_one_batch_in_order():
    writer = Recorder()
    for i in range(5):
        writer.put(i)
    assert writer.written.wait(10)
    writer.flush()
    assert writer.batches == [[0, 1, 2, 3, 4]]

    writer.written.clear()
    writer.put(5)
    assert writer.written.wait(10)
    assert writer.batches[-1] == [5]


def test_the_stderr_publisher_lingers_before_publishing():
    assert 0 < StderrPublisher.linger_secs <= 0.05  # live lines stay live (bench: p50 < 20 ms)
