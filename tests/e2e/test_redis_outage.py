"""Redis SIGKILLed for 4 s under agent traffic, then restarted on the same port and AOF directory.

The service (daphne + worker, tests/e2e/live.py) runs against a redis-server of its own; nothing else shares it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.e2e.live import LiveService
from tests.own_redis import service_with_own_redis
from tests.plugin_factory import make_plugin, write_config
from tests.waiting import wait_until

INGEST = """
import json, sys
req = json.loads(sys.stdin.read())
print(json.dumps({"type": "ingest_result", "memories": [{"content": "seen " + req["message"]}]}))
"""

# One line per run: the turn's id (the last message's content).
AFTER_TURN = """
import json, os, sys
req = json.loads(sys.stdin.read())
with open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "turns"), "a") as fh:
    fh.write(req["messages"][-1]["content"] + "\\n")
print(json.dumps({"type": "ok"}))
"""

OUTAGE_SECS = 4.0
BACK_WITHIN_SECS = 5.0


def call(service: LiveService, hook: str, body: dict, timeout: float = 30) -> tuple[int, dict, dict]:
    """(status, headers, body); connection errors are status 0."""
    req = urllib.request.Request(f"{service.url}/api/context-engine/hooks/{hook}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {service.token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            data = json.loads(text)
        except ValueError:
            data = {"raw": text.decode(errors="replace")}
        return exc.code, dict(exc.headers), data
    except OSError as exc:
        return 0, {}, {"error": str(exc)}


@pytest.fixture
def outage_service(tmp_path):
    with service_with_own_redis(tmp_path) as (service, redis):
        yield service, redis


def test_it_survives_a_redis_outage_without_500s_or_lost_after_turns(outage_service):
    service, redis = outage_service
    make_plugin(service.home / "plugins", "steady", {"ingest": INGEST, "after_turn": AFTER_TURN},
                toml_extra="hook_timeout_secs = 3")
    write_config(service.home, plugin="steady")
    turns_file = service.home / "plugin_data" / "steady" / "turns"

    results: list[tuple[float, str, int, dict, dict, float]] = []  # (answered, hook, status, headers, body, sent)
    lock = threading.Lock()
    stop = threading.Event()

    def agent(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            turn = f"agent{n}-turn{i}"
            for hook, body in (("ingest", {"agent_id": f"a{n}", "message": turn, "peer_id": None}),
                               ("after_turn", {"agent_id": f"a{n}",
                                               "messages": [{"role": "user", "content": turn}]})):
                sent = time.monotonic()
                status, headers, reply = call(service, hook, body)
                with lock:
                    results.append((time.monotonic(), hook, status, headers, {**(reply or {}), "_turn": turn}, sent))
            stop.wait(0.05)  # an agent's pause between turns: the traffic's pace

    threads = [threading.Thread(target=agent, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    health_during: list[int] = []
    try:
        def ingest_answers() -> list[dict]:
            with lock:
                return [b for _, h, _, _, b, _ in results if h == "ingest"]

        wait_until(ingest_answers, 30, "the plugin to answer before the outage",
                   until=lambda answers: any(b.get("source") == "steady" for b in answers))
        time.sleep(1)  # traffic running for a while before the outage is the point
        killed_at = time.monotonic()
        redis.kill()
        while time.monotonic() - killed_at < OUTAGE_SECS:
            health_during.append(service.request("GET", "/api/health", auth=False, timeout=10)[0])
            time.sleep(0.3)  # health sampled through the outage, whose length is the point
        redis.start()
        back_at = time.monotonic()

        def plugin_back() -> bool:
            with lock:
                return any(answered > back_at and h == "ingest" and b.get("source") == "steady"
                           for answered, h, _, _, b, _ in results)

        wait_until(plugin_back, 60, "the plugin to answer again after Redis came back")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)

    assert not [r for r in results if r[2] == 500], "an agent got a 500"
    failed = [(round(r[0] - killed_at, 2), r[1], r[4]) for r in results if r[2] == 0]
    assert not failed, f"{len(failed)} connection(s) failed, e.g. {failed[:3]}"
    outage = [r for r in results if killed_at + 0.5 < r[5] and r[0] < back_at]  # sent and answered while down
    refused = [r for r in outage if r[1] == "after_turn" and r[2] == 503]
    assert refused, "no after_turn was refused with 503 while Redis was down"
    assert all(r[3].get("Retry-After") for r in refused)
    assert all(r[4]["error"]["code"] == "bus_unavailable" for r in refused)
    fallbacks = [r for r in outage if r[1] == "ingest" and r[2] == 200 and r[4].get("source") == "default"]
    assert fallbacks and all("bus_unavailable" in (r[4].get("fallback_reason") or "") for r in fallbacks)
    assert health_during and 200 not in health_during, f"/api/health said ok during the outage: {health_during}"
    back = [r for r in results if r[0] > back_at and r[1] == "ingest" and r[4].get("source") == "steady"]
    assert back, "the plugin never answered again after Redis came back"
    print(f"outage: {len(refused)} after_turn 503, {len(fallbacks)} ingest fallbacks, health {health_during}, "
          f"plugin back {back[0][0] - back_at:.2f}s after Redis")
    assert back[0][0] - back_at <= BACK_WITHIN_SECS, f"plugin back only {back[0][0] - back_at:.1f}s after Redis"

    accepted = {r[4]["_turn"] for r in results if r[1] == "after_turn" and r[2] == 202}

    def not_run() -> set[str]:
        return accepted - (set(turns_file.read_text().split()) if turns_file.exists() else set())

    missing = wait_until(not_run, 60, "every accepted after_turn job run", until=lambda missing: not missing)
    assert not missing, f"{len(missing)} of {len(accepted)} accepted after_turn jobs never ran: {sorted(missing)[:5]}"
    # The worker's heartbeat thread backs off while Redis is down (up to 2 s between tries): health is ok again once
    # it has beaten since Redis came back, which may be after the plugin answered again.
    wait_until(lambda: service.request("GET", "/api/health", auth=False), 10, "health ok after the outage",
               until=lambda answer: answer[0] == 200 and answer[1]["status"] == "ok")
