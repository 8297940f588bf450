"""Which of our modules run code for one agent hook call, per process, counted from the code as it runs:
`.venv/bin/python bench/call_path.py [calls]` (as root, like the tests: the hook runs in its sandbox).

It starts a real service as the end-to-end tests do (tests/e2e/live.py: daphne, one worker, Redis) with a python
plugin `cp` answering `ingest`, every python process of it importing bench/call_path_probe.py as its
sitecustomize (on PYTHONPATH): each records which files under engine/, plugins_app/ and librefang_site/ start or
resume a frame, and when (CLOCK_MONOTONIC, shared by every process). After 30 warm-up calls it makes `calls` (5)
measured ingest calls, a random 0.6-1.6 s apart (so that nothing periodic keeps step with them), and counts for
each process the modules that ran between the request's first byte and the answer's last (`answer`), and until
0.4 s after it (`call`: the worker's outcome, traces and metrics written after the answer). A module counts when it
ran in every measured call: what a heartbeat, a reclaim pass or the alert evaluator ran in one window is not the
call's. The zygote's children (spare and keeper, the hook's process) are counted together, per call.

Prints one line per process and window, then the JSON of it all (modules by name; with `--functions`, each
module's functions that ran).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.live import LiveService  # noqa: E402
from tests.plugin_factory import make_plugin, write_config  # noqa: E402

PACKAGES = ("engine", "plugins_app", "librefang_site")
HOOK = """
import json, sys
req = json.loads(sys.stdin.read())
print(json.dumps({"type": "ingest_result", "memories": [{"content": "seen: " + req["message"]}]}))
"""
BODY = {"agent_id": "cp-agent", "message": "what did we decide about the launch date?", "peer_id": "u1"}
WARM_UP = 30
SETTLE_MS = 400


def probe_dir(root: Path, child_out: Path, functions: bool = False) -> Path:
    """A directory holding the probe as sitecustomize.py and what it records where."""
    where = root / "probe"
    where.mkdir()
    shutil.copy(REPO / "bench" / "call_path_probe.py", where / "sitecustomize.py")
    roots = sorted({str(base / p) + os.sep for base in (REPO, REPO.resolve()) for p in PACKAGES})
    (where / "call_path.json").write_text(json.dumps({"roots": roots, "out": str(root / "records"),
                                                      "child_out": str(child_out), "functions": functions}))
    return where


def read_records(*dirs: Path) -> list[dict]:
    """One entry per process: its header and {file: [ms, ...]}."""
    processes = []
    for directory in dirs:
        for log in sorted(directory.glob("*.log")) if directory.is_dir() else []:
            lines = log.read_text(errors="replace").splitlines()
            if not lines:
                continue
            header = json.loads(lines[0])
            seen: dict[str, list[int]] = defaultdict(list)
            for line in lines[1:]:
                ms, _, path = line.partition("\t")
                if ms.isdigit() and path:
                    seen[_module(path)].append(int(ms))
            processes.append({**header, "name": log.stem, "seen": seen})
    return processes


def _module(path: str) -> str:
    for base in (str(REPO.resolve()), str(REPO)):
        if path.startswith(base + os.sep):
            return path[len(base) + 1:]
    return path


def kind_of(process: dict, by_name: dict[str, dict]) -> str:
    """web, worker, zygote (the zygote's loop), zygote's children (every process forked below it), spawner."""
    argv = " ".join(process.get("argv") or [])
    if process.get("parent"):
        parent = by_name.get(process["parent"])
        return "zygote's children" if parent is None or kind_of(parent, by_name) in (
            "zygote", "zygote's children") else "other child"
    if "daphne" in argv:
        return "web"
    if "warmstart_zygote" in argv:
        return "zygote"
    if "hook_spawner" in argv:
        return "spawner"
    if "manage.py" in argv and "worker" in argv:
        return "worker"
    return "other"


def modules_in(processes: list[dict], start: int, end: int) -> tuple[dict[str, set[str]], dict[str, int]]:
    """kind -> modules that ran in [start, end] (ms) over the processes of that kind, and how many processes."""
    by_name = {p["name"]: p for p in processes}
    out: dict[str, set[str]] = defaultdict(set)
    count: dict[str, int] = defaultdict(int)
    for p in processes:
        ran = {module for module, times in p["seen"].items() if any(start <= t <= end for t in times)}
        if ran:
            kind = kind_of(p, by_name)
            out[kind] |= ran
            count[kind] += 1
    return out, count


def _by_module(names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for name in names:
        module, _, function = name.rpartition(":")
        out[module].append(function)
    return dict(out)


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    functions = "--functions" in sys.argv
    calls = int(args[0]) if args else 5
    root = Path(tempfile.mkdtemp(prefix="lf-callpath-"))
    service = LiveService(root)
    child_out = service.home / "plugin_data" / "cp" / ".call_path"
    probe = probe_dir(root, child_out, functions)
    service.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(probe), service.env.get("PYTHONPATH", "")]))
    make_plugin(service.home / "plugins", "cp", {"ingest": HOOK})
    write_config(service.home, plugin="cp")
    windows = []
    try:
        service.start()
        for _ in range(WARM_UP):
            status, body = service.hook("ingest", BODY)
            assert status == 200 and body.get("source") == "cp", (status, body)
        for _ in range(calls):
            time.sleep(random.uniform(0.6, 1.6))
            start = int(time.monotonic() * 1000)
            status, body = service.hook("ingest", BODY)
            end = int(time.monotonic() * 1000) + 1
            assert status == 200 and body.get("source") == "cp", (status, body)
            windows.append((start, end))
        time.sleep(SETTLE_MS / 1000 + 0.2)
        processes = read_records(root / "records", child_out)
    finally:
        service.stop()
        shutil.rmtree(root, ignore_errors=True)
    report, processes_seen = {}, {}
    for window, extra in (("answer", 0), ("call", SETTLE_MS)):
        per_call = [modules_in(processes, start, end + extra) for start, end in windows]
        kinds = sorted({k for found, _ in per_call for k in found})
        report[window] = {kind: sorted(set.intersection(*(found.get(kind, set()) for found, _ in per_call)))
                          for kind in kinds}
        if functions:  # the modules of the functions that ran
            report[window] = {kind: _by_module(names) for kind, names in report[window].items()}
        report[window]["zygote, all"] = sorted({*report[window].get("zygote", ()),
                                               *report[window].get("zygote's children", ())})
        processes_seen[window] = {kind: sorted({count.get(kind, 0) for _, count in per_call}) for kind in kinds}
    for window, kinds in report.items():
        for kind, modules in kinds.items():
            seen = processes_seen[window].get(kind)
            print(f"{window:6} {kind:18} {len(modules):3} modules" + (f"   processes {seen}" if seen else ""))
    print(json.dumps({"calls": calls, "loadavg": os.getloadavg(), "modules": report, "processes": processes_seen},
                     indent=1))
    return 0


if __name__ == "__main__":
    from tests import mount_namespace

    mount_namespace.enter()  # the plugin's data disk stays in this run's own mount namespace
    sys.exit(main())
