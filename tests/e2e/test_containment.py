"""Containment through the real service (daphne + worker + Redis), hostile plugins warm (forked from the zygote) and
cold (`warm_start = false`, spawned): a hook reads nothing in $LIBREFANG_HOME but its own directories (the owner
token, admin password, secret key, the SQLite database, other plugins and their data are not there), sees no service
process nor its environment, and leaves no process behind, whether it detaches, times out or holds the pipes.
The forged-job case lives with the bus tests (tests/app/test_bus*.py)."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import pytest

from engine.process import sandbox
from tests.e2e.live import LiveService
from tests.plugin_factory import make_plugin, write_config
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(sandbox.mode() is None, reason="this OS refuses namespaces to the service")

CANARY = "containment-canary-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A service of our own: its SQLite database in $LIBREFANG_HOME (the default) and a canary in its environment."""
    svc = LiveService(tmp_path_factory.mktemp("containment"))
    svc.env.pop("LIBREFANG_DB")
    svc.env["LF_CONTAINMENT_CANARY"] = CANARY
    try:
        svc.start()
        other = make_plugin(svc.home / "plugins", "other-plugin", {"ingest": "print('{}')\n"})
        (other / "notes.txt").write_text("other plugin's file")
        (svc.home / "plugin_data" / "other-plugin").mkdir(parents=True, exist_ok=True)
        (svc.home / "plugin_data" / "other-plugin" / "state.json").write_text('{"other": true}')
        yield svc
    finally:
        svc.stop()


def service_files(svc: LiveService, own: str) -> list[str]:
    """Every file under the service's home that is not the plugin's own (secrets, database, other plugins)."""
    out = []
    for path in svc.home.rglob("*"):
        rel = path.relative_to(svc.home).parts
        if path.is_file() and rel[:2] not in (("plugins", own), ("plugin_data", own)):
            out.append(str(path))
    return out


def call_plugin(svc: LiveService, name: str, hooks: dict, request: dict, *, warm: bool, runtime: str = "python",
                extra: str = "", timeout: float = 60) -> dict:
    make_plugin(svc.home / "plugins", name, hooks, runtime=runtime, ext="py" if runtime == "python" else "sh",
                toml_extra=extra + ("" if warm else "\nwarm_start = false"))
    write_config(svc.home, plugin=name)
    status, body = svc.hook("ingest", {"agent_id": "a", "message": json.dumps(request)}, timeout=timeout)
    assert status == 200, body
    return body


def reply_of(body: dict, name: str):
    assert body["source"] == name, body
    return json.loads(body["memories"][0]["content"])


def marked_pids(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read()
                with open(f"/proc/{entry}/stat") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in cmdline and state != "Z":
                found.append(int(entry))
    return found


def gone(marker: str, within: float = 5.0) -> bool:
    return wait_until(lambda: marked_pids(marker), within, f"every process marked {marker} gone",
                      until=lambda pids: not pids) == []


SNOOP = """
import json, os, sys
req = json.loads(json.loads(sys.stdin.read())["message"])
req["canary"] = "".join(req["canary"])  # sent in pieces: the request itself is in our own LIBREFANG_MESSAGE
out = {"files": {}, "canary": [], "service": {}}
for path in req["files"]:
    try:
        open(path, "rb").read()
        out["files"][path] = "READ"
    except OSError as exc:
        out["files"][path] = type(exc).__name__
out["home"] = sorted(os.listdir(req["home"]))
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for pid in out["pids"]:
    for name in ("environ", "cmdline"):
        try:
            if req["canary"].encode() in open(f"/proc/{pid}/{name}", "rb").read():
                out["canary"].append(f"{pid}/{name}")
        except OSError:
            pass
for pid in req["service_pids"]:
    try:
        out["service"][str(pid)] = req["canary"].encode() in open(f"/proc/{pid}/environ", "rb").read()
    except OSError as exc:
        out["service"][str(pid)] = type(exc).__name__
print(json.dumps({"memories": [{"content": json.dumps(out)}]}))
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_python_hook_reaches_nothing_of_the_service(service, warm):
    name = f"snoop-{'warm' if warm else 'cold'}"
    files = service_files(service, name)
    assert any(f.endswith("librefang.sqlite3") for f in files) and any(f.endswith("api_token") for f in files)
    service_pids = [service.web.pid, *(w.pid for w in service.workers)]
    body = call_plugin(service, name, {"ingest": SNOOP}, {"files": files, "home": str(service.home),
                                                         "canary": list(CANARY), "service_pids": service_pids},
                        warm=warm)
    seen = reply_of(body, name)
    assert seen["files"] == {f: "FileNotFoundError" for f in files}
    assert seen["home"] == ["plugin_data", "plugins"]
    assert seen["canary"] == [] and set(seen["pids"]) <= {1, 2, 3}
    assert all(v is not True for v in seen["service"].values()), seen["service"]


def test_a_bash_hook_reaches_nothing_of_the_service(service):
    files = service_files(service, "snoop-bash")
    src = f"""
    read -r _
    found=""
    for f in {" ".join(files)}; do
        if [ -r "$f" ] && cat "$f" >/dev/null 2>&1; then found="$found $f"; fi
    done
    for p in /proc/[0-9]*; do
        if tr '\\0' '\\n' < "$p/environ" 2>/dev/null | grep -q {CANARY}; then found="$found $p/environ"; fi
    done
    echo "{{\\"memories\\": [{{\\"content\\": \\"found:$found\\"}}]}}"
    """
    body = call_plugin(service, "snoop-bash", {"ingest": src}, {}, warm=False, runtime="bash")
    assert body["source"] == "snoop-bash", body
    assert body["memories"][0]["content"] == "found:"


def _sleeper(marker: str) -> str:
    return f'[sys.executable, "-c", "import time; time.sleep(1000)", {marker!r}]'


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_double_forked_daemon_does_not_outlive_its_hook(service, warm):
    marker = "e2e-daemon-" + secrets.token_hex(6)
    src = f"""
    import json, os, sys
    sys.stdin.read()
    ready, running = os.pipe()  # close-on-exec: the daemon's copy of `running` closes as it execs
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv(sys.executable, {_sleeper(marker)})
        os._exit(0)
    os.close(running)
    os.wait()
    os.read(ready, 1)  # end of file: the daemon runs, its marker on its command line
    print(json.dumps({{"memories": [{{"content": json.dumps("daemonized")}}]}}))
    """
    name = f"daemonizer-{'warm' if warm else 'cold'}"
    assert reply_of(call_plugin(service, name, {"ingest": src}, {}, warm=warm), name) == "daemonized"
    assert gone(marker)


def test_a_bash_setsid_job_does_not_outlive_its_hook(service):
    stamp = str(secrets.randbelow(10**9)).rjust(9, "1")
    src = f"""
    read -r _
    setsid sleep 1000.{stamp} </dev/null >/dev/null 2>&1 &
    # until the job runs: "1000[.]<stamp>" matches its command line, not grep's own
    until grep -qsa "1000[.]{stamp}" /proc/[0-9]*/cmdline; do sleep 0.01; done
    echo '{{"memories": [{{"content": "detached"}}]}}'
    """
    body = call_plugin(service, "setsid-bash", {"ingest": src}, {}, warm=False, runtime="bash")
    assert body["source"] == "setsid-bash" and body["memories"][0]["content"] == "detached", body
    assert gone(f"1000.{stamp}")


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_hook_that_times_out_takes_its_detached_children_with_it(service, warm):
    marker = "e2e-timeout-" + secrets.token_hex(6)
    src = f"""
    import subprocess, sys, time
    sys.stdin.read()
    subprocess.Popen({_sleeper(marker)}, start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(300)
    """
    name = f"timeout-{'warm' if warm else 'cold'}"
    body = call_plugin(service, name, {"ingest": src}, {}, warm=warm, extra="hook_timeout_secs = 2")
    assert body["source"] == "default" and body["fallback_reason"].startswith(f"{name}: timeout"), body
    assert gone(marker)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_grandchild_holding_the_pipes_does_not_outlive_the_call(service, warm):
    marker = "e2e-pipes-" + secrets.token_hex(6)
    src = f"""
    import json, subprocess, sys
    sys.stdin.read()
    subprocess.Popen({_sleeper(marker)}, start_new_session=True)  # keeps our stdout/stderr open
    print(json.dumps({{"memories": [{{"content": json.dumps("answered")}}]}}), flush=True)
    """
    name = f"pipes-{'warm' if warm else 'cold'}"
    started = time.monotonic()
    assert reply_of(call_plugin(service, name, {"ingest": src}, {}, warm=warm), name) == "answered"
    assert time.monotonic() - started < 15
    assert gone(marker)


def test_the_service_still_serves_its_own_files(service):
    # the hooks above never touched the real home: the service reads its database and token as before
    assert Path(service.home / "api_token").read_text().strip() == service.token
    status, _ = service.request("GET", "/api/health", auth=False)
    assert status == 200
