"""Smaller security holes, each closed with a real test: websocket paths no route matches, hook output
nested too deep to parse, one role table for API and dashboard, owner-only files under $LIBREFANG_HOME, and
login throttling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from channels.testing import WebsocketCommunicator

from engine import protocol as P
from engine.process.runner import PROCESS, HookCall
from engine.process.runtimes import resolve_tag
from engine.wasm import tools as T
from tests.app.tool_worker import tool_worker_fixture  # noqa: F401 (the tool_worker fixture)
from tests.fixtures.packages import MB, gzip_bomb, long_name_bomb, many_entries

DEEP = 100_000
REPO = Path(__file__).resolve().parents[2]


# ---- /ws/… paths no route matches ----

@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/ws/stderr/../../x/", "/ws/nothing-here/", "/ws/stderr/a/b/c/"])
async def test_it_closes_unknown_websocket_paths_with_4404_instead_of_failing(path):
    from librefang_site.asgi import application

    comm = WebsocketCommunicator(application, path)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    closed = await comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4404, "reason": "no such websocket route"}
    await comm.disconnect()


# ---- hook output nested too deep ----

def test_it_treats_json_nested_deeper_than_the_limit_as_text():
    deep = "[" * DEEP + "]" * DEEP
    assert P.parse_output("note\n" + deep) == {"text": "note\n" + deep}
    at_limit = "[" * P.MAX_JSON_DEPTH + "]" * P.MAX_JSON_DEPTH
    assert P.json_depth(P.parse_output(at_limit)) == P.MAX_JSON_DEPTH
    one_more = '{"a": ' * (P.MAX_JSON_DEPTH + 1) + "1" + "}" * (P.MAX_JSON_DEPTH + 1)
    assert P.parse_output(one_more) == {"text": one_more}
    # an earlier line that parses still wins over a too-deep last line (bottom-up scan)
    assert P.parse_output('{"ok": true}\n' + deep) == {"ok": True}


def test_it_answers_a_hook_printing_deeply_nested_json_with_the_text_fallback(tmp_path):
    plugin = tmp_path / "deep"
    (plugin / "hooks").mkdir(parents=True)
    (plugin / "hooks" / "ingest.py").write_text(
        f"import sys\nsys.stdin.read()\nprint('[' * {DEEP} + ']' * {DEEP})\n")
    call = HookCall(plugin_dir=plugin, script="hooks/ingest.py", runtime=resolve_tag("python"),
                    request={"type": "ingest", "message": "hi", "agent_id": "a1"}, timeout_secs=30,
                    data_dir=tmp_path / "data")
    result = PROCESS.run(call)
    assert result.ok, result.failure
    assert result.reply == {"text": "[" * DEEP + "]" * DEEP}
    json.dumps(result.to_dict())  # the reply travels on as JSON without a RecursionError


# ---- tool packages: a gzip bomb is refused before it is unpacked, by a worker ----

def _left_behind(home) -> list[str]:
    """Everything under tools/ except the lock and state files (which exist before any install)."""
    keep = {T.LOCK_FILE, T.STATE_FILE, T.INCOMING_DIR}
    return sorted(str(p.relative_to(home.tools_dir)) for p in home.tools_dir.rglob("*") if p.name not in keep)


@pytest.mark.parametrize("members,message", [
    ({"plugin.wasm": 200 * MB}, "declares 209715200 bytes, more than the module size policy"),
    ({"a.bin": 40 * MB, "b.bin": 40 * MB}, "package expands to more than"),
])
def test_it_refuses_a_gzip_bomb_before_extracting_it(home, members, message):
    bomb = gzip_bomb(members)
    assert len(bomb) < 300 * 1024  # a small upload…
    with pytest.raises(T.ToolError, match=message) as refused:
        T.install(home, bomb)  # …that would expand to 80-200 MB
    assert refused.value.status == 413 and refused.value.code == "payload_too_large"
    assert _left_behind(home) == []


def test_it_refuses_an_oversized_long_name_header_before_tarfile_reads_it(home):
    with pytest.raises(T.ToolError, match="extended \\(long name or pax\\) header") as refused:
        T.install(home, long_name_bomb(200 * MB))
    assert refused.value.status == 413
    assert _left_behind(home) == []


def test_it_refuses_packages_with_too_many_entries(home):
    with pytest.raises(T.ToolError, match=f"more than {T.MAX_MEMBERS} entries"):
        T.install(home, many_entries(T.MAX_MEMBERS + 1))
    assert _left_behind(home) == []


def test_it_extracts_a_large_member_without_holding_it_in_memory(tmp_path):
    """With a policy that allows a 160 MB module, unpacking streams it to disk: the process peaks far below it."""
    archive = tmp_path / "big.tar.gz"
    archive.write_bytes(gzip_bomb({"plugin.wasm": 160 * MB}))
    script = f"""
import sys
from pathlib import Path
from engine import wasm as W
from engine.wasm import tools as T
from engine.home import Home
home = Home(Path({str(tmp_path / 'home')!r}))
try:
    T.install_file(home, Path({str(archive)!r}), policy=W.WasmPolicy(max_module_bytes=200 * 1024 * 1024))
except T.ToolError as exc:
    print(exc.message, file=sys.stderr)
print(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])  # peak, kB
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "integrity check failed" in done.stderr  # it got to the end of the member (zeros are not the module)
    peak = int(done.stdout.split()[-1]) * 1024
    assert peak < 100 * MB, f"peak RSS {peak / MB:.0f} MB while unpacking a 160 MB member"
    assert not any((tmp_path / "home" / "tools" / T.INCOMING_DIR).iterdir())


@pytest.mark.django_db
def test_it_answers_413_for_a_gzip_bomb_sent_to_the_api_and_unpacks_it_on_the_worker(client, home, tool_worker):
    from plugins_app.models import AuditEntry
    from plugins_app.services.tokens import create_token

    _, owner = create_token("owner", "owner")
    resp = client.post("/api/tools/install", data=gzip_bomb({"plugin.wasm": 200 * MB}),
                       content_type="application/x-tar", HTTP_AUTHORIZATION=f"Bearer {owner}")
    assert resp.status_code == 413, resp.content
    error = resp.json()["error"]
    assert error["code"] == "payload_too_large" and "module size policy" in error["message"]
    assert len(tool_worker) == 1 and "staged" in tool_worker[0]  # the worker opened it, this process did not
    assert _left_behind(home) == [] and not any((home.tools_dir / T.INCOMING_DIR).iterdir())
    assert AuditEntry.objects.get(action="tool.install").ok is False


# ---- everything under $LIBREFANG_HOME is owner-only ----

LIST_MODES = """
import json, os
from django.conf import settings
from django.contrib.auth.models import User
User.objects.create_user("someone", "", "pw")  # a write: the -wal and -shm files exist while this connection is open
home = settings.LIBREFANG_HOME
modes = {str(p.relative_to(home)): p.stat().st_mode & 0o777 for p in [home, *home.rglob("*")]}
print(json.dumps(modes))
"""


def _fresh_home_env(home: Path) -> dict:
    env = {**os.environ, "LIBREFANG_HOME": str(home), "DJANGO_SETTINGS_MODULE": "librefang_site.settings"}
    for name in ("LIBREFANG_DB", "DATABASE_URL", "LIBREFANG_TEST_DB", "DJANGO_SECRET_KEY"):
        env.pop(name, None)  # the real defaults: SQLite in the home, a secret key file created there
    return env


def _manage(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_it_creates_everything_under_a_fresh_home_owner_only(tmp_path):
    home = tmp_path / "fresh-home"
    env = _fresh_home_env(home)
    _manage(env, "migrate", "--noinput")
    _manage(env, "firstrun", "--url", "http://127.0.0.1:4545/")
    modes = json.loads(_manage(env, "shell", "-c", LIST_MODES).strip().splitlines()[-1])
    for name in ("librefang.sqlite3", "librefang.sqlite3-wal", "librefang.sqlite3-shm", "secret_key",
                 "api_token", "admin_password"):
        assert modes.get(name) == 0o600, (name, oct(modes.get(name, 0)))
    assert modes["."] == 0o700 and modes["plugins"] == 0o700
    opened = {name: oct(mode) for name, mode in modes.items() if mode & 0o077}
    assert opened == {}, f"readable by group or others: {opened}"


def test_it_tightens_a_home_created_before_the_umask(tmp_path):
    home = tmp_path / "old-home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    env = _fresh_home_env(home)
    _manage(env, "migrate", "--noinput")
    for name in ("", "librefang.sqlite3"):
        (home / name).chmod(0o755 if not name else 0o644)  # as an older version left them
    _manage(env, "check")
    assert home.stat().st_mode & 0o777 == 0o700
    assert (home / "librefang.sqlite3").stat().st_mode & 0o777 == 0o600


# ---- one role table for the API and the dashboard ----

# Dashboard actions and the API operation each one mirrors.
DASHBOARD_ACTIONS = [
    ("/plugins/p1/reload/", "plugins_reload"),
    ("/plugins/p1/enable/", "plugins_enable"),
    ("/plugins/p1/disable/", "plugins_disable"),
    ("/plugins/p1/test-hook/", "plugins_test_hook"),
    ("/create/", "plugins_scaffold"),
    ("/install/", "plugins_install"),
    ("/engine/config/", "engine_config_put"),
    ("/tools/install/", "tools_install"),
    ("/tools/t1/disable/", "tools_disable"),
    ("/plugins/p1/uninstall/", "plugins_uninstall"),  # last: an admin may, and it removes p1
]


def test_every_api_route_but_health_and_the_404_takes_its_role_from_the_table():
    from plugins_app.api import api
    from plugins_app.api.security import TokenAuth, route_roles
    from plugins_app.auth import ACTION_ROLES

    public = set()
    for prefix, router in api._routers:
        for path, view in router.path_operations.items():
            for op in view.operations:
                if not op.auth_callbacks:
                    public.add(prefix + path)
                    continue
                [check] = op.auth_callbacks
                assert isinstance(check, TokenAuth) and check.action in ACTION_ROLES, (path, check)
    assert public == {"//health", "//{path:rest}"}
    roles = route_roles(api)
    assert roles["plugins_reload"] == roles["plugins_enable"] == "owner"
    assert roles["hook_ingest"] == roles["memories_list"] == "agent"


def test_a_route_cannot_be_declared_with_a_role_of_its_own_or_an_action_the_table_lacks():
    from django.core.exceptions import ImproperlyConfigured

    from plugins_app.api.security import ActionRouter, TokenAuth

    router = ActionRouter()
    with pytest.raises(ImproperlyConfigured, match="no role"):
        router.get("/a", operation_id="plugins_frobnicate")(lambda request: None)
    with pytest.raises(ImproperlyConfigured, match="names its action"):
        router.get("/b", auth=TokenAuth("plugins_list"), operation_id="plugins_list")(lambda request: None)
    with pytest.raises(ImproperlyConfigured, match="names no action"):
        router.get("/c")(lambda request: None)


@pytest.mark.django_db
def test_a_route_enforces_what_the_table_says_now(client, home, monkeypatch):
    from plugins_app.auth import ACTION_ROLES
    from plugins_app.services.tokens import create_token

    _, viewer = create_token("reader", "viewer")
    assert client.get("/api/plugins", HTTP_AUTHORIZATION=f"Bearer {viewer}").status_code == 200
    monkeypatch.setitem(ACTION_ROLES, "plugins_list", "owner")
    r = client.get("/api/plugins", HTTP_AUTHORIZATION=f"Bearer {viewer}")
    assert r.status_code == 403
    assert r.json()["error"]["message"] == "this route needs the owner role; the token has viewer"


@pytest.mark.django_db
def test_it_refuses_admins_on_the_dashboard_exactly_where_the_api_does(client, home):
    from django.contrib.auth.models import User

    from plugins_app.api import api
    from plugins_app.api.security import route_roles
    from plugins_app.services.tokens import create_token
    from tests.plugin_factory import PY_ECHO_INGEST, make_plugin

    make_plugin(home.plugins_dir, "p1", {"ingest": PY_ECHO_INGEST})
    roles = route_roles(api)
    client.force_login(User.objects.create_user("ops", "", "pw", is_staff=True))  # a dashboard admin
    for url, op in DASHBOARD_ACTIONS:
        status = client.post(url, {}).status_code
        if roles[op] == "owner":
            assert status == 403, (url, op)
        else:
            assert status != 403, (url, op, status)
    assert not (home.plugins_dir / "p1").exists()  # uninstall is an admin's: it ran
    _, admin_token = create_token("ops", "admin")
    api_status = client.post("/api/plugins/p1/reload", HTTP_AUTHORIZATION=f"Bearer {admin_token}").status_code
    assert api_status == 403


@pytest.mark.django_db
def test_it_lets_owners_reload_and_enable_from_the_dashboard(client, home):
    from django.contrib.auth.models import User

    from plugins_app.selectors import plugins as plugin_selectors
    from tests.plugin_factory import PY_ECHO_INGEST, make_plugin

    make_plugin(home.plugins_dir, "p1", {"ingest": PY_ECHO_INGEST})
    client.force_login(User.objects.create_superuser("boss", "", "pw"))
    assert client.post("/plugins/p1/disable/").status_code == 302
    assert plugin_selectors.get_plugin("p1").enabled is False
    resp = client.post("/plugins/p1/enable/")
    assert resp.status_code == 302 and resp["Location"] == "/plugins/p1/"
    assert plugin_selectors.get_plugin("p1").enabled is True
    assert client.post("/plugins/p1/reload/").status_code == 302


# ---- login throttling ----

def _login(client, password: str, *, peer: str = "203.0.113.7", forwarded: str | None = None):
    extra = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return client.post("/login/", {"username": "admin", "password": password}, **extra)


@pytest.fixture
def admin_user(db):
    from django.contrib.auth.models import User

    return User.objects.create_superuser("admin", "", "right-password")


def test_it_locks_a_username_and_address_out_after_ten_failures(client, admin_user, settings):
    assert settings.AXES_FAILURE_LIMIT == 10
    for attempt in range(9):
        resp = _login(client, f"wrong-{attempt}")
        assert resp.status_code == 200 and "Wrong username or password" in resp.content.decode()
    for _ in range(2):  # the 10th failure locks; the 11th is refused as locked
        resp = _login(client, "still-wrong")
        assert resp.status_code == 429
    resp = _login(client, "right-password")
    page = resp.content.decode()
    assert resp.status_code == 429 and 'id="login-locked"' in page
    assert "Too many failed logins" in page and "try again in 15 minutes" in page
    assert "_auth_user_id" not in client.session
    # without a trusted proxy, X-Forwarded-For is the client's own say: ignored, the peer is still locked
    assert _login(client, "right-password", forwarded="198.51.100.99").status_code == 429
    # another address is counted apart
    resp = _login(client, "right-password", peer="203.0.113.8")
    assert resp.status_code == 302 and client.session["_auth_user_id"] == str(admin_user.pk)


def test_it_reads_x_forwarded_for_only_from_a_trusted_proxy(client, admin_user, settings):
    from django.test import RequestFactory

    from plugins_app.views.login import client_ip

    settings.LIBREFANG_TRUSTED_PROXIES = ["10.0.0.0/8"]
    via_proxy = RequestFactory().get("/", REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.1")
    assert client_ip(via_proxy) == "198.51.100.1"  # the rightmost address the proxy did not add itself
    direct = RequestFactory().get("/", REMOTE_ADDR="198.51.100.1", HTTP_X_FORWARDED_FOR="10.9.9.9")
    assert client_ip(direct) == "198.51.100.1"
    for _ in range(10):
        _login(client, "wrong", peer="10.1.2.3", forwarded="198.51.100.1")
    assert _login(client, "right-password", peer="10.1.2.3", forwarded="198.51.100.1").status_code == 429
    assert _login(client, "right-password", peer="10.1.2.3", forwarded="198.51.100.2").status_code == 302
