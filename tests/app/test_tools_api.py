"""/api/tools: roles (each denial), install/package/list/enable/disable/remove, and the worker side of a tool job."""

import io
import json
import tarfile

import pytest

from engine.wasm import tools as T
from plugins_app.models import AuditEntry
from plugins_app.services.tokens import create_token
from plugins_app.services.tools import run_tool_job
from tests.app.tool_worker import tool_worker_fixture  # noqa: F401 (the tool_worker fixture)
from tests.fixtures.wasm.wat import fixture_wasm, tool_manifest

ECHO = fixture_wasm("echo")


@pytest.fixture
def tokens(db):
    return {role: create_token(f"t-{role}", role)[1] for role in ("owner", "admin", "viewer", "agent")}


def call(client, method, path, token=None, **kw):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return getattr(client, method)(path, **kw, **headers)


def package_bytes(tool_id="echo", wasm=ECHO, **extra):
    return T.package(tool_manifest(tool_id, wasm, **extra), wasm)


def install(client, token, data):
    return call(client, "post", "/api/tools/install", token, data=data, content_type="application/x-tar")


def assert_installed_and_runs(home, tool_id="echo"):
    """The tool is on disk where AgentZero keeps it, nothing is left in the staging area, and a run answers."""
    assert (home.tools_dir / tool_id / "0.1.0" / "plugin.wasm").read_bytes() == ECHO
    assert not any((home.tools_dir / T.INCOMING_DIR).iterdir())
    body = run_tool_job({"tool": tool_id, "input": '{"task":"hello"}'})
    assert body["ok"] and body["output"] == "echo:ok", body


@pytest.mark.django_db
def test_it_installs_lists_and_describes_a_tool(client, home, tokens, tool_worker):
    resp = install(client, tokens["owner"], package_bytes())
    assert resp.status_code == 201, resp.content
    # the worker unpacked it and read the module's own name (module code never runs in the web tier)
    assert resp.json()["id"] == "echo" and resp.json()["module_name"] == "echo_plugin"
    assert [job["source"] for job in tool_worker] == ["local"] and "staged" in tool_worker[0]
    assert_installed_and_runs(home)
    assert AuditEntry.objects.filter(action="tool.install", target="echo").exists()
    for role in ("agent", "viewer", "admin", "owner"):
        listing = call(client, "get", "/api/tools", tokens[role])
        assert listing.status_code == 200
        [tool] = listing.json()["tools"]
        assert tool["id"] == "echo" and tool["enabled"] and tool["hash_ok"] and tool["module_name"] == "echo_plugin"
    assert call(client, "get", "/api/tools/echo", tokens["viewer"]).json()["version"] == "0.1.0"
    assert call(client, "get", "/api/tools/nope", tokens["viewer"]).status_code == 404


@pytest.mark.django_db
def test_it_installs_from_a_multipart_upload(client, home, tokens, tool_worker):
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("echo.tar", package_bytes(), content_type="application/x-tar")
    resp = call(client, "post", "/api/tools/install", tokens["owner"], data={"package": upload})
    assert resp.status_code == 201, resp.content
    assert resp.json()["version"] == "0.1.0" and resp.json()["hash_ok"] is True
    assert_installed_and_runs(home)


@pytest.mark.django_db
def test_it_denies_tool_routes_to_the_wrong_roles(client, home, tokens, tool_worker):
    install(client, tokens["owner"], package_bytes())
    assert call(client, "get", "/api/tools").status_code == 401
    assert call(client, "get", "/api/tools", "lf_wrong").status_code == 401
    for role in ("admin", "viewer", "agent"):
        resp = install(client, tokens[role], package_bytes())
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    for role in ("admin", "viewer"):
        resp = call(client, "post", "/api/tools/echo/execute", tokens[role], data={"input": "x"},
                    content_type="application/json")
        assert resp.status_code == 403, role
    for role in ("viewer", "agent"):
        for path in ("/api/tools/echo/disable", "/api/tools/echo/enable"):
            assert call(client, "post", path, tokens[role]).status_code == 403
        assert call(client, "delete", "/api/tools/echo", tokens[role]).status_code == 403
    assert call(client, "post", "/api/tools/package", tokens["admin"]).status_code == 403


@pytest.mark.django_db
def test_it_refuses_bad_packages_with_clear_errors(client, home, tokens, tool_worker):
    bad = package_bytes()
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(bad)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
        evil = tarfile.TarInfo("../../escape.txt")
        evil.size = 1
        dst.addfile(evil, io.BytesIO(b"x"))
    resp = install(client, tokens["owner"], out.getvalue())
    assert resp.status_code == 400 and "path traversal" in resp.json()["error"]["message"]
    assert not (home.root / "escape.txt").exists()
    resp = install(client, tokens["owner"], b"")
    assert resp.status_code == 400
    resp = install(client, tokens["owner"], b"not a tar at all" * 64)
    assert resp.status_code == 400 and "tar" in resp.json()["error"]["message"]
    assert AuditEntry.objects.filter(action="tool.install", ok=False).count() == 2


@pytest.mark.django_db
def test_it_packages_with_a_recomputed_hash(client, home, tokens, tool_worker):
    from django.core.files.uploadedfile import SimpleUploadedFile

    manifest = tool_manifest("echo", ECHO)
    manifest["wasm_sha256"] = "0" * 64
    resp = call(client, "post", "/api/tools/package", tokens["owner"], data={
        "manifest": SimpleUploadedFile("manifest.json", json.dumps(manifest).encode()),
        "wasm": SimpleUploadedFile("plugin.wasm", ECHO)})
    assert resp.status_code == 200 and resp["Content-Type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(resp.content)) as tar:
        assert json.loads(tar.extractfile("manifest.json").read())["wasm_sha256"] == T.sha256_hex(ECHO)
    assert install(client, tokens["owner"], resp.content).status_code == 201
    missing = call(client, "post", "/api/tools/package", tokens["owner"], data={})
    assert missing.status_code == 400


@pytest.mark.django_db
def test_it_enables_disables_and_removes_through_the_api(client, home, tokens, tool_worker):
    install(client, tokens["owner"], package_bytes())
    assert call(client, "post", "/api/tools/echo/disable", tokens["admin"]).json()["enabled"] is False
    resp = call(client, "post", "/api/tools/echo/execute", tokens["agent"], data={"input": "x"},
                content_type="application/json")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "tool_disabled"
    assert call(client, "post", "/api/tools/echo/enable", tokens["admin"]).json()["enabled"] is True
    assert call(client, "delete", "/api/tools/echo", tokens["admin"]).json() == {"removed": 1, "id": "echo"}
    assert call(client, "delete", "/api/tools/echo", tokens["admin"]).status_code == 404
    assert call(client, "post", "/api/tools/echo/enable", tokens["admin"]).status_code == 404


@pytest.mark.django_db
def test_it_validates_execute_bodies_before_queueing(client, home, tokens, tool_worker):
    install(client, tokens["owner"], package_bytes())
    for body, code in (("[1]", "invalid_json"), ("{bad", "invalid_json"), ("{}", "validation_error")):
        resp = call(client, "post", "/api/tools/echo/execute", tokens["agent"], data=body,
                    content_type="application/json")
        assert resp.status_code == 400 and resp.json()["error"]["code"] == code
    resp = call(client, "post", "/api/tools/ghost/execute", tokens["agent"], data={"input": "x"},
                content_type="application/json")
    assert resp.status_code == 404


@pytest.mark.django_db
def test_it_runs_a_tool_job_on_the_worker_side(home):
    T.install(home, package_bytes())
    body = run_tool_job({"tool": "echo", "input": '{"task":"hello"}'})
    assert body["ok"] and body["output"] == "echo:ok" and body["error"] is None and body["tool"] == "echo"
    assert run_tool_job({"tool": "ghost", "input": ""})["_tool_error"]["status"] == 404
    assert run_tool_job({"tool": 3})["_tool_error"]["code"] == "bad_request"


@pytest.mark.django_db
def test_it_installs_from_a_url(client, home, tokens, tool_worker, tmp_path):
    data = package_bytes()
    tar = tmp_path / "echo.tar"
    tar.write_bytes(data)
    body = {"url": tar.as_uri(), "sha256": T.sha256_hex(data)}
    resp = call(client, "post", "/api/tools/install", tokens["owner"], data=body, content_type="application/json")
    assert resp.status_code == 201, resp.content
    assert json.loads((home.tools_dir / "plugin-state.json").read_text())["plugins"]["echo"]["source"] == "url"
    assert_installed_and_runs(home)
    bad = call(client, "post", "/api/tools/install", tokens["owner"], data={**body, "sha256": "f" * 64},
               content_type="application/json")
    assert bad.status_code == 400 and "SHA256 mismatch" in bad.json()["error"]["message"]
    assert call(client, "post", "/api/tools/install", tokens["owner"], data={"sha256": "x"},
                content_type="application/json").status_code == 400
    denied = call(client, "post", "/api/tools/install", tokens["admin"], data=body, content_type="application/json")
    assert denied.status_code == 403
