"""AgentZero-style WASM tool plugins.

Its modules, one line each: docs/architecture.md, "Module map".
"""

from engine.wasm.tools.installed import (
    InstalledTool,
    describe,
    get_tool,
    list_tools,
    load_state,
    module_sha256,
    refresh_info,
    remove,
    set_enabled,
)
from engine.wasm.tools.installer import (
    INCOMING_DIR,
    MAX_MEMBERS,
    fetch_package,
    fetch_package_to,
    incoming_dir,
    install,
    install_file,
    unpack_package,
)
from engine.wasm.tools.manifest import (
    LOCK_FILE,
    MAX_PACKAGE_BYTES,
    STATE_FILE,
    ToolError,
    ToolManifest,
    package,
    parse_manifest,
    sha256_hex,
)
from engine.wasm.tools.run import ToolRun, execute, map_output, workspace_for

__all__ = [
    "INCOMING_DIR", "LOCK_FILE", "MAX_MEMBERS", "MAX_PACKAGE_BYTES", "STATE_FILE", "InstalledTool", "ToolError",
    "ToolManifest", "ToolRun", "describe", "execute", "fetch_package", "fetch_package_to", "get_tool", "incoming_dir",
    "install", "install_file", "list_tools", "load_state", "map_output", "module_sha256", "package", "parse_manifest",
    "refresh_info", "remove", "set_enabled", "sha256_hex", "unpack_package", "workspace_for",
]
