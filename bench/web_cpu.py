"""CPU the web process (daphne) and the worker spend per agent hook call, read from /proc/<pid>/stat around N calls
over one keep-alive connection. `python bench/web_cpu.py [N]`; see bench/README.md ("The web tier's hook path").

ingest waits for the worker's reply (no plugin installed: the default engine answers, so the worker's figure is
its bookkeeping plus a recall query); after_turn is answered 202 once the job is in Redis (web tier only).
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

from tests.e2e.live import running_service  # noqa: E402

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
BODIES = {"ingest": {"agent_id": "bench", "message": "what did we decide about the launch date?", "peer_id": "u1"},
          "after_turn": {"agent_id": "bench", "messages": [{"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "hello"}]}}


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_MS  # utime + stime


def run(service, hook: str, n: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=60)
    headers = {"Authorization": f"Bearer {service.token}", "Content-Type": "application/json"}
    body = json.dumps(BODIES[hook])
    path = f"/api/context-engine/hooks/{hook}"

    def call() -> float:
        started = time.perf_counter()
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status in (200, 202), resp.status
        return (time.perf_counter() - started) * 1000

    for _ in range(max(20, n // 10)):  # warm: token cache, imports, connections
        call()
    web, worker = service.web.pid, service.workers[0].pid
    web0, worker0 = cpu_ms(web), cpu_ms(worker)
    walls = [call() for _ in range(n)]
    conn.close()
    return {"hook": hook, "n": n, "web_cpu_ms_per_call": round((cpu_ms(web) - web0) / n, 3),
            "worker_cpu_ms_per_call": round((cpu_ms(worker) - worker0) / n, 3),
            "wall_p50_ms": round(statistics.median(walls), 2)}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    with tempfile.TemporaryDirectory(prefix="lf-webcpu-") as root, running_service(Path(root)) as service:
        results = [run(service, hook, n) for hook in ("ingest", "after_turn")]
    results.append({"loadavg": Path("/proc/loadavg").read_text().split()[:3]})
    for row in results:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
