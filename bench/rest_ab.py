"""REST warm ingest latency of two checkouts, call by call interleaved: `make bench`'s REST warm call (plugin
`bench_py`, the reflect hook, warm start on) against a service (daphne + one worker + Redis, tests/e2e/live.py)
started from each tree, so background load hits both alike. For a before/after of a change:

    git archive <base> | tar -x -C /tmp/base && ln -s $PWD/.venv /tmp/base/.venv
    .venv/bin/python bench/rest_ab.py /tmp/base [calls]

Both services run on this checkout's interpreter; each runs its own tree's code (manage.py from its directory).
CPU per call is daphne's and the worker's own (utime + stime of the two processes; the hook's processes are not
theirs).

By default calls follow each other at once (back to back: a helper's next spare may not be ready). With `--spawn`
every call is followed by a direct spawn of the hook, as `make bench`'s REST phase interleaves them. `--idle=MS`
then sleeps that long before the next call: `make bench` reads CPU counters between its calls and waits for the
helpers to settle (bench/run.py settle_helpers, >= 10 ms), so each of its REST calls starts on an idle machine,
where every hand-over to another process wakes an idle vCPU (see bench/README.md, "idle or busy").
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.run import REQUEST, DirectSpawn, write_plugins  # noqa: E402
from tests.e2e import live  # noqa: E402
from tests.plugin_factory import write_config  # noqa: E402


def start(tree: Path, root: Path) -> live.LiveService:
    service = live.LiveService(root)
    write_plugins(service.home, with_wasm=False)
    write_config(service.home, plugin="bench_py")
    saved, live.REPO = live.REPO, tree  # LiveService runs manage.py and daphne from live.REPO
    try:
        service.start(workers=1)
    finally:
        live.REPO = saved
    return service


class Agent:
    def __init__(self, service: live.LiveService):
        self.conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=60)
        self.headers = {"Authorization": f"Bearer {service.token}", "Content-Type": "application/json"}
        self.body = json.dumps(REQUEST)

    def call(self) -> float:
        started = time.perf_counter()
        self.conn.request("POST", "/api/context-engine/hooks/ingest", self.body, self.headers)
        resp = self.conn.getresponse()
        data = json.loads(resp.read())
        elapsed = (time.perf_counter() - started) * 1000
        if resp.status != 200 or data.get("source") != "bench_py":
            raise RuntimeError(f"answered {resp.status}: {str(data)[:300]}")
        return elapsed


TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def cpu_ms(service: live.LiveService) -> dict[str, float]:
    out = {}
    for name, pid in (("web", service.web.pid), ("worker", service.workers[0].pid)):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) * TICK_MS
    return out


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    idle = next((float(a.split("=", 1)[1]) / 1000 for a in sys.argv if a.startswith("--idle=")), 0.0)
    other = Path(args[0]).resolve()
    n = int(args[1]) if len(args) > 1 else 400
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lf-ab-") as tmp:
        services = {"other": start(other, Path(tmp) / "other"), "this": start(REPO, Path(tmp) / "this")}
        try:
            agents = {k: Agent(s) for k, s in services.items()}
            for _ in range(50):  # warm: zygotes, caches, connections
                for a in agents.values():
                    a.call()
            spawn = DirectSpawn(services["this"].home) if "--spawn" in sys.argv else None
            times: dict[str, list[float]] = {k: [] for k in agents}
            cpu0 = {k: cpu_ms(s) for k, s in services.items()}
            for i in range(n):
                order = ["other", "this"] if i % 2 else ["this", "other"]
                for k in order:
                    times[k].append(agents[k].call())
                    if spawn is not None:
                        spawn.once()
                    if idle:
                        time.sleep(idle)
            cpu = {k: {f"{part}_cpu_ms_per_call": round((v - cpu0[k][part]) / n, 3)
                       for part, v in cpu_ms(s).items()} for k, s in services.items()}
        finally:
            for s in services.values():
                s.stop()
    out = {k: {"p50_ms": round(statistics.median(v), 2), "p95_ms": round(pct(v, 95), 2),
               "mean_ms": round(statistics.fmean(v), 2), **cpu[k]} for k, v in times.items()}
    diffs = [t - o for t, o in zip(times["this"], times["other"], strict=True)]
    print(json.dumps({"other": str(other), "this": str(REPO), "calls": n, "spawn_between": spawn is not None,
                      "idle_ms": idle * 1000, **out,
                      "this_minus_other_p50_ms": round(out["this"]["p50_ms"] - out["other"]["p50_ms"], 2),
                      "paired_difference_median_ms": round(statistics.median(diffs), 2),
                      "loadavg": [load_start, os.getloadavg()]}, indent=1))


if __name__ == "__main__":
    main()
