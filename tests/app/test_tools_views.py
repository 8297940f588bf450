"""The WASM tools dashboard page through Django's test client: renders, installs, toggles, removes, denials."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile

from engine.wasm import tools as T
from plugins_app.models import AuditEntry
from plugins_app.services.tools import run_tool_job
from tests.app.tool_worker import tool_worker_fixture  # noqa: F401 (the tool_worker fixture)
from tests.fixtures.wasm.wat import fixture_wasm, tool_manifest

pytestmark = pytest.mark.django_db
ECHO = fixture_wasm("echo")


def package_file(tool_id="echo"):
    return SimpleUploadedFile(f"{tool_id}.tar", T.package(tool_manifest(tool_id, ECHO), ECHO))


@pytest.fixture
def owner(client):
    client.force_login(User.objects.create_superuser("boss", "", "pw"))


@pytest.fixture
def viewer(client):
    client.force_login(User.objects.create_user("reader", "", "pw"))


def test_it_redirects_anonymous_users(client, home):
    for url in ("/tools/", "/tools/install/", "/tools/execute/"):
        assert client.get(url).status_code in (302, 405), url
    assert client.get("/tools/")["Location"].startswith("/login/")


def test_it_shows_an_empty_page_with_the_policy(client, home, owner):
    (home.root / "config.toml").write_text('[runtime.wasm]\nmemory_limit_mb = 16\nallowed_hosts = ["api.example"]\n')
    html = client.get("/tools/").content.decode()
    assert "No WASM tools installed yet" in html
    assert "16 MiB" in html and "api.example" in html
    assert 'aria-current="page">WASM tools' in html


def test_it_installs_lists_and_toggles_tools(client, home, owner, tool_worker):
    resp = client.post("/tools/install/", {"package": package_file()})
    assert resp.status_code == 302
    assert [job["source"] for job in tool_worker] == ["upload"]  # unpacked by the worker, not by this view
    html = client.get("/tools/").content.decode()
    row = html.split('id="tool-echo"')[1].split("</tr>")[0]
    assert "matches" in row and "enabled" in row and "echo_plugin" in row  # the worker read the module's name
    assert run_tool_job({"tool": "echo", "input": "{}"})["output"] == "echo:ok"
    assert 'id="tool-console"' in html and '<option value="echo">' in html
    assert client.post("/tools/echo/disable/").status_code == 302
    html = client.get("/tools/").content.decode()
    assert "disabled" in html.split('id="tool-echo"')[1].split("</tr>")[0]
    assert '<option value="echo">' not in html  # disabled tools are not offered in the console
    assert client.post("/tools/echo/remove/").status_code == 302
    assert "No WASM tools installed yet" in client.get("/tools/").content.decode()
    actions = set(AuditEntry.objects.filter(target="echo").values_list("action", flat=True))
    assert {"tool.install", "tool.disable", "tool.remove"} <= actions


def test_it_shows_install_errors(client, home, owner, tool_worker):
    resp = client.post("/tools/install/", {"package": SimpleUploadedFile("x.tar", b"garbage" * 100)})
    assert resp.status_code == 400 and "Not installed" in resp.content.decode()
    resp = client.post("/tools/install/", {})
    assert resp.status_code == 400
    assert client.post("/tools/ghost/enable/").status_code == 404
    assert client.post("/tools/echo/explode/").status_code == 400


def test_it_refuses_changes_and_the_console_to_viewers(client, home, viewer):
    T.install(home, T.package(tool_manifest("echo", ECHO), ECHO))
    html = client.get("/tools/").content.decode()
    assert 'id="tool-console"' not in html and "Install a package" not in html
    assert client.post("/tools/install/", {"package": package_file()}).status_code == 403
    assert client.post("/tools/echo/disable/").status_code == 403
    assert client.post("/tools/execute/", {"tool": "echo", "input": "x"}).status_code == 403
    assert T.get_tool(home, "echo").enabled


def test_it_refuses_console_runs_of_unknown_tools(client, home, owner):
    resp = client.post("/tools/execute/", {"tool": "ghost", "input": "x"})
    assert resp.status_code == 404 and "unknown tool" in resp.content.decode()


def test_it_creates_a_wasm_plugin_from_the_dashboard_form_and_shows_it(client, home, owner):
    from plugins_app.services.engine import get_engine

    resp = client.post("/create/", {"name": "wasmform", "description": "from the form", "runtime": "wasm",
                                    "hooks": ["ingest", "assemble"]})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    pdir = home.plugin_dir("wasmform")
    assert (pdir / "hooks" / "ingest.wasm").exists() and (pdir / "hooks" / "ingest.wat").exists()
    page = client.get("/plugins/wasmform/").content.decode()
    assert "wasm" in page and "hooks/ingest.wasm" in page
    attempt = get_engine().test_hook("wasmform", "ingest", {"agent_id": "a", "message": "hi"})
    assert attempt.ok and attempt.reply == {"type": "ingest_result", "memories": []}
    assert "[INFO] wasmform: ingest called" in attempt.result.stderr
