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
