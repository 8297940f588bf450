"""The lifecycle API against a real service (daphne + worker + Redis): reload proven live, test-hook through the
worker, abort policy, install → update → uninstall with the lockfile."""

import json
import subprocess

from tests.plugin_factory import PY_ECHO_INGEST, make_plugin
from tests.waiting import wait_until

ENV_INGEST = """
import json, os, sys, time
req = json.loads(sys.stdin.read())
print("ingest sees MARKER=" + os.environ.get("MARKER", ""), file=sys.stderr)
if "sleep" in req["message"]:
    time.sleep(4)  # the point: longer than the plugin's timeout
print(json.dumps({"type": "ingest_result", "memories": [{"content": "marker " + os.environ.get("MARKER", "")}]}))
"""
ASSEMBLE = """
import json, sys
req = json.loads(sys.stdin.read())
print(json.dumps({"type": "assemble_result", "messages": req["messages"][-1:]}))
"""


def _use(live, **body):
    status, reply = live.request("PUT", "/api/context-engine/config", body or {"plugin": None})
    assert status == 200, reply
    return reply


def _memories(reply):
    return [m["content"] for m in reply["memories"]]


def test_it_reloads_timeout_env_and_hooks_live_and_keeps_serving_on_a_broken_manifest(live):
    pdir = make_plugin(live.home / "plugins", "reloady", {"ingest": ENV_INGEST},
                       toml_extra="hook_timeout_secs = 10\n[env]\nMARKER = \"one\"")
    try:
        _use(live, plugin="reloady")
        status, reply = live.hook("ingest", {"agent_id": "r1", "message": "hello"})
        assert status == 200 and "marker one" in _memories(reply) and reply["source"] == "reloady"
        status, reply = live.hook("assemble", {"agent_id": "r1", "messages": [{"role": "user", "content": "a"},
                                                                              {"role": "user", "content": "b"}]})
        assert reply["source"] == "default"  # no assemble hook yet

        (pdir / "hooks/assemble.py").write_text(ASSEMBLE)
        text = (pdir / "plugin.toml").read_text()
        text = text.replace("hook_timeout_secs = 10", "hook_timeout_secs = 1.5").replace('MARKER = "one"',
                                                                                       'MARKER = "two"')
        text = text.replace('ingest = "hooks/ingest.py"', 'ingest = "hooks/ingest.py"\nassemble = "hooks/assemble.py"')
        (pdir / "plugin.toml").write_text(text)
        status, body = live.request("POST", "/api/plugins/reloady/reload")
        assert status == 200 and body["hook_timeout_secs"] == 1.5 and body["hooks"] == ["assemble", "ingest"]

        status, reply = live.hook("ingest", {"agent_id": "r1", "message": "hello again"})
        assert "marker two" in _memories(reply), reply  # [env]
        status, reply = live.hook("assemble", {"agent_id": "r1", "messages": [{"role": "user", "content": "a"},
                                                                              {"role": "user", "content": "b"}]})
        assert reply["source"] == "reloady" and [m["content"] for m in reply["messages"]] == ["b"]  # new hook
        status, reply = live.hook("ingest", {"agent_id": "r1", "message": "please sleep"})
        assert reply["source"] == "default" and "timeout" in reply["fallback_reason"], reply  # 1.5 s timeout

        (pdir / "plugin.toml").write_text(text + "\n[[[ this is not toml\n")
        status, body = live.request("POST", "/api/plugins/reloady/reload")
        assert status == 400 and body["error"]["code"] == "invalid_manifest"
        status, reply = live.hook("ingest", {"agent_id": "r1", "message": "still there?"})
        assert status == 200 and reply["source"] == "reloady" and "marker two" in _memories(reply), reply
    finally:
        _use(live)


def test_it_test_hooks_through_the_worker_and_records_a_trace(live):
    make_plugin(live.home / "plugins", "probe", {"ingest": ENV_INGEST}, toml_extra='[env]\nMARKER = "t"')
    status, body = live.request("POST", "/api/plugins/probe/test-hook",
                                {"hook": "ingest", "input": {"agent_id": "t1", "message": "hi"}})
    assert status == 200 and body["ok"] and body["success"], body
    assert body["reply"]["memories"][0]["content"] == "marker t"
    assert "MARKER=t" in body["stderr"] and body["elapsed_ms"] > 0 and len(body["trace_id"]) == 16
    status, trace = wait_until(lambda: live.request("GET", f"/api/context-engine/traces/{body['trace_id']}"), 20,
                               "the test run's trace stored", until=lambda answer: answer[0] == 200)
    assert status == 200 and trace["plugin"] == "probe" and trace["success"]
    rows = live.manage("shell", "-c", "from plugins_app.models import AuditEntry as A; "
                       "print(A.objects.filter(action='plugin.test_hook', target='probe').count())").stdout
    assert int(rows.strip().splitlines()[-1]) >= 1

    crash = make_plugin(live.home / "plugins", "crasher", {"ingest": "import sys\nprint('bad', file=sys.stderr)\nsys.exit(7)\n"})
    assert crash.exists()
    status, body = live.request("POST", "/api/plugins/crasher/test-hook",
                                {"hook": "ingest", "input": {"agent_id": "t1", "message": "x"}})
    assert status == 200 and body["ok"] is False and body["error"]["kind"] == "script_error", body
    assert "bad" in body["stderr"]


def test_it_answers_502_hook_aborted_for_an_abort_policy(live):
    make_plugin(live.home / "plugins", "aborter", {"ingest": "import sys\nsys.exit(3)\n"},
                toml_extra='on_hook_failure = "abort"')
    try:
        _use(live, plugin="aborter")
        status, body = live.hook("ingest", {"agent_id": "a1", "message": "x"})
        assert status == 502 and body["error"]["code"] == "hook_aborted", body
        assert body["error"]["details"]["plugin"] == "aborter"
    finally:
        _use(live)


def test_it_installs_from_git_and_a_registry_then_updates_and_uninstalls(live, tmp_path):
    repo = make_plugin(tmp_path, "fromgit", {"ingest": PY_ECHO_INGEST})
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], cwd=repo, check=True)
    lockfile = live.home / "plugins.lock"

    status, body = live.request("POST", "/api/v1/plugins/install", {"source": "git", "url": str(repo)},
                                headers={"Idempotency-Key": "e2e-git-1"})
    assert status == 201, body
    files = json.loads(lockfile.read_text())["plugins"]["fromgit"]["files"]
    assert set(files) == {"plugin.toml", "hooks/ingest.py"}
    status, again = live.request("POST", "/api/v1/plugins/install", {"source": "git", "url": str(repo)},
                                 headers={"Idempotency-Key": "e2e-git-1"})
    assert status == 201 and again["idempotent_replay"]

    status, body = live.request("POST", "/api/plugins/fromgit/test-hook",
                                {"hook": "ingest", "input": {"agent_id": "g", "message": "installed"}})
    assert body["ok"] and body["reply"]["memories"][0]["content"] == "echo: installed"

    (live.home / "plugins/fromgit/hooks/ingest.py").write_text(PY_ECHO_INGEST.replace("echo:", "local:"))
    status, body = live.request("POST", "/api/plugins/fromgit/update", {})
    assert status == 409 and body["error"]["details"]["modified"] == ["hooks/ingest.py"]
    status, body = live.request("POST", "/api/plugins/fromgit/update", {"force": True})
    assert status == 200, body
    new_files = json.loads(lockfile.read_text())["plugins"]["fromgit"]["files"]
    assert new_files == files

    registry = tmp_path / "registry"
    make_plugin(registry / "plugins", "fromreg", {"ingest": PY_ECHO_INGEST})
    status, body = live.request("POST", "/api/plugins/install",
                                {"source": "registry", "name": "fromreg", "registry": str(registry)})
    assert status == 201, body
    assert "fromreg" in json.loads(lockfile.read_text())["plugins"]

    for name in ("fromgit", "fromreg"):
        status, body = live.request("POST", "/api/plugins/uninstall", {"name": name})
        assert status == 200 and body["removed"]
        assert name not in json.loads(lockfile.read_text())["plugins"]
        assert not (live.home / "plugins" / name).exists()


def test_it_cli_test_hook_goes_through_a_live_worker(live):
    import sys

    make_plugin(live.home / "plugins", "clivia", {"ingest": PY_ECHO_INGEST})
    r = subprocess.run([sys.executable, "-m", "librefang_site.cli", "plugin", "test-hook", "clivia", "ingest", "--json",
                        "--input", '{"agent_id": "c", "message": "via cli"}'], env=live.env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["via"].startswith("via worker") and out["reply"]["memories"][0]["content"] == "echo: via cli"


def test_it_installs_deps_on_a_worker_into_the_plugin_venv_or_reports_the_failure(live):
    status, body = live.request("POST", "/api/plugins/scaffold", {"name": "deps", "runtime": "python"})
    assert status == 201, body
    pdir = live.home / "plugins" / "deps"
    (pdir / "requirements.txt").write_text("# nothing to install\n")
    status, body = live.request("POST", "/api/plugins/deps/install-deps")
    assert status == 200 and body["success"] is True, body
    assert (live.home / "plugin_data" / "deps" / "venv" / "bin" / "python").exists()
    (pdir / "requirements.txt").write_text("this is not a valid requirement !!!\n")
    status, body = live.request("POST", "/api/plugins/deps/install-deps")
    assert status == 400 and body["error"]["code"] == "install_deps_failed", body
    status, body = live.request("GET", "/api/plugins/nope-nope/lint")
    assert status == 404
