"""States from outcomes, not configuration (plugins_app/selectors/outcomes.py): a plugin whose recent agent calls of a
hook fail is "failing" for that hook on every panel that names it, error rates are per hook, and a plugin.toml that
does not load is never shown green."""

from __future__ import annotations

import time
import uuid

import pytest
from django.contrib.auth.models import User

from engine.ports import Invocation
from plugins_app.services.recording import record_now
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owner(client):
    user = User.objects.create_superuser("boss", "", "pw")
    client.force_login(user)
    return user


def calls(plugin: str, hook: str, *, ok: int = 0, failed: int = 0, origin: str = "agent") -> None:
    """Record agent calls as the worker's trace writer does (the real recording path)."""
    now = time.time()
    record_now([Invocation(trace_id=uuid.uuid4().hex[:16], plugin=plugin, hook=hook, agent_id="a1", started_at=now,
                           elapsed_ms=5.0, ok=i >= failed, error_kind="" if i >= failed else "script_error",
                           error="" if i >= failed else "exit code 1: boom", origin=origin)
                for i in range(ok + failed)])


@pytest.fixture
def crashing(home):
    make_plugin(home.plugins_dir, "crashy", {"ingest": "import sys\nsys.exit(1)\n", "after_turn": PY_ECHO_INGEST})
    write_config(home.root, plugin="crashy")
    calls("crashy", "ingest", failed=50)
    calls("crashy", "after_turn", ok=51)
    return "crashy"


def test_it_shows_a_plugin_failing_its_hook_on_every_panel(client, owner, crashing):
    row = client.get("/").content.decode()
    assert 'data-failing-hook="ingest"' in row and "failing ingest (50/50)" in row
    assert "failing: crashy (ingest); those calls get the default engine" in row  # the page head's summary
    assert 'data-state="serving"' not in row  # not "serving agents" while its calls fall back
    assert 'data-hook-rate="ingest"' in row and "100" in row.split('data-hook-rate="ingest"')[1][:200]
    assert "50.5" not in row  # never one rate blending the failing hook with the healthy one
    page = client.get("/plugins/crashy/").content.decode()
    assert "50 of 50 agent calls of <code>ingest</code> failed" in page and "exit code 1: boom" in page
    assert "/traces/?plugin=crashy&amp;hook=ingest&amp;outcome=failed" in page
    assert "outcomes.failing" in page  # the plugin's doctor panel
    engine = client.get("/engine/").content.decode()
    assert 'data-failing-hook="ingest"' in engine and "failing: crashy (ingest)" in engine
    health = client.get("/engine/health/").content.decode()
    assert "degraded" in health and "data-health-failing" in health
    doctor = client.get("/doctor/").content.decode()
    assert "problems found" in doctor and "crashy is failing its ingest hook" in doctor
    assert "crashy" in client.get("/?errors=1").content.decode()
    body = client.get("/api/health").json()
    assert body["failing"]["crashy"]["ingest"]["failures"] == 50 and "after_turn" not in body["failing"]["crashy"]


def test_it_does_not_call_a_plugin_failing_for_a_few_errors_or_for_test_console_runs(client, owner, home):
    make_plugin(home.plugins_dir, "mostly", {"ingest": PY_ECHO_INGEST})
    write_config(home.root, plugin="mostly")
    calls("mostly", "ingest", ok=20, failed=2)  # below the rate
    calls("mostly", "ingest", failed=10, origin="test_console")  # not agent traffic
    row = client.get("/").content.decode()
    assert 'data-failing-hook' not in row and 'data-state="serving"' in row
    assert client.get("/api/health").json()["failing"] == {}


def test_it_never_shows_a_plugin_toml_that_does_not_load_as_green(client, owner, home):
    pdir = make_plugin(home.plugins_dir, "broken", {"ingest": PY_ECHO_INGEST})
    write_config(home.root, plugin="broken")
    assert 'data-state="enabled"' in client.get("/").content.decode()  # loads, and has loaded once
    (pdir / "plugin.toml").write_text((pdir / "plugin.toml").read_text() + "hook_timeout_secs = [\n")
    html = client.get("/").content.decode()
    state = html.split('data-label="State">')[1].split("</td>")[0]
    assert "badge ok" not in state and ('data-state="manifest-invalid"' in state or 'data-state="invalid"' in state)


def test_it_charts_the_error_rate_per_hook_and_marks_reloads_and_worker_starts(client, owner, crashing):
    from plugins_app.services import audit

    audit.record("user:boss", "plugin.reload", "crashy")
    audit.record("worker:w1", "worker.start", "host")
    audit.record("user:boss", "plugin.reload", "someone-else")
    data = client.get("/metrics/chart.json", {"range": "15m", "plugin": "crashy"}).json()
    rates = data["error_rate_by_hook"]
    assert max(r for r in rates["ingest"] if r is not None) == 100.0
    assert max(r for r in rates["after_turn"] if r is not None) == 0.0
    assert sorted(m["label"] for m in data["markers"]) == ["reload: crashy", "worker started: host"]
