"""The monitoring pieces show up where operators look: charts on the plugin and context-engine pages, the
filtered audit log on the tokens page, and test-console runs beside (never inside) agent calls on the list."""

from __future__ import annotations

import time
import uuid

import pytest
from django.contrib.auth.models import User

from engine.ports import TEST_CONSOLE, Invocation
from plugins_app.services import audit
from plugins_app.services.recording import record_now
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(client):
    client.force_login(User.objects.create_superuser("boss", "", "pw"))


def _call(plugin: str, origin: str = "agent", ok: bool = True) -> Invocation:
    return Invocation(trace_id=uuid.uuid4().hex[:16], plugin=plugin, hook="ingest", agent_id="a1",
                      started_at=time.time(), elapsed_ms=12.0, ok=ok, origin=origin)


def test_it_draws_a_chart_for_the_plugin_and_for_the_whole_engine(client, home, owner):
    make_plugin(home.plugins_dir, "charted", {"ingest": PY_ECHO_INGEST})
    plugin_page = client.get("/plugins/charted/").content.decode()
    assert "data-chart" in plugin_page and "plugin=charted" in plugin_page
    engine_page = client.get("/engine/").content.decode()
    assert "data-chart" in engine_page and "plugin=&amp;hook=" in engine_page


def test_it_filters_the_audit_log_on_the_tokens_page(client, home, owner):
    audit.record("user:boss", "plugin.reload", "alpha", ok=True)
    audit.record("user:boss", "plugin.disable", "beta", ok=True)
    page = client.get("/tokens/?action=plugin.disable").content.decode()
    assert 'data-audit-action="plugin.disable"' in page
    assert 'data-audit-action="plugin.reload"' not in page


def test_it_shows_test_console_runs_apart_from_agent_calls(client, home, owner):
    make_plugin(home.plugins_dir, "counted", {"ingest": PY_ECHO_INGEST})
    record_now([_call("counted"), _call("counted", ok=False), _call("counted", TEST_CONSOLE),
                _call("counted", TEST_CONSOLE), _call("counted", TEST_CONSOLE)])
    page = client.get("/").content.decode()
    row = page[page.index('id="plugin-row-counted"'):]
    row = row[:row.index("</tr>")]
    calls = row[row.index('data-metric="calls">') + len('data-metric="calls">'):]
    assert calls.startswith("2 ")
    assert "+3 test" in row
