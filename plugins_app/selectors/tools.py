"""Reads about installed WASM tool plugins (files under $LIBREFANG_HOME/tools): what the API and dashboard list."""

from __future__ import annotations

from typing import Any

from engine import wasm as W
from engine.wasm import tools as T
from plugins_app.home import home


def policy() -> W.WasmPolicy:
    return W.policy_for(home().config_path)


def policy_error() -> str | None:
    """The config.toml problem that keeps the previous wasm policy serving, if any."""
    return W.policy_error(home().config_path)


def tools_dir() -> str:
    return str(home().tools_dir)


def list_tools() -> list[dict[str, Any]]:
    current = policy()
    return [T.describe(tool, current) for tool in T.list_tools(home())]


def get_tool(tool_id: str) -> dict[str, Any]:
    """Raises engine.wasm.tools.ToolError (404) for an unknown id."""
    return T.describe(T.get_tool(home(), tool_id), policy())


def policy_summary() -> dict[str, Any]:
    p = policy()
    return {
        "max_execution_ms": p.max_execution_ms, "fuel_limit": p.fuel_limit, "memory_limit_mb": p.memory_limit_mb,
        "max_module_bytes": p.max_module_bytes, "allowed_host_calls": list(p.allowed_host_calls),
        "allowed_hosts": list(p.allowed_hosts), "allow_workspace_read": p.allow_workspace_read,
        "allow_network": p.allow_network, "module_hash_policy": p.module_hash_policy,
        "workspace_root": str(T.workspace_for(home(), p)),
    }
