"""Plugin and context-engine management routes: success shapes and validation errors (in-process client)."""

import hashlib
import json
import os
import subprocess
import tomllib

import pytest

from plugins_app.models import AuditEntry, HookMetric, HookTrace, IdempotentResponse, Role
from plugins_app.services.tokens import create_token
from tests.app.prometheus_text import prometheus_samples
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config


@pytest.fixture
def api(client, db, home):
    raw = create_token("owner", Role.OWNER)[1]

    def request(method, path, body=None, raw_body=None, headers=None, prefix="/api"):
        kw = {"HTTP_AUTHORIZATION": f"Bearer {raw}", **(headers or {})}
        fn = getattr(client, method.lower())
        if raw_body is not None:
            return fn(prefix + path, data=raw_body, content_type="application/json", **kw)
        if body is None:
            return fn(prefix + path, **kw)
        return fn(prefix + path, data=json.dumps(body), content_type="application/json", **kw)

    return request


def err(r):
    return r.json()["error"]["code"]


def test_it_lists_plugins_with_all_hooks(api, home):
    make_plugin(home.plugins_dir, "echo", {"ingest": PY_ECHO_INGEST})
    r = api("GET", "/plugins")
    assert r.status_code == 200
    body = r.json()
    assert body["total"] == 1 and body["offset"] == 0
    item = body["items"][0]
    assert item["name"] == "echo" and item["enabled"] and item["valid"] and item["hooks_valid"]
    assert set(item["hooks"]) == {"ingest", "after_turn", "assemble", "compact", "bootstrap", "prepare_subagent",
                                  "merge_subagent", "transform_tool_result", "on_event"}
    assert item["hooks"]["ingest"] == "hooks/ingest.py" and item["runtime"] == "python"
    assert api("GET", "/plugins?enabled=false").json()["total"] == 0
    assert api("GET", "/plugins?has_errors=true").json()["total"] == 0
    assert api("GET", "/plugins?enabled=maybe").status_code == 400


def test_it_shows_one_plugin_or_404(api, home):
    make_plugin(home.plugins_dir, "echo", {"ingest": PY_ECHO_INGEST})
    r = api("GET", "/plugins/echo")
    assert r.status_code == 200 and r.json()["hook_timeout_secs"] == 30 and r.json()["integrity_count"] == 0
    r = api("GET", "/plugins/missing")
    assert r.status_code == 404 and err(r) == "not_found"
    assert api("GET", "/plugins/..%2Fetc").status_code == 404


def test_it_scaffolds_201_409_400(api, home):
    r = api("POST", "/plugins/scaffold", {"name": "fresh", "description": 'a "quoted" one', "runtime": "bash"})
    assert r.status_code == 201, r.content
    assert r.json()["scaffolded"] and r.json()["plugin"]["runtime"] == "bash"
    assert api("POST", "/plugins/scaffold", {"name": "fresh"}).status_code == 409
    r = api("POST", "/plugins/scaffold", {"name": "x y"})
    assert r.status_code == 400 and err(r) == "validation_error"
    assert api("POST", "/plugins/bad%20name/reload").status_code == 400
    r = api("POST", "/plugins/scaffold", {"name": "z", "runtime": "cobol"})
    assert r.status_code == 400 and err(r) == "invalid_runtime"
    r = api("POST", "/plugins/scaffold", {"name": "z", "hooks": ["nope"]})
    assert r.status_code == 400 and err(r) == "validation_error"
    r = api("POST", "/plugins/scaffold", {"name": 5})
    assert r.status_code == 400
    r = api("POST", "/plugins/scaffold", raw_body=b"{not json")
    assert r.status_code == 400 and err(r) == "invalid_json"
    r = api("POST", "/plugins/scaffold", raw_body=b"[]")
    assert r.status_code == 400


def test_it_reloads_and_rejects_a_broken_manifest(api, home):
    pdir = make_plugin(home.plugins_dir, "rel", {"ingest": PY_ECHO_INGEST})
    r = api("POST", "/plugins/rel/reload")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["hooks"] == ["ingest"]
    text = (pdir / "plugin.toml").read_text()
    (pdir / "plugin.toml").write_text(text.replace("[hooks]", "[hooks]\nhook_timeout_secs = 7"))
    r = api("POST", "/plugins/rel/reload")
    assert r.json()["hook_timeout_secs"] == 7
    (pdir / "plugin.toml").write_text(text + "\nthis is = = broken\n")
    r = api("POST", "/plugins/rel/reload")
    assert r.status_code == 400 and err(r) == "invalid_manifest" and r.json()["error"]["details"]
    # the previous configuration keeps serving
    from plugins_app.services.engine import get_engine

    entry = get_engine().catalog.get("rel")
    assert entry.plugin is not None and entry.plugin.manifest.hooks.hook_timeout_secs == 7
    assert api("POST", "/plugins/nope/reload").status_code == 404
    assert AuditEntry.objects.filter(action="plugin.reload", ok=False).exists()


def test_it_enables_and_disables(api, home):
    pdir = make_plugin(home.plugins_dir, "tog", {"ingest": PY_ECHO_INGEST})
    r = api("POST", "/plugins/tog/disable")
    assert r.status_code == 200 and r.json() == {**r.json(), "enabled": False, "changed": True}
    assert (pdir / ".disabled").exists()
    assert api("POST", "/plugins/tog/disable").json()["changed"] is False
    assert api("GET", "/plugins/tog").json()["enabled"] is False
    r = api("POST", "/plugins/tog/enable")
    assert r.json()["enabled"] and not (pdir / ".disabled").exists()
    assert api("POST", "/plugins/nope/enable").status_code == 404


def test_it_lints_200_or_422(api, home):
    make_plugin(home.plugins_dir, "good", {"ingest": PY_ECHO_INGEST})
    r = api("GET", "/plugins/good/lint")
    assert r.status_code == 200 and r.json()["ok"] is True
    pdir = make_plugin(home.plugins_dir, "bad", {"ingest": PY_ECHO_INGEST})
    (pdir / "hooks/ingest.py").unlink()
    r = api("GET", "/plugins/bad/lint")
    assert r.status_code == 422 and r.json()["ok"] is False
    assert r.json()["errors"][0]["id"] == "hook.missing" and r.json()["errors"][0]["hint"]
    assert api("GET", "/plugins/none/lint").status_code == 404


def test_it_runs_the_doctor(api, home):
    make_plugin(home.plugins_dir, "doc", {"ingest": PY_ECHO_INGEST})
    make_plugin(home.plugins_dir, "nolauncher", {"ingest": "x"}, runtime="deno", ext="ts")
    body = api("GET", "/plugins/doctor").json()
    runtimes = {r["runtime"]: r for r in body["runtimes"]}
    assert len(runtimes) == 12 and runtimes["python"]["available"] and runtimes["python"]["version"]
    assert runtimes["native"]["launcher"] is None and runtimes["wasm"]["available"]
    plugins = {p["name"]: p for p in body["plugins"]}
    assert plugins["doc"]["runtime_available"] and plugins["doc"]["hooks_valid"]
    if not runtimes["deno"]["available"]:
        assert plugins["nolauncher"]["runtime_available"] is False and plugins["nolauncher"]["install_hint"]


def test_it_test_hooks_validate_before_reaching_a_worker(api, home):
    make_plugin(home.plugins_dir, "th", {"ingest": PY_ECHO_INGEST})
    r = api("POST", "/plugins/th/test-hook", {"hook": "bogus", "input": {}})
    assert r.status_code == 400
    r = api("POST", "/plugins/th/test-hook", {"hook": "assemble", "input": {"messages": []}})
    assert r.status_code == 400 and err(r) == "hook_not_declared"
    r = api("POST", "/plugins/th/test-hook", {"hook": "ingest", "input": {"agent_id": 5}})
    assert r.status_code == 400 and err(r) == "validation_error"
    r = api("POST", "/plugins/zz/test-hook", {"hook": "ingest", "input": {"agent_id": "a", "message": "m"}})
    assert r.status_code == 404


def _git_repo(path, name, body="v1"):
    make_plugin(path.parent, path.name, {"ingest": PY_ECHO_INGEST})
    toml = path / "plugin.toml"
    toml.write_text(toml.read_text().replace(f'name = "{path.name}"', f'name = "{name}"'))
    (path / "notes.txt").write_text(body)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "v1"], cwd=path, check=True)


def test_it_installs_from_a_local_path_with_idempotency(api, home, tmp_path):
    src = make_plugin(tmp_path / "src", "localp", {"ingest": PY_ECHO_INGEST})
    (src / "link").symlink_to("/etc/passwd")
    headers = {"HTTP_IDEMPOTENCY_KEY": "k-1"}
    r = api("POST", "/plugins/install", {"source": "local", "path": str(src)}, headers=headers)
    assert r.status_code == 201, r.content
    assert r.json()["installed"] and r.json()["skipped_symlinks"] == ["link"]
    assert not (home.plugin_dir("localp") / "link").exists()
    lock = json.loads(home.lockfile.read_text())
    assert set(lock["plugins"]["localp"]["files"]) == {"plugin.toml", "hooks/ingest.py"}
    again = api("POST", "/plugins/install", {"source": "local", "path": str(src)}, headers=headers)
    assert again.status_code == 201 and again.json()["idempotent_replay"] is True
    assert IdempotentResponse.objects.filter(key="k-1").count() == 1
    r = api("POST", "/plugins/install", {"source": "local", "path": "/elsewhere"}, headers=headers)
    assert r.status_code == 409 and err(r) == "idempotency_conflict"
    r = api("POST", "/plugins/install", {"source": "local", "path": str(src)})
    assert r.status_code == 409 and err(r) == "already_installed"


@pytest.mark.parametrize("body,code", [
    ({"source": "local", "path": "relative/dir"}, "invalid_source"),
    ({"source": "local", "path": "/definitely/not/here"}, "not_a_plugin"),
    ({"source": "local"}, "invalid_source"),
    ({"source": "git", "url": "--upload-pack=evil"}, "invalid_source"),
    ({"source": "git", "url": "ftp://x/y"}, "invalid_source"),
    ({"source": "registry", "name": "../x", "registry": "/tmp"}, "invalid_name"),
    ({"source": "git", "url": "ssh://nobody@127.0.0.1:1/none.git"}, "git_failed"),
    ({"source": "warez"}, "validation_error"),
])
def test_it_rejects_bad_install_sources(api, home, body, code):
    r = api("POST", "/plugins/install", body)
    assert r.status_code == 400 and err(r) == code, r.content


def test_it_rejects_an_integrity_mismatch(api, home, tmp_path):
    src = make_plugin(tmp_path / "src", "signed", {"ingest": PY_ECHO_INGEST},
                      top_extra='[integrity]\n"hooks/ingest.py" = "' + "0" * 64 + '"')
    r = api("POST", "/plugins/install", {"source": "local", "path": str(src)})
    assert r.status_code == 400 and err(r) == "integrity_failed"
    assert not home.plugin_dir("signed").exists()
    assert not [p for p in home.plugins_dir.iterdir() if p.name.startswith(".staging")]


def test_it_installs_from_git_updates_and_uninstalls(api, home, tmp_path):
    repo = tmp_path / "repo"
    _git_repo(repo, "gitp")
    r = api("POST", "/plugins/install", {"source": "git", "url": f"file://{repo}", "ref": "main"})
    assert r.status_code == 201, r.content
    lock = json.loads(home.lockfile.read_text())["plugins"]["gitp"]
    assert lock["source"] == {"kind": "git", "url": f"file://{repo}", "ref": "main"} and len(lock["provenance"]["commit"]) == 40
    # upstream change, then a local edit: update refuses until forced
    (repo / "notes.txt").write_text("v2")
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "v2"], cwd=repo, check=True)
    (home.plugin_dir("gitp") / "notes.txt").write_text("my local edit")
    r = api("POST", "/plugins/gitp/update", {})
    assert r.status_code == 409 and err(r) == "locally_modified"
    assert r.json()["error"]["details"]["modified"] == ["notes.txt"]
    r = api("POST", "/plugins/gitp/update", {"force": True})
    assert r.status_code == 200 and r.json()["updated"]
    assert (home.plugin_dir("gitp") / "notes.txt").read_text() == "v2"
    lock2 = json.loads(home.lockfile.read_text())["plugins"]["gitp"]
    assert lock2["provenance"]["commit"] != lock["provenance"]["commit"]
    r = api("POST", "/plugins/uninstall", {"name": "gitp"})
    assert r.status_code == 200 and r.json()["removed"]
    assert "gitp" not in json.loads(home.lockfile.read_text())["plugins"]
    assert api("POST", "/plugins/uninstall", {"name": "gitp"}).status_code == 404
    assert api("POST", "/plugins/uninstall", {}).status_code == 400


def test_it_installs_from_a_local_registry_with_either_key(api, home, tmp_path):
    reg = tmp_path / "registry"
    src = make_plugin(reg / "plugins", "regp", {"ingest": PY_ECHO_INGEST})
    (src / "data").mkdir()
    (src / "data/words.txt").write_text("kafka\n")
    (src / "hooks/evil").symlink_to("/etc/passwd")
    r = api("POST", "/plugins/install", {"source": "registry", "name": "regp", "github_repo": str(reg)})
    assert r.status_code == 201, r.content
    assert r.json()["skipped_symlinks"] == ["hooks/evil"] and r.json()["files"] == 3

    def installed_as_in_the_registry(key):
        target = home.plugin_dir("regp")
        assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
            "data/words.txt", "hooks/ingest.py", "plugin.toml"]
        for rel in ("data/words.txt", "hooks/ingest.py", "plugin.toml"):
            assert (target / rel).read_bytes() == (src / rel).read_bytes()
        entry = json.loads(home.lockfile.read_text())["plugins"]["regp"]
        assert entry["source"] == {"kind": "registry", "registry": str(reg), "name": "regp"}
        assert entry["provenance"] == {"registry_path": str(reg.resolve())} and entry["version"] == "0.1.0"
        assert entry["files"] == {rel: hashlib.sha256((src / rel).read_bytes()).hexdigest()
                                  for rel in ("data/words.txt", "hooks/ingest.py", "plugin.toml")}, key
    installed_as_in_the_registry("github_repo")
    api("POST", "/plugins/uninstall", {"name": "regp"})
    r = api("POST", "/plugins/install", {"source": "registry", "name": "regp", "registry": str(reg)})
    assert r.status_code == 201
    installed_as_in_the_registry("registry")
    r = api("POST", "/plugins/install", {"source": "registry", "name": "absent", "registry": str(reg)})
    assert r.status_code == 404
    r = api("POST", "/plugins/install", {"source": "registry", "name": "regp"})
    assert r.status_code == 400 and err(r) == "no_registry"
    # the configured default registry ([plugins] registry in config.toml)
    api("POST", "/plugins/uninstall", {"name": "regp"})
    home.config_path.write_text(f'[plugins]\nregistry = "{reg}"\n')
    r = api("POST", "/plugins/install", {"source": "registry", "name": "regp"})
    assert r.status_code == 201, r.content
    assert (home.plugin_dir("regp") / "data/words.txt").read_text() == "kafka\n"
    assert json.loads(home.lockfile.read_text())["plugins"]["regp"]["source"] == {"kind": "registry", "name": "regp"}


def test_it_updates_untracked_plugins_with_409(api, home):
    make_plugin(home.plugins_dir, "handmade", {"ingest": PY_ECHO_INGEST})
    r = api("POST", "/plugins/handmade/update")
    assert r.status_code == 409 and err(r) == "not_tracked"


def test_it_sets_the_engine_config_preserving_comments(api, home):
    make_plugin(home.plugins_dir, "a", {"ingest": PY_ECHO_INGEST})
    make_plugin(home.plugins_dir, "b", {"ingest": PY_ECHO_INGEST})
    home.config_path.write_text("# my notes\n[context_engine]\n# keep me\nmax_recall_results = 3\n\n[llm]\nmodel = \"m\"\n")
    r = api("PUT", "/context-engine/config", {"plugin_stack": ["a", "b"]})
    assert r.status_code == 200 and r.json()["plugin_stack"] == ["a", "b"] and r.json()["mode"] == "stacked"
    text = home.config_path.read_text()
    assert "# my notes" in text and "# keep me" in text and 'model = "m"' in text
    assert tomllib.loads(text)["context_engine"]["max_recall_results"] == 3
    r = api("PUT", "/context-engine/config", {"plugin": "a"})
    assert r.json()["plugin"] == "a" and r.json()["plugin_stack"] == []
    assert api("GET", "/context-engine/config").json()["mode"] == "single"
    chain = api("GET", "/context-engine/chain").json()
    assert chain["mode"] == "single" and chain["chain"][0]["plugin"] == "a" and chain["chain"][0]["hooks"]["ingest"]
    assert api("PUT", "/context-engine/config", {"plugin": "ghost"}).status_code == 400
    assert api("PUT", "/context-engine/config", {"plugin": "a", "plugin_stack": ["b"]}).status_code == 400
    assert api("PUT", "/context-engine/config", {"plugin_stack": "a"}).status_code == 400
    assert api("PUT", "/context-engine/config", {}).status_code == 400  # not a switch to the default engine
    assert api("GET", "/context-engine/config").json()["mode"] == "single"
    r = api("PUT", "/context-engine/config", {"plugin": None})
    assert r.json()["mode"] == "default"


def test_it_reports_engine_health(api, home):
    pdir = make_plugin(home.plugins_dir, "h", {"ingest": PY_ECHO_INGEST})
    r = api("GET", "/context-engine/health")
    assert r.status_code == 200 and r.json()["healthy"] and r.json()["mode"] == "default"
    write_config(home.root, plugin="h")
    assert api("GET", "/context-engine/health").json()["active_plugins"] == ["h"]
    (pdir / "hooks/ingest.py").unlink()
    r = api("GET", "/context-engine/health")
    assert r.status_code == 503 and r.json()["issues"][0]["plugin"] == "h"


def test_it_serves_metrics_summary_prometheus_and_reset(api, home):
    HookMetric.objects.create(plugin="p", hook="ingest", calls=4, successes=3, failures=1, latency_ms_total=40,
                              histogram={"10": 3, "20": 1})
    s = api("GET", "/context-engine/metrics/summary").json()
    assert s["hooks"]["ingest"]["calls"] == 4 and s["hooks"]["ingest"]["error_rate_pct"] == 25.0
    assert s["totals"]["avg_ms"] == 10.0
    r = api("GET", "/context-engine/metrics/prometheus")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = prometheus_samples(r.content.decode())
    assert samples["librefang_hook_calls_total", ("p", "ingest")] == 4
    assert samples["librefang_hook_errors_total", ("p", "ingest")] == 1
    assert samples["librefang_hook_duration_ms_bucket", ("p", "ingest", "10")] == 3
    assert samples["librefang_hook_duration_ms_bucket", ("p", "ingest", "5")] == 0
    assert samples["librefang_hook_duration_ms_bucket", ("p", "ingest", "+Inf")] == 4
    assert samples["librefang_hook_duration_ms_sum", ("p", "ingest")] == 40
    assert api("GET", "/context-engine/metrics").json()["plugins"]["p"]["ingest"]["calls"] == 4
    r = api("POST", "/context-engine/metrics/reset", {})
    assert r.status_code == 200 and r.json()["reset"]
    assert api("GET", "/context-engine/metrics").json() == {"plugins": {}}


def test_it_lists_filters_and_gets_traces(api, home):
    from django.utils import timezone

    for i, (plugin, ok) in enumerate([("p1", True), ("p1", False), ("p2", True)]):
        HookTrace.objects.create(trace_id=f"{i:016x}", plugin=plugin, hook="ingest", agent_id=f"ag{i}",
                                 started_at=timezone.now(), elapsed_ms=1.5, ok=ok, error="boom" if not ok else "")
    assert api("GET", "/context-engine/traces").json()["count"] == 3
    assert api("GET", "/context-engine/traces?plugin=p1").json()["count"] == 2
    assert api("GET", "/context-engine/traces?plugin=p1&failures_only=true").json()["count"] == 1
    assert api("GET", "/context-engine/traces?agent=ag2").json()["traces"][0]["plugin"] == "p2"
    assert api("GET", "/context-engine/traces?limit=0").status_code == 400
    r = api("GET", "/context-engine/traces/0000000000000001")
    assert r.status_code == 200 and r.json()["error"] == "boom" and "stderr_tail" in r.json()
    assert api("GET", "/context-engine/traces/XYZ").status_code == 400
    assert api("GET", "/context-engine/traces/ffffffffffffffff").status_code == 404


def test_it_answers_oversized_and_malformed_hook_bodies_with_4xx(api, home, settings):
    settings.LIBREFANG_MAX_BODY_BYTES = 1000
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    r = api("POST", "/context-engine/hooks/after_turn", raw_body=json.dumps({"agent_id": "a", "messages": [],
                                                                              "pad": "x" * 5000}).encode())
    assert r.status_code == 413 and err(r) == "payload_too_large"
    r = api("POST", "/plugins/scaffold", raw_body=json.dumps({"name": "x" * 5000}).encode())
    assert r.status_code == 413
    r = api("POST", "/context-engine/hooks/unknown_hook", {})
    assert r.status_code == 404 and err(r) == "unknown_hook"
    r = api("POST", "/context-engine/hooks/after_turn", raw_body=b"\xff\xfe")
    assert r.status_code == 400


def test_it_refuses_install_deps_for_a_plugin_that_is_not_installed(api):
    # the install itself runs on a worker: see tests/e2e/test_api_lifecycle.py
    assert api("POST", "/plugins/ghost/install-deps").status_code == 404


def test_it_answers_unknown_api_paths_with_the_json_envelope(api):
    for path in ("/nope", "/plugins/a/b/c", "/context-engine/nothing"):
        r = api("GET", path)
        assert r.status_code == 404 and err(r) == "not_found"
    r = api("POST", "/plugins/x/frobnicate", prefix="/api/v1")
    assert r.status_code == 404 and err(r) == "not_found"


def test_it_answers_a_wrong_method_with_405_in_the_envelope(api):
    r = api("DELETE", "/plugins")
    assert r.status_code == 405 and err(r) == "method_not_allowed" and r["Allow"] == "GET"
    r = api("GET", "/context-engine/metrics/reset")
    assert r.status_code == 405 and r["Allow"] == "POST"


def test_it_installs_from_a_git_registry_at_a_ref(api, home, tmp_path):
    reg = tmp_path / "gitreg"
    make_plugin(reg / "plugins", "inreg", {"ingest": PY_ECHO_INGEST})
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=reg, check=True)
    subprocess.run([*git, "add", "-A"], cwd=reg, check=True)
    subprocess.run([*git, "commit", "-qm", "r1"], cwd=reg, check=True)
    subprocess.run([*git, "tag", "v1"], cwd=reg, check=True)
    r = api("POST", "/plugins/install", {"source": "registry", "name": "inreg", "registry": f"file://{reg}",
                                         "ref": "v1"})
    assert r.status_code == 201, r.content
    lock = json.loads(home.lockfile.read_text())["plugins"]["inreg"]
    assert lock["source"]["kind"] == "registry" and lock["provenance"]["registry_url"] == f"file://{reg}"
    assert len(lock["provenance"]["commit"]) == 40


def test_it_reports_status_and_health_in_librefang_shapes(api, home):
    make_plugin(home.plugins_dir, "st", {"ingest": PY_ECHO_INGEST})
    make_plugin(home.plugins_dir, "st2", {"ingest": PY_ECHO_INGEST})
    write_config(home.root, stack=["st2", "st"])
    body = api("GET", "/plugins/st/status").json()
    assert body["active"] and body["stack_position"] == 1 and not body["active_as_single"] and body["size_bytes"] > 0
    HookMetric.objects.create(plugin="st", hook="ingest", calls=2, successes=1, failures=1, latency_ms_total=10)
    body = api("GET", "/plugins/st/health").json()
    assert body["status"] == "loaded" and body["hook_stats"]["ingest"]["error_rate_pct"] == 50.0
    api("POST", "/plugins/st/disable")
    assert api("GET", "/plugins/st/health").json()["status"] == "disabled"
    assert api("GET", "/plugins/st/status").json()["active"] is False
    assert api("GET", "/plugins/none/status").status_code == 404
    r = api("GET", "/context-engine/traces/history?limit=10&plugin=st")
    assert r.status_code == 200 and r.json()["limit"] == 10 and r.json()["filters"]["plugin"] == "st"


@pytest.fixture
def git_spy(tmp_path, monkeypatch):
    """The real git, behind a wrapper on PATH that logs each argv (one JSON list a line) before running it."""
    import shutil
    import sys

    real = shutil.which("git")
    bindir = tmp_path / "spybin"
    bindir.mkdir()
    log = tmp_path / "git-calls.log"
    wrapper = bindir / "git"
    wrapper.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                       f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                       f"os.execv({real!r}, [{real!r}, *sys.argv[1:]])\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    class Spy:
        def reset(self):
            log.unlink(missing_ok=True)

        def __call__(self):
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return Spy()


@pytest.mark.parametrize("source", ["git", "registry"])
@pytest.mark.parametrize("ref", ["--pathspec-from-file=/etc/passwd", "-b", "main..evil", "HEAD@{1}", "a b",
                                 "x^", "--upload-pack=touch /tmp/pwned"])
def test_it_refuses_option_like_refs_before_git_runs(api, home, tmp_path, git_spy, source, ref):
    repo = tmp_path / "repo"
    _git_repo(repo, "gitp")
    git_spy.reset()
    body = {"source": "git", "url": f"file://{repo}", "ref": ref} if source == "git" else \
        {"source": "registry", "name": "gitp", "registry": f"file://{repo}", "ref": ref}
    r = api("POST", "/plugins/install", body)
    assert r.status_code == 400 and err(r) == "invalid_ref", r.content
    assert "root:" not in r.content.decode()
    assert git_spy() == []  # git never ran
    assert not home.plugin_dir("gitp").exists()


def test_it_ends_git_options_before_user_input_and_checks_out_a_commit(api, home, tmp_path, git_spy):
    repo = tmp_path / "repo"
    _git_repo(repo, "gitp")
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    (repo / "notes.txt").write_text("v2")
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "v2"], cwd=repo, check=True)
    git_spy.reset()
    r = api("POST", "/plugins/install", {"source": "git", "url": f"file://{repo}", "ref": first})
    assert r.status_code == 201, r.content
    assert (home.plugin_dir("gitp") / "notes.txt").read_text() == "v1"  # the commit asked for, not main
    assert json.loads(home.lockfile.read_text())["plugins"]["gitp"]["provenance"]["commit"] == first
    calls = [c for c in git_spy() if c[0] in ("clone", "switch", "checkout")]
    assert calls, "git was not called"
    for argv in calls:  # the URL and the ref only ever come after --end-of-options
        for value in (f"file://{repo}", first):
            if value in argv:
                assert argv.index("--end-of-options") < argv.index(value), argv
