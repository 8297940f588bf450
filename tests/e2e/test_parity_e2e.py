"""LibreFang's benchmark route through a real worker (its own service): each run is a real hook process."""

from tests.e2e.live import running_service
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin

SLOW_AFTER_TURN = """
import json, sys, time
sys.stdin.read()
time.sleep(0.05)  # the point: each run takes at least 50 ms, as the benchmark must show
print(json.dumps({"type": "ok"}))
"""


def test_it_benchmarks_each_declared_hook_on_a_worker(tmp_path):
    with running_service(tmp_path) as live:
        make_plugin(live.home / "plugins", "bench", {"ingest": PY_ECHO_INGEST, "after_turn": SLOW_AFTER_TURN})
        status, body = live.request("POST", "/api/plugins/bench/benchmark", {"runs": 5}, timeout=120)
        assert status == 200, body
        by_hook = {h["hook"]: h for h in body["hooks"]}
        assert set(by_hook) == {"ingest", "after_turn"} and body["runs"] == 5
        for h in by_hook.values():
            lat = h["latency_ms"]
            assert h["ok"] == 5 and h["errors"] == 0 and len(lat["all"]) == 5
            assert 0 < lat["min"] <= lat["p50"] <= lat["p95"] <= lat["max"]
            assert h["round_trip_ms"]["p50"] >= lat["min"]  # the round trip includes the hook's own time
        assert by_hook["after_turn"]["latency_ms"]["min"] >= 50  # it sleeps 50 ms every run
        # a given input goes to the one hook asked for
        status, body = live.request("POST", "/api/v1/plugins/bench/benchmark",
                                    {"hook": "ingest", "runs": 2, "input": {"agent_id": "a", "message": "hi"}})
        assert status == 200 and [h["hook"] for h in body["hooks"]] == ["ingest"] and body["hooks"][0]["ok"] == 2
        status, body = live.request("POST", "/api/plugins/bench/benchmark", {"hook": "compact"})
        assert status == 400 and body["error"]["code"] == "hook_not_declared"
        (live.home / "plugins/bench/.disabled").touch()
        status, body = live.request("POST", "/api/plugins/bench/benchmark", {"runs": 1})
        assert status == 409 and body["error"]["code"] == "plugin_disabled"
