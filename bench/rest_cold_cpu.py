"""Where the CPU of a cold REST call goes, by process: `bench/rest_cold_cpu.py [rounds]`.

Starts a service (daphne + one worker with warm start off + Redis, tests/e2e/live.py) with the bench's plugin, then,
`rounds` times, 16 agents for 6 s spawning the hook directly and 16 agents calling ingest over REST, and prints the
CPU per call of each process: daphne, the worker, Redis, this process (the agents), the spawner and what it reaped
(each call's sandbox and hook), or for direct spawns what this process reaped. The gap between the two totals is
what keeps cold REST throughput under direct spawning on a machine whose cores are all busy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.run import (  # noqa: E402
    Client,
    DirectSpawn,
    LiveService,
    rest_once,
    restart_worker,
    run_for,
    write_config,
    write_plugins,
)


def cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children) CPU ms of `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) * tick, (int(fields[13]) + int(fields[14])) * tick


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    service = LiveService(Path(tempfile.mkdtemp(prefix="lf-rest-cpu-")))
    write_plugins(service.home, with_wasm=False)
    write_config(service.home, plugin="bench_py")
    service.start(workers=1)
    try:
        restart_worker(service, warm=False)
        spawn = DirectSpawn(service.home)

        def rest(state: dict) -> float:
            state.setdefault("client", Client(service))
            return rest_once(state["client"])

        redis = int(subprocess.check_output(["pgrep", "-f", "redis-server 127.0.0.1:6379"]).split()[0])
        for _ in range(rounds):
            for mode, call in (("direct", lambda state: spawn.once()), ("REST cold", rest)):
                run_for(1, 16, call)
                worker = service.workers[0].pid
                procs = {"daphne": service.web.pid, "worker": worker, "redis": redis, "agents": os.getpid()}
                procs.update((f"spawner {pid}", pid) for pid in children(worker))
                before = {name: cpu(pid) for name, pid in procs.items()}
                load = os.getloadavg()[0]
                result = run_for(6, 16, call)
                parts = {}
                for name, pid in procs.items():
                    (own0, reaped0), (own1, reaped1) = before[name], cpu(pid)
                    parts[name] = round((own1 - own0) / result["calls"], 2)
                    if reaped1 > reaped0:
                        parts[name + " reaped"] = round((reaped1 - reaped0) / result["calls"], 2)
                print(f"{mode:9} {result['calls_per_s']:6.1f} calls/s, load {load:4.1f}, "
                      f"CPU per call {sum(parts.values()):5.1f} ms: {json.dumps(parts)}")
    finally:
        service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
