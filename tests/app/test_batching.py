"""plugins_app/batching.py: what is queued within a writer's linger goes out in one batch, in order; the stderr
publisher (plugins_app/events.py) lingers so its Redis work comes after the answer it follows, and numbers and
stores a batch's lines in one script."""

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


def test_a_batch_is_numbered_stored_and_published_in_one_step(monkeypatch):
    import json

    from plugins_app import bus, events

    monkeypatch.setattr(events, "TAIL_LEN", 3)
    r = bus.client()
    live = r.pubsub(ignore_subscribe_messages=True)
    live.subscribe(events._live_channel())
    before = events.dropped_count()
    start = int(r.get(events._seq_key()) or 0)
    publisher = events.StderrPublisher()
    publisher.count_dropped(2)
    lines = [{"plugin": p, "hook": "ingest", "line": f"{p} {i}", "ts": 1.0, "trace_id": "t"}
             for i, p in enumerate(["one", "two", "one", "one", "one"])]
    assert publisher._publish(r, lines) == start + 1
    epoch = r.get(events._epoch_key())
    assert epoch
    lines = [{"seq": start + 1 + i, "epoch": epoch, **x} for i, x in enumerate(lines)]
    assert events.dropped_count() == before + 2
    msg = None
    for _ in range(50):
        msg = msg or live.get_message(timeout=0.1)
    assert msg is not None and json.loads(msg["data"]) == lines  # the web processes' feed gets them numbered
    live.close()
    # each tail keeps its last TAIL_LEN lines, in order, each line's fields as queued plus its seq
    assert [x["line"] for x in events.tail("one")] == ["one 2", "one 3", "one 4"]
    assert [x["line"] for x in events.tail("two")][-1:] == ["two 1"]
    assert events.tail(None) == [{**x} for x in lines[-3:]]
    assert [x["seq"] for x in events.tail("one", after_seq=start + 3)] == [start + 4, start + 5]
    # each tail remembers the newest line it no longer keeps (a resuming viewer is told, tests/app/test_consumers_*)
    trimmed = r.hgetall(events._trimmed_key())
    assert int(trimmed[events._tail_key("one")]) == start + 1
    assert int(trimmed[events._tail_key(events.ALL)]) == start + 2
    assert events._tail_key("two") not in trimmed or int(trimmed[events._tail_key("two")]) < start


def test_a_counter_that_starts_again_comes_with_a_new_epoch():
    from plugins_app import bus, events

    r = bus.client()
    line = {"plugin": "renumbered", "hook": "ingest", "line": "x", "ts": 1.0, "trace_id": "t"}
    publisher = events.StderrPublisher()
    publisher._publish(r, [line])
    old = r.get(events._epoch_key())
    publisher._publish(r, [line])
    assert r.get(events._epoch_key()) == old  # one numbering while the counter lasts
    r.delete(events._seq_key(), events._epoch_key())  # what a Redis that lost its data looks like
    assert publisher._publish(r, [line]) == 1
    new = r.get(events._epoch_key())
    assert new and new != old
    assert publisher._publish(r, [line]) == 2 and r.get(events._epoch_key()) == new
    assert [(x["seq"], x["epoch"]) for x in events.tail("renumbered")][-2:] == [(1, new), (2, new)]
    r.delete(events._epoch_key())  # an epoch lost alone (a store older than epochs): a new one, the count goes on
    assert publisher._publish(r, [line]) == 3 and r.get(events._epoch_key()) not in (None, new)
