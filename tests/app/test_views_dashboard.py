"""Dashboard pages through Django's test client: every page renders, actions work, denial cases refused."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from plugins_app.models import ApiToken, AuditEntry, HookMetric, HookMetricBucket
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(client):
    user = User.objects.create_superuser("boss", "", "pw")
    client.force_login(user)
    return user


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("reader", "", "pw")
    client.force_login(user)
    return user


def test_it_redirects_anonymous_users_to_login(client, home):
    for url in ("/", "/engine/", "/doctor/", "/tokens/", "/create/", "/install/"):
        resp = client.get(url)
        assert resp.status_code == 302, url
        assert resp["Location"].startswith("/login/")


def test_it_lists_plugins_with_all_hook_badges_and_filters(client, home, owner):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    make_plugin(home.plugins_dir, "beta", {"after_turn": "print('{}')"}, runtime="bash", ext="sh")
    (home.plugin_dir("beta") / ".disabled").touch()
    HookMetric.objects.create(plugin="alpha", hook="ingest", calls=3, failures=1)
    from django.utils import timezone

    HookMetricBucket.objects.create(plugin="alpha", hook="ingest", minute=timezone.now().replace(second=0,
                                    microsecond=0), calls=3, failures=1, latency_ms_total=30,
                                    histogram={"10": 2, "25": 1})
    resp = client.get("/")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert 'id="plugin-row-alpha"' in html and 'id="plugin-row-beta"' in html
    assert "Create plugin" in html and "Install" in html
    row = html.split('id="plugin-row-alpha"')[1].split("</tr>")[0]
    for hook in ("ingest", "after_turn", "assemble", "compact", "bootstrap", "prepare_subagent", "merge_subagent",
                 "transform_tool_result", "on_event"):
        assert hook in row
    assert "33.3 %" in row  # error rate over the last hour
    only_disabled = client.get("/?enabled=no").content.decode()
    assert 'id="plugin-row-beta"' in only_disabled and 'id="plugin-row-alpha"' not in only_disabled
    with_errors = client.get("/?errors=1").content.decode()
    assert 'id="plugin-row-alpha"' in with_errors and 'id="plugin-row-beta"' not in with_errors
    by_runtime = client.get("/?runtime=bash").content.decode()
    assert 'id="plugin-row-beta"' in by_runtime and 'id="plugin-row-alpha"' not in by_runtime


def test_it_shows_an_empty_state_without_plugins(client, home, owner):
    html = client.get("/").content.decode()
    assert "No plugins installed yet" in html


def test_it_renders_the_plugin_page_with_manifest_hooks_and_console(client, home, owner):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST, "assemble": "print('{}')"})
    resp = client.get("/plugins/alpha/")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert 'id="hook-row-ingest"' in html and 'id="hook-row-assemble"' in html
    assert "hooks/ingest.py" in html
    assert "Raw plugin.toml" in html and 'name = &quot;alpha&quot;' in html
    assert '"message": "Remember that the review moved to Thursday."' in html.replace("&quot;", '"')
    assert 'ws-connect="/ws/stderr/alpha/"' in html
    assert client.get("/plugins/nope/").status_code == 404


def test_it_gives_the_example_request_for_each_hook(client, home, owner):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    html = client.get("/plugins/alpha/test-hook/example/?hook=compact").content.decode()
    assert 'id="test-payload"' in html and "context_window_tokens" in html
    assert client.get("/plugins/alpha/test-hook/example/?hook=bogus").status_code == 400


def test_it_disables_enables_and_reloads_with_audit_entries(client, home, owner):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    resp = client.post("/plugins/alpha/disable/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert 'data-ok="true"' in html and "disabled" in html
    assert 'id="plugin-state" hx-swap-oob="outerHTML"' in html
    toggle = html.split('id="toggle-form"')[1].split("</form>")[0]
    assert "/plugins/alpha/enable/" in toggle and ">Enable</button>" in toggle  # the button flips
    assert 'id="plugin-audit" hx-swap-oob="outerHTML"' in html and "plugin.disable" in html
    assert (home.plugin_dir("alpha") / ".disabled").exists()
    client.post("/plugins/alpha/enable/", HTTP_HX_REQUEST="true")
    assert not (home.plugin_dir("alpha") / ".disabled").exists()
    assert "Reload: done" in client.post("/plugins/alpha/reload/", HTTP_HX_REQUEST="true").content.decode()
    actions = list(AuditEntry.objects.filter(target="alpha").values_list("action", "actor"))
    assert ("plugin.disable", "user:boss") in actions
    assert ("plugin.enable", "user:boss") in actions
    assert ("plugin.reload", "user:boss") in actions


def test_it_uninstalls_from_the_plugin_page_and_goes_back_to_the_list(client, home, owner):
    make_plugin(home.plugins_dir, "doomed", {"ingest": PY_ECHO_INGEST})
    resp = client.post("/plugins/doomed/uninstall/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 204 and resp["HX-Redirect"] == "/"
    assert not home.plugin_dir("doomed").exists()
    assert AuditEntry.objects.filter(action="plugin.uninstall", target="doomed", actor="user:boss").exists()
    assert "doomed was uninstalled" in client.get("/").content.decode()
    again = client.post("/plugins/doomed/uninstall/", HTTP_HX_REQUEST="true")
    assert again.status_code == 200 and 'data-ok="false"' in again.content.decode()


def test_it_reports_a_broken_manifest_on_reload_without_a_500(client, home, owner):
    pdir = make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    client.get("/plugins/alpha/")  # the catalog has a good configuration
    (pdir / "plugin.toml").write_text("name = [broken\n")
    resp = client.post("/plugins/alpha/reload/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert 'data-ok="false"' in html and "previous configuration keeps serving" in html


def test_it_refuses_actions_to_viewers(client, home, viewer):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    assert client.get("/plugins/alpha/").status_code == 200  # reading is fine
    assert client.post("/plugins/alpha/disable/").status_code == 403
    assert not (home.plugin_dir("alpha") / ".disabled").exists()
    assert client.post("/plugins/alpha/uninstall/").status_code == 403
    assert home.plugin_dir("alpha").exists()
    assert client.post("/plugins/alpha/test-hook/", {"hook": "ingest", "payload": "{}"}).status_code == 403
    assert client.get("/create/").status_code == 403
    assert client.post("/create/", {"name": "x", "runtime": "python", "hooks": ["ingest"]}).status_code == 403
    assert not home.plugin_dir("x").exists()
    assert client.get("/tokens/").status_code == 403
    assert client.post("/tokens/new/", {"name": "t", "role": "owner"}).status_code == 403
    assert not ApiToken.objects.exists()
    assert client.post("/engine/config/", {"mode": "plugin", "plugin": "alpha"}).status_code == 403


def test_it_checks_plugin_names_as_you_type(client, home, owner):
    make_plugin(home.plugins_dir, "taken", {"ingest": PY_ECHO_INGEST})
    assert "is available" in client.get("/create/check-name/?name=fresh-one").content.decode()
    assert "already exists" in client.get("/create/check-name/?name=taken").content.decode()
    assert "letters, digits" in client.get("/create/check-name/?name=bad%20name").content.decode()
    assert "Enter a name" in client.get("/create/check-name/?name=").content.decode()


def test_it_creates_a_plugin_from_the_form_and_goes_to_its_page(client, home, owner):
    page = client.get("/create/").content.decode()
    for tag in ("python", "node", "bash", "wasm", "deno", "go", "lua", "php", "ruby", "bun", "v", "native"):
        assert f'value="{tag}"' in page
    resp = client.post("/create/", {"name": "fresh", "description": "new one", "runtime": "python",
                                    "hooks": ["ingest", "after_turn"]})
    assert resp.status_code == 302 and resp["Location"] == "/plugins/fresh/"
    assert (home.plugin_dir("fresh") / "plugin.toml").exists()
    assert AuditEntry.objects.filter(action="plugin.scaffold", target="fresh", actor="user:boss").exists()
    again = client.post("/create/", {"name": "fresh", "runtime": "python", "hooks": ["ingest"]})
    assert again.status_code == 400 and "already exists" in again.content.decode()
    bad = client.post("/create/", {"name": "../etc", "runtime": "python", "hooks": []})
    assert bad.status_code == 400
    assert "Pick at least one hook" in bad.content.decode()


def test_it_installs_from_a_local_path_and_shows_install_errors(client, home, owner, tmp_path):
    src = make_plugin(tmp_path / "src", "imported", {"ingest": PY_ECHO_INGEST})
    resp = client.post("/install/", {"source": "local", "path": str(src)})
    assert resp.status_code == 302 and resp["Location"] == "/plugins/imported/"
    missing = client.post("/install/", {"source": "local", "path": str(tmp_path / "nothing-here")})
    assert missing.status_code == 400 and "Install failed" in missing.content.decode()
    empty = client.post("/install/", {"source": "git", "url": ""})
    assert empty.status_code == 400 and "required for this source" in empty.content.decode()


def test_it_rejects_invalid_json_in_the_test_console(client, home, owner):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    html = client.post("/plugins/alpha/test-hook/", {"hook": "ingest", "payload": "{nope"}).content.decode()
    assert "Not valid JSON" in html
    html = client.post("/plugins/alpha/test-hook/", {"hook": "ingest", "payload": "[1]"}).content.decode()
    assert "must be a JSON object" in html
    html = client.post("/plugins/alpha/test-hook/", {"hook": "compact", "payload": "{}"}).content.decode()
    assert "does not declare the compact hook" in html


def test_it_changes_the_active_engine_from_the_engine_page(client, home, owner):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    make_plugin(home.plugins_dir, "beta", {"ingest": PY_ECHO_INGEST})
    assert client.get("/engine/").status_code == 200
    resp = client.post("/engine/config/", {"mode": "stack", "stack": "beta, alpha"}, HTTP_HX_REQUEST="true")
    assert resp.status_code == 200 and "Saved" in resp.content.decode()
    assert 'plugin_stack = ["beta", "alpha"]' in (home.root / "config.toml").read_text()
    html = client.get("/engine/").content.decode()
    assert html.index(">beta</a>") < html.index(">alpha</a>")
    bad = client.post("/engine/config/", {"mode": "stack", "stack": "beta, ghost"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "ghost" in bad.content.decode()
    assert 'plugin_stack = ["beta", "alpha"]' in (home.root / "config.toml").read_text()
    client.post("/engine/config/", {"mode": "default"})
    assert "plugin" not in (home.root / "config.toml").read_text().split("[context_engine]")[1]


def test_it_shows_every_runtime_on_the_doctor_page(client, home, owner):
    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    html = client.get("/doctor/").content.decode()
    for tag in ("python", "node", "bash", "wasm", "go"):
        assert f'id="runtime-{tag}"' in html
    assert 'id="doctor-alpha"' in html


def test_it_lets_owners_create_and_revoke_tokens(client, home, owner):
    resp = client.post("/tokens/new/", {"name": "agent-1", "role": "agent"})
    assert resp.status_code == 302 and resp["Location"] == "/tokens/"  # post/redirect/get
    html = client.get("/tokens/").content.decode()
    assert "will not be shown again" in html
    token = ApiToken.objects.get(name="agent-1")
    raw = html.split("data-token>")[1].split("</code>")[0]
    assert raw.startswith(token.prefix)
    assert 'data-copy="#new-token-value"' in html
    # a refresh neither creates a second token nor shows the secret again
    again = client.get("/tokens/").content.decode()
    assert raw not in again and ApiToken.objects.filter(name="agent-1").count() == 1
    assert 'data-confirm="Revoke the token “agent-1” (agent)?' in again
    resp = client.post(f"/tokens/{token.pk}/revoke/", follow=True)
    assert resp.status_code == 200 and "is revoked" in resp.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert client.post("/tokens/9999/revoke/").status_code == 404
    assert client.post("/tokens/new/", {"name": "", "role": "agent"}).status_code == 400
    audit = client.get("/tokens/").content.decode()
    assert "token.create" in audit and "token.revoke" in audit


def test_it_treats_the_owner_group_as_owners(client, home):
    user = User.objects.create_user("grouped", "", "pw")
    user.groups.add(Group.objects.create(name="owner"))
    client.force_login(user)
    assert client.get("/tokens/").status_code == 200
    assert "Tokens &amp; audit" in client.get("/").content.decode()


def test_it_keeps_viewers_out_of_the_tokens_nav(client, home, viewer):
    assert "Tokens &amp; audit" not in client.get("/").content.decode()


def test_it_renders_engine_health(client, home, owner):
    write_config(home.root)
    resp = client.get("/engine/health/")
    assert resp.status_code == 200
    assert "Redis" in resp.content.decode()


def test_it_draws_a_latency_bar_per_minute_with_failures_marked(home):
    import datetime as dt

    from django.utils import timezone

    from plugins_app.selectors.dashboard import hook_rows

    make_plugin(home.plugins_dir, "charted", {"ingest": PY_ECHO_INGEST})
    now = timezone.now().replace(second=0, microsecond=0)
    HookMetricBucket.objects.create(plugin="charted", hook="ingest", minute=now, calls=2, latency_ms_total=40)
    HookMetricBucket.objects.create(plugin="charted", hook="ingest", minute=now - dt.timedelta(minutes=10), calls=1,
                                    failures=1, latency_ms_total=10)
    HookMetricBucket.objects.create(plugin="charted", hook="ingest", minute=now - dt.timedelta(hours=2), calls=9,
                                    latency_ms_total=900)  # outside the hour
    chart = hook_rows("charted")[0]["chart"]
    assert not chart["empty"] and chart["max_ms"] == 20.0
    assert [b["failed"] for b in chart["bars"]] == [True, False]
    older, newest = chart["bars"]
    assert newest["h"] > older["h"] and newest["x"] > older["x"]


def test_it_renders_pages_for_a_plugin_whose_manifest_is_broken(client, home, owner):
    pdir = home.plugin_dir("wrecked")
    pdir.mkdir()
    (pdir / "plugin.toml").write_text('name = "wrecked"\nversion = [oops\n')
    listing = client.get("/")
    assert listing.status_code == 200 and "invalid" in listing.content.decode()
    page = client.get("/plugins/wrecked/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "invalid" in html and "version = [oops" in html
    assert client.get("/doctor/").status_code == 200
    assert client.post("/plugins/wrecked/reload/", HTTP_HX_REQUEST="true").status_code == 200


def test_it_says_no_plugin_serves_and_workers_are_unknown_while_redis_is_down(client, home, owner, settings,
                                                                               monkeypatch):
    """With Redis unreachable agents get the default engine and the workers' heartbeats cannot be read: no badge says
    "serving" and no panel says "no worker is running" (a worker may well be)."""
    from plugins_app.selectors import health

    make_plugin(home.plugins_dir, "steady", {"ingest": PY_ECHO_INGEST})
    write_config(home.root, plugin="steady")
    assert 'data-state="serving"' in client.get("/").content.decode()  # the same page with Redis up
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    monkeypatch.setattr(health, "_outage_cache", (0.0, []))
    listing = client.get("/").content.decode()
    assert 'data-state="serving"' not in listing and 'data-state="serving-paused"' in listing
    assert "serving agents:" not in listing and "in the chain: steady" in listing
    assert 'data-state="serving"' not in client.get("/plugins/steady/").content.decode()
    engine = client.get("/engine/").content.decode()
    assert 'class="badge ok">serving<' not in engine and "data-layer-paused" in engine
    assert "Serving agents now: <strong>the built-in default engine</strong>" in engine
    panel = client.get("/engine/health/").content.decode()
    assert "data-workers-unknown" in panel and "no worker is running" not in panel
