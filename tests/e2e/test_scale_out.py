"""Scale-out on PostgreSQL: a web process and two workers whose $LIBREFANG_HOME are three different empty
directories, sharing only Redis, the database and the bus signing key. The workers hold no plugins: every job names
the bundle versions to run (plugins_app/services/bundles.py) and each worker fetches them from the database."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.e2e.live import REPO, LiveService
from tests.waiting import wait_until

PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_ADMIN_URL = f"postgres://postgres@{PG_HOST}:{PG_PORT}/postgres"


def _postgres_answers() -> bool:
    try:
        with socket.create_connection((PG_HOST, PG_PORT), timeout=1):
            return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _postgres_answers(), reason=f"PostgreSQL does not answer on {PG_HOST}:{PG_PORT}")


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql)


class Cluster(LiveService):
    """LiveService on PostgreSQL, with bundle pinning on and each worker in a home of its own (`--home`)."""

    def __init__(self, root: Path, database_url: str):
        super().__init__(root)
        self.env.pop("LIBREFANG_DB", None)
        # warm start on whatever mode the suite runs in: the workers are asked to prewarm
        self.env.update({"DATABASE_URL": database_url, "LIBREFANG_PIN_BUNDLES": "1",
                         "LIBREFANG_BUS_KEY_FILE": str(root / "bus_key"), "LIBREFANG_WARM_START": "1"})
        self.worker_homes: dict[int, Path] = {}

    def start_worker(self) -> subprocess.Popen:
        home = self.root / f"worker{len(self.worker_homes) + 1}"
        home.mkdir()
        env = {k: v for k, v in self.env.items() if k != "LIBREFANG_HOME"}
        log = open(self.logs / f"{home.name}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "librefang_site.cli", "worker", "--home", str(home),
                                 "--concurrency", "2"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.workers.append(proc)
        self.worker_homes[proc.pid] = home
        return proc


@pytest.fixture
def cluster(tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")
    db = f"lfscale_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{db}"')
    service = Cluster(tmp_path, f"postgres://postgres@{PG_HOST}:{PG_PORT}/{db}")
    try:
        service.start(workers=2)
        yield service
    finally:
        service.stop()
        _admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def ingest_hook(version: str) -> str:
    # The data dir lies in the worker's own home, the script in the bundle the worker unpacked: together they say
    # which worker ran which version from where.
    return textwrap.dedent(f"""
        import json, os, sys
        sys.stdin.read()
        where = os.environ["LIBREFANG_PLUGIN_DATA_DIR"] + "|" + os.path.abspath(__file__)
        print(json.dumps({{"type": "ingest_result", "memories": [{{"content": "{version}|" + where}}]}}))
    """).lstrip()


AFTER_TURN = textwrap.dedent("""
    import json, os, sys, time
    req = json.loads(sys.stdin.read())
    time.sleep(0.4)  # each job takes a while, so that some are in flight when a worker is killed
    with open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "ran.log"), "a") as fh:
        fh.write(req["messages"][0]["content"] + "\\n")
    print(json.dumps({"type": "ok"}))
""").lstrip()


def ingest(cluster: Cluster, i: int) -> str:
    status, body = cluster.hook("ingest", {"agent_id": f"agent-{i % 5}", "message": f"m{i}", "peer_id": None})
    assert status == 200, body
    contents = [m.get("content", "") for m in body.get("memories", [])]
    marked = [c for c in contents if c.startswith(("v1|", "v2|"))]
    return marked[0] if marked else f"default:{body.get('source')}:{body.get('fallback_reason')}"


def worker_of(cluster: Cluster, marker: str) -> Path:
    data_dir = Path(marker.split("|")[1])
    return next(home for home in cluster.worker_homes.values() if data_dir.is_relative_to(home))


def test_it_runs_one_consistent_plugin_set_on_workers_without_plugins(cluster):
    name = f"scale-{uuid.uuid4().hex[:6]}"
    status, body = cluster.request("POST", "/api/plugins/scaffold",
                                   {"name": name, "runtime": "python", "hooks": ["ingest", "after_turn"]})
    assert status == 201, body
    pdir = cluster.home / "plugins" / name
    (pdir / "hooks" / "ingest.py").write_text(ingest_hook("v1"))
    (pdir / "hooks" / "after_turn.py").write_text(AFTER_TURN)
    status, body = cluster.request("POST", f"/api/plugins/{name}/reload")
    assert status == 200, body
    status, body = cluster.request("PUT", "/api/context-engine/config", {"plugin": name})
    assert status == 200, body

    # v1 runs on both workers, from their own bundle caches
    first = [ingest(cluster, i) for i in range(16)]
    assert all(m.startswith("v1|") for m in first), first
    homes = {worker_of(cluster, m) for m in first}
    assert homes == set(cluster.worker_homes.values()), f"one worker ran everything: {first}"
    for m in first:
        script = Path(m.split("|")[2])
        assert script.is_relative_to(worker_of(cluster, m) / "bundles"), m
    for home in cluster.worker_homes.values():
        assert not (home / "plugins" / name).exists()

    def heartbeats() -> list[dict]:
        return cluster.request("GET", "/api/health", auth=False)[1]["workers"]

    # each worker says where it runs, how busy the host is and what its bundle cache holds
    wait_until(heartbeats, 20, "two heartbeats, each with a bundle in its cache", until=lambda beats: len(beats) == 2
               and all(w.get("bundle_cache", {}).get("bundles", 0) >= 1 for w in beats))
    for beat in heartbeats():
        assert beat["pid"] in cluster.worker_homes and beat["host"] == socket.gethostname()
        assert beat["concurrency"] == 2 and len(beat["load"]) == 3 and beat["bundle_cache"]["bytes"] > 0

    # edit + reload: every later call, on either worker, runs v2 and none v1
    (pdir / "hooks" / "ingest.py").write_text(ingest_hook("v2"))
    status, body = cluster.request("POST", f"/api/plugins/{name}/reload")
    assert status == 200, body
    second = [ingest(cluster, i) for i in range(16)]
    assert all(m.startswith("v2|") for m in second), second
    assert {worker_of(cluster, m) for m in second} == set(cluster.worker_homes.values()), second

    # an edit without reload is not published: the workers keep running v2
    (pdir / "hooks" / "ingest.py").write_text(ingest_hook("v1"))
    assert all(ingest(cluster, i).startswith("v2|") for i in range(4))
    (pdir / "hooks" / "ingest.py").write_text(ingest_hook("v2"))

    # SIGKILL one worker with after_turn jobs in flight: the other finishes them all
    victim, survivor = cluster.workers[0], cluster.workers[1]
    victim_home = cluster.worker_homes[victim.pid]
    logs = [home / "plugin_data" / name / "ran.log" for home in cluster.worker_homes.values()]
    for i in range(16):
        status, body = cluster.hook("after_turn", {"agent_id": "a1", "messages": [{"role": "user",
                                                                                   "content": f"job-{i}"}]})
        assert status == 202, body
    victim_log = victim_home / "plugin_data" / name / "ran.log"
    wait_until(victim_log.exists, 60, "the victim to run an after_turn job")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    cluster.workers.remove(victim)

    def ran() -> set[str]:
        return {line for log in logs if log.exists() for line in log.read_text().split()}

    wait_until(ran, 120, "every after_turn job run", until=lambda done: {f"job-{i}" for i in range(16)} <= done)
    survivor_log = cluster.worker_homes[survivor.pid] / "plugin_data" / name / "ran.log"
    print(f"after_turn: {len(victim_log.read_text().split())} on the killed worker, "
          f"{len(survivor_log.read_text().split())} on the survivor (at least once)")

    # uninstalled: runs nowhere (the configuration still names it; agents get the default engine)
    status, body = cluster.request("POST", "/api/plugins/uninstall", {"name": name})
    assert status == 200, body
    after = [ingest(cluster, i) for i in range(6)]
    assert all(m.startswith("default:") and "not installed" in m for m in after), after


AFTER_TURN_MARK = textwrap.dedent("""
    import json, os, sys
    req = json.loads(sys.stdin.read())
    with open(os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "ran.log"), "a") as fh:
        fh.write(req["agent_id"] + "|" + req["messages"][0]["content"] + "\\n")
    print(json.dumps({"type": "ok"}))
""").lstrip()


def test_prewarm_then_agent_affinity_across_two_worker_hosts(cluster):
    name = f"sticky-{uuid.uuid4().hex[:6]}"
    status, body = cluster.request("POST", "/api/plugins/scaffold",
                                   {"name": name, "runtime": "python", "hooks": ["ingest", "after_turn"]})
    assert status == 201, body
    pdir = cluster.home / "plugins" / name
    (pdir / "hooks" / "ingest.py").write_text(ingest_hook("v1"))
    (pdir / "hooks" / "after_turn.py").write_text(AFTER_TURN_MARK)
    toml = pdir / "plugin.toml"
    toml.write_text('affinity = "agent"\n' + toml.read_text())  # top level: before any table
    assert cluster.request("POST", f"/api/plugins/{name}/reload")[0] == 200
    assert cluster.request("PUT", "/api/context-engine/config", {"plugin": name})[0] == 200

    def heartbeats() -> dict[int, dict]:
        return {w["pid"]: w for w in cluster.request("GET", "/api/health", auth=False)[1]["workers"]}

    # prewarm, before any call: each worker confirms, its zygote runs (a child of the worker, in /proc) and the
    # pinned bundle is in its own cache
    assert all(not w.get("zygote_pids") for w in heartbeats().values())
    status, body = cluster.request("POST", f"/api/v1/plugins/{name}/prewarm")
    assert status == 200, body
    assert body["warmed_everywhere"] is True and body["missing"] == [], body
    assert {w["pid"] for w in body["workers"]} == set(cluster.worker_homes)
    for w in body["workers"]:
        (p,) = w["plugins"]
        assert sorted(p["warmed"]) == ["after_turn", "ingest"] and p["bundle"], w
        (zygote,) = w["zygote_pids"]
        stat = Path(f"/proc/{zygote}/stat").read_text()
        assert int(stat.rsplit(")", 1)[1].split()[1]) == w["pid"]  # its parent is that worker
        assert any((cluster.worker_homes[w["pid"]] / "bundles").iterdir())
    wait_until(heartbeats, 10, "every heartbeat naming its zygote",
               until=lambda beats: all(w.get("zygote_pids") for w in beats.values()))

    # affinity: every call of one agent, ingest and after_turn, runs on one worker host
    agents = [f"agent-{i}" for i in range(4)]
    homes: dict[str, set[Path]] = {a: set() for a in agents}
    for round_ in range(4):
        for a in agents:
            status, body = cluster.hook("ingest", {"agent_id": a, "message": f"m{round_}", "peer_id": None})
            assert status == 200, body
            (marker,) = [m["content"] for m in body["memories"] if m["content"].startswith("v1|")]
            homes[a].add(worker_of(cluster, marker))
            status, body = cluster.hook("after_turn", {"agent_id": a, "messages": [
                {"role": "user", "content": f"turn-{round_}"}]})
            assert status == 202, body

    def ran(home: Path) -> list[str]:
        log = home / "plugin_data" / name / "ran.log"
        return log.read_text().split() if log.exists() else []

    all_homes = list(cluster.worker_homes.values())
    wait_until(lambda: sum(len(ran(h)) for h in all_homes), 30, "16 after_turn runs", until=lambda n: n >= 16)
    for a in agents:
        assert len(homes[a]) == 1, homes
        (home,) = homes[a]
        assert sorted(x for x in ran(home) if x.startswith(a + "|")) == [f"{a}|turn-{r}" for r in range(4)]
        assert not [x for h in all_homes if h != home for x in ran(h) if x.startswith(a + "|")]

    # its host dies: the agent's later calls, and the after_turn jobs queued while it was dying, go to the other
    target = agents[0]
    (victim_home,) = homes[target]
    victim = next(p for p in cluster.workers if cluster.worker_homes[p.pid] == victim_home)
    survivor_home = next(h for h in all_homes if h != victim_home)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    cluster.workers.remove(victim)
    for i in range(3):  # the web tier still sees the dead host's heartbeat for a few seconds: queued there
        assert cluster.hook("after_turn", {"agent_id": target, "messages": [
            {"role": "user", "content": f"late-{i}"}]})[0] == 202
    wait_until(heartbeats, 20, "the live workers' heartbeats only",
               until=lambda beats: set(beats) == {p.pid for p in cluster.workers})
    for i in range(3):
        status, body = cluster.hook("ingest", {"agent_id": target, "message": f"after-{i}", "peer_id": None})
        (marker,) = [m["content"] for m in body["memories"] if m["content"].startswith("v1|")]
        assert worker_of(cluster, marker) == survivor_home
    wait_until(lambda: ran(survivor_home), 60, "the late jobs run on the survivor",
               until=lambda lines: {f"{target}|late-{i}" for i in range(3)} <= set(lines))
    # they were in the dead host's stream: the survivor moved them (plugins_app/bus/affinity.py, rehome_dead_hosts)
    moved = re.findall(r"moved (\d+) job\(s\) of worker hosts", (cluster.logs / f"{survivor_home.name}.log").read_text())
    assert sum(int(n) for n in moved) >= 3, moved
