"""A worker loop on a thread for in-process tests of routes that wait on the job bus (tool installs).

It reads the real Redis stream and runs `install_tool` jobs with the worker's own function
(plugins_app.services.tools.run_install_job), then replies and acks as the worker does. It skips what
plugins_app.services.jobs.process adds around that (the JobRecord row): that write would need the test's own
database transaction. The full worker process is exercised by tests/e2e/test_tool_install_limits.py.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from plugins_app import bus
from plugins_app.services.tools import INSTALL_JOB_KIND, run_install_job


@pytest.fixture(name="tool_worker")
def tool_worker_fixture():
    stream = bus.JobStream(consumer=f"test-tools-{uuid.uuid4().hex[:6]}")
    stream.ensure_group()
    stop = threading.Event()
    ran: list[dict] = []

    def loop() -> None:
        while not stop.is_set():
            for job in stream.read(count=10, block_ms=100):
                if job.kind == INSTALL_JOB_KIND and getattr(job, "signed", True):
                    payload, _source, _reason = run_install_job(job.request)
                    ran.append(job.request)
                    stream.reply(job, bus.Reply.of(payload))
                stream.ack(job)

    thread = threading.Thread(target=loop, name="tool-worker", daemon=True)
    thread.start()
    yield ran
    stop.set()
    thread.join(timeout=10)
