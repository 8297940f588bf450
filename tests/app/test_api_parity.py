"""LibreFang's further plugin and context-engine routes, by what they do (in-process client, real files, real git
where a source is fetched). tests/e2e/test_parity_e2e.py runs benchmark through a real worker."""

import io
import json
import tarfile
import tomllib

import pytest
from django.utils import timezone

from plugins_app.models import AuditEntry, HookTrace, Role
from plugins_app.services.tokens import create_token
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client, home):
    tokens = {role: create_token(f"t-{role}", role)[1] for role in (Role.OWNER, Role.ADMIN, Role.VIEWER, Role.AGENT)}

    def request(method, path, body=None, role=Role.OWNER, content_type="application/json", prefix="/api"):
        kw = {"HTTP_AUTHORIZATION": f"Bearer {tokens[role]}"}
        fn = getattr(client, method.lower())
        if body is None:
            return fn(prefix + path, **kw)
        return fn(prefix + path, data=json.dumps(body), content_type=content_type, **kw)
    return request


def code(r):
    return r.json()["error"]["code"]


def registry_with(tmp_path, plugins: dict[str, dict]):
    """A local registry: plugins/<name>/ with the given plugin.toml top-level extras (version, plugin_depends)."""
    reg = tmp_path / "registry"
    for name, spec in plugins.items():
        pdir = make_plugin(reg / "plugins", name, {"ingest": PY_ECHO_INGEST}, top_extra=spec.get("extra", ""))
        if "version" in spec:
            toml = pdir / "plugin.toml"
            toml.write_text(toml.read_text().replace('version = "0.1.0"', f'version = "{spec["version"]}"'))
    return reg


# ---- install-with-deps ----

def test_it_installs_a_plugin_after_its_dependencies(api, home, tmp_path):
    reg = registry_with(tmp_path, {"app": {"extra": 'plugin_depends = ["mid", "base"]'},
                                   "mid": {"extra": 'plugin_depends = ["base"]'}, "base": {}, "unrelated": {}})
    make_plugin(home.plugins_dir, "base", {"ingest": PY_ECHO_INGEST})  # already there: kept as it is
    (home.plugin_dir("base") / "mine.txt").write_text("local")
    r = api("POST", "/plugins/install-with-deps", {"name": "app", "registry": str(reg)})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["order"] == ["base", "mid", "app"] and body["installed"] == ["mid", "app"]
    assert body["already_installed"] == ["base"] and body["count"] == 2
    lock = json.loads(home.lockfile.read_text())["plugins"]
    assert set(lock) == {"mid", "app"} and lock["app"]["source"]["name"] == "app"
    assert (home.plugin_dir("app") / "hooks/ingest.py").is_file() and not home.plugin_dir("unrelated").exists()
    assert (home.plugin_dir("base") / "mine.txt").read_text() == "local"


def test_it_refuses_a_dependency_cycle_or_a_missing_dependency(api, home, tmp_path):
    reg = registry_with(tmp_path, {"a": {"extra": 'plugin_depends = ["b"]'}, "b": {"extra": 'plugin_depends = ["a"]'},
                                   "c": {"extra": 'plugin_depends = ["ghost"]'}})
    r = api("POST", "/plugins/install-with-deps", {"name": "a", "registry": str(reg)})
    assert r.status_code == 400 and code(r) == "dependency_cycle" and "a -> b -> a" in r.json()["error"]["message"]
    r = api("POST", "/plugins/install-with-deps", {"name": "c", "registry": str(reg)})
    assert r.status_code == 400 and code(r) == "dependency_not_found"
    assert api("POST", "/plugins/install-with-deps", {"name": "zzz", "registry": str(reg)}).status_code == 404
    assert not [p for p in home.plugins_dir.iterdir() if not p.name.startswith(".")]


# ---- batch ----

def test_it_runs_a_batch_with_one_result_per_plugin(api, home):
    for n in ("p1", "p2"):
        make_plugin(home.plugins_dir, n, {"ingest": PY_ECHO_INGEST})
    r = api("POST", "/plugins/batch", {"operation": "disable", "plugins": ["p1", "missing", "p2"]})
    assert r.status_code == 200, r.content
    body = r.json()
    assert [(x["plugin"], x["ok"]) for x in body["results"]] == [("p1", True), ("missing", False), ("p2", True)]
    assert body["results"][1]["error"]["code"] == "not_found" and body["failed"] == 1 and not body["all_ok"]
    assert (home.plugin_dir("p1") / ".disabled").exists() and (home.plugin_dir("p2") / ".disabled").exists()
    r = api("POST", "/plugins/batch", {"operation": "enable", "plugins": ["p1", "p2"]})
    assert r.json()["all_ok"] and not (home.plugin_dir("p1") / ".disabled").exists()
    r = api("POST", "/plugins/batch", {"operation": "reload", "plugins": ["p1"]})
    assert r.json()["results"][0]["result"]["version"] == "0.1.0"
    assert api("POST", "/plugins/batch", {"operation": "sign", "plugins": ["p1"]}).status_code == 400
    assert api("POST", "/plugins/batch", {"operation": "enable", "plugins": []}).status_code == 400


# ---- export ----

def test_it_exports_a_tarball_with_the_lock_entry(api, home, tmp_path):
    src = make_plugin(tmp_path / "src", "expo", {"ingest": PY_ECHO_INGEST})
    (src / "link").symlink_to("/etc/passwd")
    assert api("POST", "/plugins/install", {"source": "local", "path": str(src)}).status_code == 201
    r = api("GET", "/plugins/expo/export", role=Role.ADMIN)
    assert r.status_code == 200 and r["Content-Type"] == "application/gzip"
    assert r["Content-Disposition"] == 'attachment; filename="expo.tar.gz"'
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        names = sorted(tar.getnames())
        assert names == ["expo/hooks/ingest.py", "expo/librefang-lock.json", "expo/plugin.toml"]
        assert all(m.isfile() for m in tar.getmembers())
        lock = json.loads(tar.extractfile("expo/librefang-lock.json").read())
        toml = tar.extractfile("expo/plugin.toml").read()
    assert lock["entry"]["source"] == {"kind": "local", "path": str(src)}
    assert lock["entry"]["files"]["plugin.toml"] == __import__("hashlib").sha256(toml).hexdigest()
    assert api("GET", "/plugins/expo/export", role=Role.VIEWER).status_code == 403
    assert api("GET", "/plugins/nope/export").status_code == 404


# ---- update-check ----

def test_it_checks_for_an_update_without_changing_anything(api, home, tmp_path):
    reg = registry_with(tmp_path, {"upd": {"version": "1.2.0"}})
    assert api("POST", "/plugins/install", {"source": "registry", "name": "upd", "registry": str(reg)}).status_code == 201
    r = api("GET", "/plugins/upd/update-check", role=Role.VIEWER)
    assert r.status_code == 200, r.content
    assert r.json()["update_available"] is False and r.json()["available_version"] == "1.2.0"
    toml = reg / "plugins/upd/plugin.toml"
    toml.write_text(toml.read_text().replace('version = "1.2.0"', 'version = "1.10.0"'))  # 1.10 > 1.2
    body = api("GET", "/plugins/upd/update-check").json()
    assert body["update_available"] and body["newer_version"] and body["installed_version"] == "1.2.0"
    assert "1.2.0" in (home.plugin_dir("upd") / "plugin.toml").read_text()  # nothing installed
    make_plugin(home.plugins_dir, "untracked", {"ingest": PY_ECHO_INGEST})
    r = api("GET", "/plugins/untracked/update-check")
    assert r.status_code == 409 and code(r) == "not_tracked"


# ---- state ----

def test_it_shows_and_wipes_the_plugins_data_dir(api, home):
    make_plugin(home.plugins_dir, "stateful", {"ingest": PY_ECHO_INGEST})
    data = home.data_dir("stateful")
    (data / "agents/a1").mkdir(parents=True)
    (data / "agents/a1/state.json").write_text('{"n": 1}')
    (data / "cache.bin").write_bytes(b"x" * 1000)
    (data / "venv/bin").mkdir(parents=True)  # install-deps' virtualenv: installed code, not state
    (data / "venv/bin/python").write_bytes(b"y" * 50)
    r = api("GET", "/plugins/stateful/state", role=Role.VIEWER)
    assert r.status_code == 200
    body = r.json()
    assert body["size_bytes"] == 1008 and body["file_count"] == 2 and body["agents_with_state"] == ["a1"]
    assert sorted(f["path"] for f in body["files"]) == ["agents/a1/state.json", "cache.bin"]
    assert body["venv"] == {"present": True, "size_bytes": 50}
    assert api("DELETE", "/plugins/stateful/state", role=Role.VIEWER).status_code == 403
    r = api("DELETE", "/plugins/stateful/state", role=Role.ADMIN)
    assert r.status_code == 200 and r.json()["files_removed"] == 2 and r.json()["bytes_freed"] == 1008
    assert data.is_dir() and [p.name for p in data.iterdir()] == ["venv"]
    assert (data / "venv/bin/python").stat().st_size == 50
    assert api("GET", "/plugins/stateful/state").json()["file_count"] == 0
    assert AuditEntry.objects.filter(action="plugin.state_wipe", target="stateful").exists()


# ---- registries ----

def test_it_searches_a_registry_and_lists_configured_registries(api, home, tmp_path):
    reg = registry_with(tmp_path, {"kafka-memory": {}, "todo-tracker": {}, "sentiment": {}})
    (home.root / "config.toml").write_text(f'[plugins]\nplugin_registries = [{{name = "local", path = "{reg}"}}]\n')
    api("POST", "/plugins/install", {"source": "registry", "name": "todo-tracker", "registry": str(reg)})
    r = api("GET", "/plugins/registry/search?q=TRACKER", role=Role.VIEWER)
    assert r.status_code == 200, r.content
    body = r.json()
    assert [x["name"] for x in body["results"]] == ["todo-tracker"] and body["results"][0]["installed"] is True
    assert body["results"][0]["hooks"] == ["ingest"] and body["source"] == "plugins/" and body["signed"] is False
    assert api("GET", "/plugins/registry/search?q=").json()["total"] == 3
    assert api("GET", "/plugins/registry/search?q=&registry=local").json()["total"] == 3  # by name
    other = registry_with(tmp_path / "elsewhere", {"x": {}})
    r = api("GET", f"/plugins/registry/search?registry={other}")  # never fetched: not configured
    assert r.status_code == 400 and code(r) == "unknown_registry"
    r = api("GET", "/plugins/registry/search?registry=file:///etc")
    assert r.status_code == 400 and code(r) == "unknown_registry"
    r = api("GET", "/plugins/registries", role=Role.VIEWER)
    (only,) = r.json()["registries"]
    assert only["name"] == "local" and sorted(p["name"] for p in only["plugins"]) == [
        "kafka-memory", "sentiment", "todo-tracker"]
    (home.root / "config.toml").write_text("")
    r = api("GET", "/plugins/registry/search?q=x")
    assert r.status_code == 400 and code(r) == "no_registry"


# ---- env and advanced-config ----

def test_it_reads_and_writes_env_with_secrets_masked(api, home):
    make_plugin(home.plugins_dir, "envy", {"ingest": PY_ECHO_INGEST},
                top_extra='[env]\nREGION = "eu"\nOPENAI_API_KEY = "sk-live-123"')
    r = api("GET", "/plugins/envy/env", role=Role.VIEWER)
    assert r.status_code == 200 and r.json()["env"] == {"OPENAI_API_KEY": "***", "REGION": "eu"}
    assert api("PUT", "/plugins/envy/env", {"env": {"REGION": "us"}}, role=Role.ADMIN).status_code == 403
    r = api("PUT", "/plugins/envy/env", {"env": {"REGION": "us", "OPENAI_API_KEY": None, "NEW_ONE": "1"}})
    assert r.status_code == 200, r.content
    assert r.json()["env"] == {"NEW_ONE": "1", "REGION": "us"}
    manifest = tomllib.loads((home.plugin_dir("envy") / "plugin.toml").read_text())
    assert manifest["env"] == {"REGION": "us", "NEW_ONE": "1"}
    r = api("PUT", "/plugins/envy/env", {"env": {"BAD NAME": "x"}})
    assert r.status_code == 400 and code(r) == "invalid_env"


def test_it_changes_advanced_config_only_when_the_manifest_stays_valid(api, home):
    make_plugin(home.plugins_dir, "adv", {"ingest": PY_ECHO_INGEST})
    toml = home.plugin_dir("adv") / "plugin.toml"
    toml.write_text("# my comment\n" + toml.read_text())
    assert api("GET", "/plugins/adv/advanced-config").json()["hook_timeout_secs"] == 30
    r = api("PUT", "/plugins/adv/advanced-config", {"hook_timeout_secs": 5, "allow_network": True,
                                                    "circuit_breaker": {"max_failures": 3, "reset_secs": 10}})
    assert r.status_code == 200, r.content
    assert r.json()["hook_timeout_secs"] == 5 and r.json()["allow_network"] is True
    assert r.json()["circuit_breaker"] == {"max_failures": 3, "reset_secs": 10}
    assert toml.read_text().startswith("# my comment\n")  # the operator's layout is kept
    from plugins_app.services.engine import get_engine

    assert get_engine().catalog.get("adv").plugin.manifest.hooks.hook_timeout_secs == 5
    before = toml.read_text()
    r = api("PUT", "/plugins/adv/advanced-config", {"hook_timeout_secs": -1})
    assert r.status_code == 400 and code(r) == "invalid_config" and toml.read_text() == before
    r = api("PUT", "/plugins/adv/advanced-config", {"ingest": "hooks/other.py"})  # hook paths are not settings
    assert r.status_code == 400 and toml.read_text() == before
    r = api("PUT", "/plugins/adv/advanced-config", {"hook_timeout_secs": None})
    assert r.json()["hook_timeout_secs"] == 30


def test_the_advanced_settings_match_the_api_schema():
    from plugins_app.schemas.parity import AdvancedConfigIn
    from plugins_app.services.plugin_config import ADVANCED_KEYS

    assert set(AdvancedConfigIn.model_fields) == set(ADVANCED_KEYS)


# ---- context-engine: per-agent metrics and sandbox policy ----

def _trace(i, agent, hook, ok, ms, origin="agent"):
    HookTrace.objects.create(trace_id=f"{i:016x}", plugin="p", hook=hook, agent_id=agent, started_at=timezone.now(),
                             elapsed_ms=ms, ok=ok, origin=origin)


def test_it_reports_metrics_per_agent(api, home):
    _trace(1, "a1", "ingest", True, 10)
    _trace(2, "a1", "ingest", False, 30)
    _trace(3, "a1", "assemble", True, 5)
    _trace(4, "a2", "ingest", True, 7)
    _trace(5, "a2", "ingest", True, 999, origin="test_console")  # not an agent call
    r = api("GET", "/context-engine/metrics/per-agent", role=Role.VIEWER)
    assert r.status_code == 200
    body = r.json()
    assert body["total_agents"] == 2
    assert body["per_agent"]["a1"]["hooks"]["ingest"] | {"last_call": None} == {
        "calls": 2, "successes": 1, "failures": 1, "total_ms": 40.0, "avg_ms": 20.0, "last_call": None}
    assert body["per_agent"]["a2"]["calls"] == 1
    assert list(api("GET", "/context-engine/metrics/per-agent?agent_id=a2").json()["per_agent"]) == ["a2"]


def test_it_reports_each_plugins_sandbox_policy(api, home):
    make_plugin(home.plugins_dir, "open", {"ingest": PY_ECHO_INGEST},
                toml_extra="allow_network = true\nmax_memory_mb = 64\nhook_timeout_secs = 7")
    make_plugin(home.plugins_dir, "closed", {"ingest": PY_ECHO_INGEST}, toml_extra="allow_filesystem = false")
    write_config(home.root, plugin="open")
    r = api("GET", "/context-engine/sandbox-policy", role=Role.VIEWER, prefix="/api/v1")
    assert r.status_code == 200
    body = r.json()
    rows = {p["name"]: p for p in body["plugins"]}
    assert body["mode"] == "single" and rows["open"]["serving"] and not rows["closed"]["serving"]
    assert rows["open"]["network"] == {"allowed": True}
    assert rows["open"]["limits"]["max_memory_mb"] == 64 and rows["open"]["limits"]["hook_timeout_secs"] == 7
    assert rows["closed"]["network"] == {"allowed": False}
    assert rows["closed"]["filesystem"]["allow_filesystem"] is False
    assert rows["closed"]["filesystem"]["data_dir"] == str(home.data_dir("closed"))


# ---- content types: a JSON body is read as JSON whatever the header says (curl -d sends form-urlencoded) ----

@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", ""])
def test_it_reads_json_bodies_whatever_their_content_type(api, home, tmp_path, content_type):
    src = make_plugin(tmp_path / "src", "ctp", {"ingest": PY_ECHO_INGEST})

    def post(method, path, body):
        return api(method, path, body, content_type=content_type)
    r = post("POST", "/plugins/install", {"source": "local", "path": str(src)})
    assert r.status_code == 201, r.content
    (home.plugin_dir("ctp") / "hooks/ingest.py").write_text("# edited")
    r = post("POST", "/plugins/ctp/update", {"force": False})  # read as JSON: force=false, so refused
    assert r.status_code == 409 and code(r) == "locally_modified", r.content
    r = post("POST", "/plugins/ctp/update", {"force": True})
    assert r.status_code == 200 and r.json()["updated"], r.content
    assert post("POST", "/plugins/batch", {"operation": "disable", "plugins": ["ctp"]}).json()["all_ok"]
    r = post("PUT", "/plugins/ctp/env", {"env": {"A": "1"}})
    assert r.status_code == 200 and r.json()["env"] == {"A": "1"}, r.content
    r = post("PUT", "/plugins/ctp/advanced-config", {"max_retries": 2})
    assert r.status_code == 200 and r.json()["max_retries"] == 2, r.content
    r = post("POST", "/memories", {"agent_id": "a", "content": "c"})
    assert r.status_code == 201, r.content
    r = post("POST", "/plugins/uninstall", {"name": "ctp"})
    assert r.status_code == 200 and r.json()["removed"], r.content
    r = post("POST", "/plugins/ctp/update", {"force": True})
    assert r.status_code == 404


def test_it_refuses_a_body_that_is_not_json_whatever_the_header(api, home, client):
    make_plugin(home.plugins_dir, "p", {"ingest": PY_ECHO_INGEST})
    raw = create_token("o2", Role.OWNER)[1]
    for path in ("/api/plugins/p/update", "/api/plugins/uninstall", "/api/plugins/batch"):
        r = client.post(path, data="force=true", content_type="application/x-www-form-urlencoded",
                        HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert r.status_code == 400 and code(r) in ("invalid_json", "bad_request"), (path, r.content)
    assert not (home.plugin_dir("p") / ".disabled").exists()


# ---- the CLI verbs (in-process call_command: same parsing and exit codes as `librefang plugin …`) ----

@pytest.fixture
def cli(home, monkeypatch):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    def run(*args):
        out, err = io.StringIO(), io.StringIO()
        try:
            call_command("plugin", *args, stdout=out, stderr=err)
            rc = 0
        except CommandError as exc:
            rc = exc.returncode
            err.write(str(exc))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        return rc, out.getvalue(), err.getvalue()
    return run


def test_the_cli_exports_shows_state_benchmarks_and_searches(cli, home, tmp_path):
    reg = registry_with(tmp_path, {"clip": {"version": "2.0.0"}, "other": {}})
    (home.root / "config.toml").write_text(f'[plugins]\nregistry = "{reg}"\n')
    assert cli("install", "--registry", str(reg), "--name", "clip")[0] == 0
    rc, out, _ = cli("registry-search", "cli", "--json")
    assert rc == 0 and [p["name"] for p in json.loads(out)["results"]] == ["clip"]
    target = tmp_path / "clip-export.tar.gz"
    rc, out, _ = cli("export", "clip", "-o", str(target))
    assert rc == 0 and str(target) in out
    with tarfile.open(target, "r:gz") as tar:
        assert "clip/librefang-lock.json" in tar.getnames()
    home.data_dir("clip").mkdir(parents=True, exist_ok=True)
    (home.data_dir("clip") / "notes.txt").write_text("12345")
    rc, out, _ = cli("state", "clip")
    assert rc == 0 and "1 files, 5 bytes" in out and "notes.txt" in out
    rc, out, _ = cli("state", "clip", "--wipe")
    assert rc == 0 and not (home.data_dir("clip") / "notes.txt").exists()
    rc, out, _ = cli("update-check", "clip")
    assert rc == 0 and "up to date" in out
    rc, out, _ = cli("benchmark", "clip", "--runs", "3", "--json")
    assert rc == 0, out
    (only,) = json.loads(out)["hooks"]
    assert only["hook"] == "ingest" and only["ok"] == 3 and only["latency_ms"]["p50"] > 0
    assert cli("benchmark", "clip", "--runs", "99")[0] == 2
    assert cli("export", "ghost")[0] == 3


# ---- registry trust through config.toml ----

def test_a_registry_key_in_config_toml_guards_install_and_search(api, home, tmp_path):
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pub = base64.b64encode(key.public_key().public_bytes(serialization.Encoding.Raw,
                                                         serialization.PublicFormat.Raw)).decode()
    reg = registry_with(tmp_path, {"trusted": {}})
    from engine.plugins.sources import file_hashes

    index = json.dumps([{"name": "trusted", "version": "0.1.0", "description": "signed one",
                         "files": file_hashes(reg / "plugins" / "trusted")}]).encode()
    (reg / "index.json").write_bytes(index)
    (home.root / "config.toml").write_text(
        f'[plugins]\nplugin_registries = [{{name = "signed", path = "{reg}", public_key = "{pub}"}}]\n')
    r = api("POST", "/plugins/install", {"source": "registry", "name": "trusted", "registry": str(reg)})
    assert r.status_code == 400 and code(r) == "registry_unsigned", r.content
    r = api("GET", "/plugins/registry/search?q=signed")
    assert r.status_code == 400 and code(r) == "registry_unsigned"
    reg_row = api("GET", "/plugins/registries").json()["registries"][0]
    assert reg_row["error"]["code"] == "registry_unsigned" and reg_row["plugins"] == []
    (reg / "index.json.sig").write_text(base64.b64encode(key.sign(index)).decode())
    r = api("GET", "/plugins/registry/search?q=signed")
    assert r.status_code == 200 and r.json()["signed"] and [p["name"] for p in r.json()["results"]] == ["trusted"]
    r = api("POST", "/plugins/install", {"source": "registry", "name": "trusted", "registry": str(reg)})
    assert r.status_code == 201, r.content
    assert json.loads(home.lockfile.read_text())["plugins"]["trusted"]["provenance"]["index_signed"] is True


def test_optional_bodies_are_read_as_json_whatever_their_content_type_too(api, home):
    r = api("POST", "/context-engine/metrics/reset", {}, role=Role.ADMIN, content_type="application/x-www-form-urlencoded")
    assert r.status_code == 200 and r.json()["reset"] is True, r.content
