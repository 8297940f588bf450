"""Reads and writes a plugin cannot turn against the operator, through the real service: the MCP manifest resource
shows [env] credentials masked as REST does, an invalid installed manifest gets a clear 4xx from update-check, and
an empty or non-object body never switches the context engine."""

from __future__ import annotations

import asyncio

from tests.e2e.test_mcp import session_run, token
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config

SECRET = "sk-live-0123456789"


def test_the_mcp_manifest_resource_masks_env_credentials_as_rest_does(live):
    make_plugin(live.home / "plugins", "keyed", {"ingest": PY_ECHO_INGEST},
                top_extra=f'[env]\nOPENAI_API_KEY = "{SECRET}"\nDB_PASSWORD = "{SECRET}"\nMODE = "fast"')
    status, rest = live.request("GET", "/api/plugins/keyed/env")
    assert status == 200 and rest["env"] == {"DB_PASSWORD": "***", "MODE": "fast", "OPENAI_API_KEY": "***"}

    async def scenario(session, init):
        got = await session.read_resource("librefang://plugins/keyed/manifest")
        return got.contents[0].text

    text = asyncio.run(session_run(live.url + "/mcp", token(live, "viewer"), scenario))
    assert SECRET not in text
    assert 'OPENAI_API_KEY = "***"' in text and 'DB_PASSWORD = "***"' in text and 'MODE = "fast"' in text


def test_update_check_of_an_invalid_manifest_is_a_clear_4xx(live):
    pdir = make_plugin(live.home / "plugins", "broken-check", {"ingest": PY_ECHO_INGEST})
    (pdir / "plugin.toml").write_text('name = "broken-check"\n[hooks]\nhook_timeout_secs = "soon"\n')
    status, body = live.request("GET", "/api/plugins/broken-check/update-check")
    assert status == 409, body
    assert body["error"]["code"] == "invalid_manifest" and "hook_timeout_secs" in body["error"]["message"]


def test_an_empty_or_non_object_config_body_does_not_switch_the_engine(live):
    make_plugin(live.home / "plugins", "kept", {"ingest": PY_ECHO_INGEST})
    write_config(live.home, plugin="kept")
    for body in ({}, [], "kept", None):
        status, answer = live.request("PUT", "/api/context-engine/config", body)
        assert status == 400, (body, answer)
        assert answer["error"]["code"] == "validation_error"
        status, cfg = live.request("GET", "/api/context-engine/config")
        assert cfg["plugin"] == "kept", (body, cfg)
    status, cfg = live.request("PUT", "/api/context-engine/config", {"plugin": None})  # asked for: the default
    assert status == 200 and cfg["plugin"] is None
