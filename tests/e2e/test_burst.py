"""300 agents call a healthy plugin at the same moment: every one is answered by the plugin, none by a fallback.

A waiting call holds no Redis connection of its own (plugins_app/bus/hub.py: one reply listener per web process and a
pipelined writer), so a burst queues instead of failing over to the default engine.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

from tests.e2e.live import running_service
from tests.e2e.test_redis_outage import call
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config

AGENTS = 300


def test_it_answers_a_burst_of_300_blocking_calls_without_a_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREFANG_WORKER_CONCURRENCY", "32")
    with running_service(tmp_path, workers=2) as service:
        make_plugin(service.home / "plugins", "quick", {"ingest": PY_ECHO_INGEST}, toml_extra="hook_timeout_secs = 60")
        write_config(service.home, plugin="quick")
        warm = call(service, "ingest", {"agent_id": "warm", "message": "up", "peer_id": None})[2]
        assert warm["source"] == "quick", warm

        go = threading.Barrier(AGENTS)

        def agent(n: int):
            go.wait()
            started = time.monotonic()
            status, _headers, body = call(service, "ingest", {"agent_id": f"a{n}", "message": f"m{n}",
                                                              "peer_id": None}, timeout=120)
            return n, status, body, time.monotonic() - started

        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=AGENTS) as pool:
            answers = list(pool.map(agent, range(AGENTS)))
        elapsed = time.monotonic() - started

    errors = [(n, s, b) for n, s, b, _ in answers if s != 200]
    assert not errors, f"{len(errors)} errors, e.g. {errors[:3]}"
    fallbacks = [(n, b.get("fallback_reason")) for n, _, b, _ in answers if b.get("source") != "quick"]
    assert not fallbacks, f"{len(fallbacks)} fallbacks, e.g. {fallbacks[:3]}"
    for n, _, body, _ in answers:  # each agent got its own answer, not a neighbour's
        assert {"content": f"echo: m{n}", "scope": "hook"} in body["memories"]
    latencies = sorted(t for *_, t in answers)
    print(f"burst of {AGENTS}: {elapsed:.1f}s, {AGENTS / elapsed:.0f} calls/s, "
          f"p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, p99 {latencies[int(len(latencies) * 0.99)] * 1000:.0f} ms")
    assert elapsed < 120  # generous: the real figures are in bench/README.md
