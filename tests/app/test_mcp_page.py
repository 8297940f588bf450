"""The "Connect over MCP" dashboard page: the client configuration with this service's real /mcp URL."""

import json
import re
from html import unescape

import pytest
from django.contrib.auth.models import User


@pytest.fixture
def viewer_client(client, db):
    client.force_login(User.objects.create_user("mcp-page", password="x"))
    return client


def test_it_shows_the_client_config_with_the_real_url(viewer_client, home, settings):
    settings.ALLOWED_HOSTS = ["agents.example"]
    page = viewer_client.get("/engine/mcp/", HTTP_HOST="agents.example:4545")
    assert page.status_code == 200
    html = page.content.decode()
    config = json.loads(unescape(re.search(r'<pre class="code" id="mcp-config"[^>]*>(.*?)</pre>', html, re.S)[1]))
    server = config["mcpServers"]["librefang"]
    assert server["url"] == "http://agents.example:4545/mcp"
    assert server["headers"] == {"Authorization": "Bearer <token>"}
    assert 'data-copy="#mcp-config"' in html


def test_it_is_linked_from_the_context_engine_page(viewer_client, home):
    assert 'href="/engine/mcp/"' in viewer_client.get("/engine/").content.decode()


def test_it_needs_a_login(client, db):
    assert client.get("/engine/mcp/").status_code == 302


def test_it_marks_mcp_traces_as_mcp_in_the_traces_explorer(viewer_client, home):
    import datetime as dt

    from plugins_app.models import HookTrace

    HookTrace.objects.create(trace_id="0123456789abcdef", plugin="recaller", hook="ingest", agent_id="a1",
                             started_at=dt.datetime.now(dt.UTC), elapsed_ms=3.0, ok=True, origin="mcp")
    listing = viewer_client.get("/traces/?origin=mcp").content.decode()
    assert "0123456789abcdef" in listing and '<span class="badge">MCP</span>' in listing
    assert '<span class="badge">test console</span>' not in listing
    detail = viewer_client.get("/traces/0123456789abcdef/").content.decode()
    assert "agent call over MCP" in detail and "test console" not in detail
