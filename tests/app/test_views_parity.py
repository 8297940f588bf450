"""The dashboard's controls for LibreFang's extra routes (plugins_app/views/parity.py), through Django's test client
with real files: each control does what it says, and each refuses the roles its API route refuses."""

from __future__ import annotations

import io
import os
import tarfile
import tomllib

import pytest
from django.contrib.auth.models import User

from engine.process import data_disks
from plugins_app.models import AuditEntry, HookTrace
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin

pytestmark = pytest.mark.django_db


@pytest.fixture
def login(client):
    def as_role(role: str):
        if role == "owner":
            user = User.objects.create_superuser("boss", "", "pw")
        elif role == "admin":
            user = User.objects.create_user("staff", "", "pw", is_staff=True)
        else:
            user = User.objects.create_user("reader", "", "pw")
        client.force_login(user)
        return user
    return as_role


def with_state(home, name: str) -> None:
    data = home.data_dir(name)
    (data / "agents" / "a1").mkdir(parents=True)
    (data / "agents" / "a1" / "state.json").write_text('{"n": 1}')
    (data / "notes.txt").write_text("remember")


def test_it_shows_the_parity_controls_on_the_plugin_page_by_role(client, home, login):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    login("owner")
    html = client.get("/plugins/alpha/").content.decode()
    assert 'id="parity-benchmark-form"' in html and 'id="parity-export"' in html and "Update available?" in html
    assert 'hx-get="/plugins/alpha/state/"' in html and 'hx-get="/plugins/alpha/config/"' in html
    client.logout()
    login("viewer")
    html = client.get("/plugins/alpha/").content.decode()
    assert 'id="parity-benchmark-form"' not in html and 'id="parity-export"' not in html
    assert "Update available?" in html  # update-check is a read


def test_it_lists_and_wipes_state_after_a_confirm(client, home, login):
    make_plugin(home.plugins_dir, "keeper", {"ingest": PY_ECHO_INGEST})
    with_state(home, "keeper")
    login("admin")  # DELETE /state is the admin's
    html = client.get("/plugins/keeper/state/").content.decode()
    assert 'id="parity-state-count">2<' in html and "agents/a1/state.json" in html and "notes.txt" in html
    assert 'hx-confirm="Wipe the state of keeper? 2 files' in html and "per-agent state of 1 agent" in html
    resp = client.post("/plugins/keeper/state/wipe/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert 'id="parity-wiped"' in html and "2 files removed" in html and 'id="parity-state-count">0<' in html
    assert not (home.data_dir("keeper") / "notes.txt").exists()
    assert not (home.data_dir("keeper") / "agents").exists()
    assert AuditEntry.objects.filter(action="plugin.state_wipe", target="keeper").exists()


def test_it_refuses_a_viewer_the_wipe_and_hides_its_button(client, home, login):
    make_plugin(home.plugins_dir, "keeper", {"ingest": PY_ECHO_INGEST})
    with_state(home, "keeper")
    login("viewer")
    assert 'id="parity-wipe"' not in client.get("/plugins/keeper/state/").content.decode()
    assert client.post("/plugins/keeper/state/wipe/").status_code == 403
    assert (home.data_dir("keeper") / "notes.txt").exists()


def test_it_exports_the_same_tarball_as_the_api(client, home, login):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    login("admin")
    resp = client.get("/plugins/alpha/export.tar.gz")
    assert resp.status_code == 200 and resp["Content-Type"] == "application/gzip"
    assert resp["Content-Disposition"] == 'attachment; filename="alpha.tar.gz"'
    with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
        names = tar.getnames()
        manifest = tomllib.loads(tar.extractfile("alpha/plugin.toml").read().decode())
    assert "alpha/plugin.toml" in names and manifest["name"] == "alpha"
    client.logout()
    login("viewer")  # plugin.toml's [env] may hold keys: export is the admin's, as on the API
    assert client.get("/plugins/alpha/export.tar.gz").status_code == 403


def test_it_edits_env_and_keeps_plugin_toml_on_a_bad_value(client, home, login):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    toml = home.plugin_dir("alpha") / "plugin.toml"
    login("owner")
    resp = client.post("/plugins/alpha/config/env/", {"env": "GREETING=hello\nAPI_TOKEN=s3cret"})
    assert resp.status_code == 200 and 'id="parity-env-saved"' in resp.content.decode()
    written = tomllib.loads(toml.read_text())
    assert written["env"] == {"GREETING": "hello", "API_TOKEN": "s3cret"}
    assert "s3cret" not in resp.content.decode()  # shown masked, as GET /env does
    before = toml.read_text()
    resp = client.post("/plugins/alpha/config/env/", {"env": "GREETING=bye\n1BAD-NAME=x"})
    html = resp.content.decode()
    assert resp.status_code == 400 and 'id="parity-env-error"' in html and "1BAD-NAME" in html
    assert "GREETING=bye\n1BAD-NAME=x" in html  # the operator's text is kept
    assert toml.read_text() == before
    resp = client.post("/plugins/alpha/config/env/", {"env": "-GREETING"})
    assert "GREETING" not in tomllib.loads(toml.read_text())["env"]


def test_it_edits_advanced_settings_with_the_api_validation(client, home, login):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    toml = home.plugin_dir("alpha") / "plugin.toml"
    login("owner")
    resp = client.post("/plugins/alpha/config/advanced/",
                       {"advanced": '{"hook_timeout_secs": 7, "on_hook_failure": "skip"}'})
    assert resp.status_code == 200, resp.content
    hooks = tomllib.loads(toml.read_text())["hooks"]
    assert hooks["hook_timeout_secs"] == 7 and hooks["on_hook_failure"] == "skip"
    before = toml.read_text()
    for bad in ('{"on_hook_failure": "explode"}', '{"no_such_setting": 1}', '{"hook_timeout_secs": -3}', "{not json"):
        resp = client.post("/plugins/alpha/config/advanced/", {"advanced": bad})
        html = resp.content.decode()
        assert resp.status_code == 400 and 'id="parity-advanced-error"' in html, bad
        assert toml.read_text() == before, bad
    client.logout()
    login("admin")  # PUT /advanced-config is the owner's
    assert client.post("/plugins/alpha/config/advanced/", {"advanced": '{"max_retries": 2}'}).status_code == 403
    assert client.post("/plugins/alpha/config/env/", {"env": "A=b"}).status_code == 403
    html = client.get("/plugins/alpha/config/").content.decode()
    assert 'id="parity-env-form"' not in html and 'id="parity-advanced-form"' not in html
    assert toml.read_text() == before


def test_it_disables_and_enables_several_plugins_in_one_batch(client, home, login):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    make_plugin(home.plugins_dir, "beta", {"ingest": PY_ECHO_INGEST})
    login("owner")
    assert 'hx-get="/batch/"' in client.get("/").content.decode()
    assert 'id="parity-batch-form"' in client.get("/batch/").content.decode()
    resp = client.post("/batch/run/", {"operation": "disable", "plugins": ["alpha", "beta", "ghost"]})
    html = resp.content.decode()
    assert resp.status_code == 200 and "2 done, 1 failed" in html
    assert 'data-plugin="ghost" data-ok="false"' in html and 'data-plugin="alpha" data-ok="true"' in html
    assert (home.plugin_dir("alpha") / ".disabled").exists() and (home.plugin_dir("beta") / ".disabled").exists()
    client.post("/batch/run/", {"operation": "enable", "plugins": ["alpha", "beta"]})
    assert not (home.plugin_dir("alpha") / ".disabled").exists()
    assert client.post("/batch/run/", {"operation": "explode", "plugins": ["alpha"]}).status_code == 400
    client.logout()
    login("admin")  # POST /plugins/batch is the owner's, even for disable
    assert client.post("/batch/run/", {"operation": "disable", "plugins": ["alpha"]}).status_code == 403
    assert 'id="parity-batch-form"' not in client.get("/batch/").content.decode()
    assert not (home.plugin_dir("alpha") / ".disabled").exists()


def test_it_searches_a_registry_and_installs_with_dependencies(client, home, login, tmp_path):
    reg = tmp_path / "registry"
    make_plugin(reg / "plugins", "base-mem", {"ingest": PY_ECHO_INGEST})
    make_plugin(reg / "plugins", "app-mem", {"ingest": PY_ECHO_INGEST}, top_extra='plugin_depends = ["base-mem"]')
    make_plugin(reg / "plugins", "unrelated", {"ingest": PY_ECHO_INGEST})
    (home.root / "config.toml").write_text(f'[plugins]\nplugin_registries = [{{name = "local", path = "{reg}"}}]\n')
    login("owner")
    assert 'hx-get="/install/registry/"' in client.get("/install/").content.decode()
    html = client.get("/install/registry/?q=mem").content.decode()
    assert 'data-plugin="app-mem"' in html and 'data-plugin="base-mem"' in html and "unrelated" not in html
    resp = client.post("/install/registry/install/", {"name": "app-mem", "registry": str(reg)})
    assert resp.status_code == 200 and 'id="parity-installed"' in resp.content.decode()
    assert (home.plugin_dir("app-mem") / "plugin.toml").exists() and (home.plugin_dir("base-mem") / "plugin.toml").exists()
    assert "installed" in client.get("/install/registry/?q=app").content.decode()
    assert client.post("/install/registry/install/", {"name": "nope", "registry": str(reg)}).status_code == 400
    client.logout()
    login("admin")
    assert client.post("/install/registry/install/", {"name": "unrelated", "registry": str(reg)}).status_code == 403
    assert not home.plugin_dir("unrelated").exists()


def test_it_shows_per_agent_metrics_and_sandbox_policy_on_the_engine_page(client, home, login):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST}, toml_extra="allow_network = true")
    from django.utils import timezone

    for i, ok in enumerate((True, True, False)):
        HookTrace.objects.create(trace_id=f"tr{i}", plugin="alpha", hook="ingest",
                                 agent_id="agent-7", ok=ok, elapsed_ms=12.0, started_at=timezone.now())
    login("viewer")
    assert 'hx-get="/engine/extras/"' in client.get("/engine/").content.decode()
    html = client.get("/engine/extras/").content.decode()
    row = html.split('data-agent="agent-7"')[1].split("</tr>")[0]
    assert "<code>ingest</code>" in row and ">3<" in row and ">1<" in row
    policy = html.split('id="parity-sandbox"')[1].split('data-plugin="alpha"')[1].split("</tr>")[0]
    assert "allowed" in policy.split('data-label="Network"')[1].split("</td>")[0]


def test_it_refuses_an_admin_the_benchmark_and_reports_a_disabled_plugin(client, home, login):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    login("admin")
    assert client.post("/plugins/alpha/benchmark/", {"runs": "2"}).status_code == 403
    client.logout()
    login("owner")
    (home.plugin_dir("alpha") / ".disabled").touch()
    html = client.post("/plugins/alpha/benchmark/", {"runs": "2"}).content.decode()
    assert "Benchmark failed" in html and "is disabled" in html
    assert "from 1 to 20" in client.post("/plugins/alpha/benchmark/", {"runs": "500"}).content.decode()


def test_it_reports_an_untracked_plugin_on_update_check(client, home, login):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    login("viewer")
    html = client.get("/plugins/alpha/update-check/").content.decode()
    assert "Update check failed" in html and "not installed from a source" in html


@pytest.mark.skipif(os.geteuid() != 0 or data_disks.unavailable() is not None,
                    reason=f"data disks need root with loop devices here: {data_disks.unavailable()}")
def test_the_state_card_says_how_full_the_plugins_data_disk_is(client, home, login):
    make_plugin(home.plugins_dir, "disked", {"ingest": PY_ECHO_INGEST})
    with_state(home, "disked")
    data_disks.ensure(home.data_dir("disked"), 16)  # as its first hook call does (engine/process/data_disks.py)
    login("viewer")
    html = client.get("/plugins/disked/state/").content.decode()
    assert 'id="parity-state-count">2<' in html  # what it held, moved into its disk
    assert 'id="parity-state-disk">A filesystem of its own: ' in html and "files left for its hooks" in html
