"""The Model Context Protocol server at /mcp (Streamable HTTP, the official `mcp` SDK), mounted in the same ASGI
application as the API: the context engine's hooks and the WASM tools as MCP tools, plugins as MCP resources.
librefang_site/asgi.py routes the /mcp prefix to plugins_app.mcp.app.McpApp."""
