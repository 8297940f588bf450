"""Approving what a plugin asks beyond the defaults (plugins_app/services/permissions.py): the API, the CLI, the
doctor, the dashboard's Approve button, and which owner acts approve at once."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from plugins_app.models import AuditEntry, PluginApproval, Role
from plugins_app.services.tokens import create_token
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client, home):
    tokens = {role: create_token(role, role)[1] for role in (Role.OWNER, Role.VIEWER)}

    def request(method, path, body=None, role=Role.OWNER):
        kw = {"HTTP_AUTHORIZATION": f"Bearer {tokens[role]}"}
        fn = getattr(client, method.lower())
        if body is None:
            return fn("/api" + path, **kw)
        return fn("/api" + path, data=json.dumps(body), content_type="application/json", **kw)

    return request


def grab(home, name="grabby", extra="allow_network = true\nmax_processes = 2000"):
    return make_plugin(home.plugins_dir, name, {"ingest": PY_ECHO_INGEST}, toml_extra=extra)


def test_it_shows_what_a_copied_plugin_asks_and_approves_it_for_an_owner_only(api, home):
    pdir = grab(home)
    view = api("GET", "/plugins/grabby/permissions", role=Role.VIEWER).json()
    assert view["needs_approval"] and not view["approved"] and view["last_approved"] is None
    assert [a["key"] for a in view["asks"]] == ["network", "max_processes"]
    assert view["effective"]["network"] is False and view["effective"]["max_processes"] == 128
    assert "permissions.unapproved" in view["effective"]["warnings"][0]
    assert api("POST", "/plugins/grabby/permissions/approve", {}, role=Role.VIEWER).status_code == 403
    stale = api("POST", "/plugins/grabby/permissions/approve", {"manifest_sha256": "0" * 64})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "manifest_changed"
    view = api("POST", "/plugins/grabby/permissions/approve", {"manifest_sha256": view["manifest_sha256"]}).json()
    assert view["approved"] and not view["needs_approval"]
    assert view["effective"]["network"] is True and view["effective"]["max_processes"] == 256  # the ceiling
    assert AuditEntry.objects.get(action="plugin.approve").details["how"] == "approve"
    (pdir / "plugin.toml").write_text((pdir / "plugin.toml").read_text() + 'allowed_secrets = ["db"]\n')
    view = api("GET", "/plugins/grabby/permissions").json()
    assert view["needs_approval"] and [a["key"] for a in view["changes"]["added"]] == ["secret:db"]
    assert '+allowed_secrets = ["db"]' in view["manifest_diff"]
    assert view["effective"]["network"] is False  # the serving version is the edited one: not approved


def test_it_reports_an_unapproved_version_in_the_doctor(api, home):
    grab(home)
    plugin = next(p for p in api("GET", "/plugins/doctor").json()["plugins"] if p["name"] == "grabby")
    assert "permissions.unapproved" in [f["id"] for f in plugin["findings"]]
    api("POST", "/plugins/grabby/permissions/approve", {})
    plugin = next(p for p in api("GET", "/plugins/doctor").json()["plugins"] if p["name"] == "grabby")
    assert "permissions.unapproved" not in [f["id"] for f in plugin["findings"]]


def test_install_approves_at_once_and_reload_only_what_asks_nothing_new(api, home, tmp_path):
    src = make_plugin(tmp_path / "src", "installed", {"ingest": PY_ECHO_INGEST},
                      toml_extra="allow_network = true\nmax_processes = 2000")
    body = api("POST", "/plugins/install", {"source": "local", "path": str(src)}).json()
    assert body["permissions"]["in_force"] and [a["key"] for a in body["permissions"]["asks"]] == [
        "network", "max_processes"]
    manifest = home.plugin_dir("installed") / "plugin.toml"
    manifest.write_text(manifest.read_text().replace("max_processes = 2000", "max_processes = 200"))
    assert api("POST", "/plugins/installed/reload").json()["permissions"]["in_force"]  # narrower: approved
    manifest.write_text(manifest.read_text() + 'allowed_env_vars = ["HOME_URL"]\n')
    reloaded = api("POST", "/plugins/installed/reload").json()
    assert not reloaded["permissions"]["in_force"] and "asks for more" in reloaded["message"]
    assert PluginApproval.objects.filter(plugin="installed").count() == 2


def test_an_owners_edit_is_approved_only_when_the_edited_version_was(api, home):
    pdir = grab(home, "edited", extra="")
    r = api("PUT", "/plugins/edited/advanced-config", {"allow_network": True})  # the owner asks, on a plain plugin
    assert r.status_code == 200 and api("GET", "/plugins/edited/permissions").json()["approved"]
    (pdir / "plugin.toml").write_text((pdir / "plugin.toml").read_text() + "max_memory_mb = 8000\n")  # not the owner
    api("PUT", "/plugins/edited/advanced-config", {"hook_timeout_secs": 5})
    view = api("GET", "/plugins/edited/permissions").json()
    assert view["needs_approval"] and [a["key"] for a in view["changes"]["added"]] == ["max_memory_mb"]


def test_the_cli_shows_and_approves(home, capsys):
    grab(home)
    call_command("plugin", "permissions", "grabby")
    out = capsys.readouterr().out
    assert "NOT APPROVED" in out and "network access (allow_network = true)" in out
    call_command("plugin", "approve", "grabby")
    assert "approved grabby" in capsys.readouterr().out
    assert PluginApproval.objects.get(plugin="grabby").approved_by.startswith("cli")


def test_the_plugin_page_shows_the_card_and_its_approve_button_to_owners_only(client, home, django_user_model):
    grab(home)
    viewer = django_user_model.objects.create_user("viewer", password="pw")
    client.force_login(viewer)
    page = client.get("/plugins/grabby/").content.decode()
    assert 'data-needs-approval="true"' in page and "An owner can approve it." in page
    assert client.post("/plugins/grabby/permissions/approve/", HTTP_HX_REQUEST="true").status_code == 403
    owner = django_user_model.objects.create_superuser("boss", password="pw")
    client.force_login(owner)
    page = client.get("/plugins/grabby/").content.decode()
    sha = page.split('data-sha256="')[1].split('"')[0]
    card = client.post("/plugins/grabby/permissions/approve/", {"manifest_sha256": sha}, HTTP_HX_REQUEST="true")
    assert card.status_code == 200 and 'data-needs-approval="false"' in card.content.decode()
    assert PluginApproval.objects.filter(plugin="grabby", manifest_sha256=sha).exists()
