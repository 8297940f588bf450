"""Plugins as MCP resources (viewer role): `librefang://plugins/<name>/manifest` (its plugin.toml) and
`librefang://plugins/<name>/traces` (its most recent traces, newest first, as JSON)."""

from __future__ import annotations

import json
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from engine.plugins.loader import manifest_path
from engine.plugins.permissions import masked_env
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors import traces as trace_selectors

SCHEME = "librefang://plugins/"
RECENT_TRACES = 50


def listing() -> list[dict[str, Any]]:
    out = []
    for name in plugin_selectors.installed_names():
        out.append({"uri": f"{SCHEME}{name}/manifest", "name": f"{name} manifest", "mime_type": "application/toml",
                    "description": f"plugin.toml of the {name} plugin"})
        out.append({"uri": f"{SCHEME}{name}/traces", "name": f"{name} traces", "mime_type": "application/json",
                    "description": f"the {RECENT_TRACES} most recent traces of the {name} plugin"})
    return out


def read(uri: str) -> tuple[str, str] | None:
    """(mime type, text) of a resource, or None for an unknown one."""
    if not uri.startswith(SCHEME):
        return None
    name, _, kind = uri[len(SCHEME):].rpartition("/")
    entry = plugin_selectors.installed_entry(name) if name else None
    if entry is None:
        return None
    if kind == "manifest":
        try:
            return "application/toml", masked_manifest(manifest_path(entry.dir).read_text())
        except (OSError, UnicodeDecodeError):
            return None
    if kind == "traces":
        found = trace_selectors.search_traces(trace_selectors.TraceQuery(plugin=name), per_page=RECENT_TRACES)
        traces = found["traces"]  # each with its origin ("mcp" for calls over /mcp) and the job's fallback
        return "application/json", json.dumps({"plugin": name, "traces": traces}, default=str)
    return None


def masked_manifest(text: str) -> str:
    """plugin.toml as a viewer may read it: [env] values of keys named like a credential shown as `***`, as
    `GET /api/plugins/<name>/env` shows them. A file that does not parse is shown as a notice, never raw."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        return f"# plugin.toml does not parse ({exc}); it is not shown\n"
    env = doc.get("env")
    if isinstance(env, dict):
        for key, value in masked_env({str(k): v for k, v in env.items()}).items():
            if value == "***":
                env[key] = "***"
    return tomlkit.dumps(doc)
