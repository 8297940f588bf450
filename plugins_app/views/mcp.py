"""The "Connect over MCP" page: the MCP client configuration for this service, with its real /mcp URL."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

MCP_PATH = "/mcp"  # where librefang_site/asgi.py mounts the MCP server (plugins_app/mcp/app.py)


def client_config(url: str, token: str = "<token>") -> str:
    """The `mcpServers` entry MCP clients read (Streamable HTTP URL + bearer header), as pretty JSON."""
    return json.dumps({"mcpServers": {"librefang": {"type": "http", "url": url,
                                                    "headers": {"Authorization": f"Bearer {token}"}}}}, indent=2)


@login_required
@require_GET
def mcp_page(request):
    url = request.build_absolute_uri(MCP_PATH)
    return render(request, "plugins_app/mcp.html", {"mcp_url": url, "mcp_config": client_config(url)})
