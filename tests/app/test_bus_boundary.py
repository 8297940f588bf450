"""Only plugins_app/bus/ touches the Redis job stream (docs/architecture.md). The import-linter contract in
pyproject.toml keeps `import redis` inside it for the modules it lists; this test covers every module of plugins_app,
new ones too, and the other way round: a stream command, or a job stream key, used on a client borrowed from the
bus (events.py borrows `bus.client()` for its stderr lists)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUS = ROOT / "plugins_app" / "bus"
# Every Redis Stream command redis-py offers (XADD, XREADGROUP, XACK, ...): only the bus sends them.
STREAM_COMMANDS = {
    "xack", "xadd", "xautoclaim", "xclaim", "xdel", "xgroup_create", "xgroup_createconsumer", "xgroup_delconsumer",
    "xgroup_destroy", "xgroup_setid", "xinfo_consumers", "xinfo_groups", "xinfo_stream", "xlen", "xpending",
    "xpending_range", "xrange", "xread", "xreadgroup", "xrevrange", "xtrim",
}
# The bus's names for its streams and their group: no one else needs them.
STREAM_NAMES = {"stream_key", "host_stream_key", "host_streams_key", "control_key", "GROUP"}
REDIS_PROBE = ROOT / "librefang_site" / "private_redis.py"  # pings Redis before the site starts; touches no stream


def app_sources() -> list[Path]:
    files = [*(ROOT / "plugins_app").rglob("*.py"), *(ROOT / "librefang_site").rglob("*.py")]
    return sorted(f for f in files if BUS not in f.parents and "migrations" not in f.parts)


def stream_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = node.attr if isinstance(node, ast.Attribute) else None
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("plugins_app.bus"):
            found += [f"imports {a.name}" for a in node.names if a.name in STREAM_NAMES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis":
            found.append(f"line {node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Import) and path != REDIS_PROBE:
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "redis"]
        elif name in STREAM_COMMANDS or name in STREAM_NAMES:
            found.append(f"line {node.lineno}: .{name}")
    return found


def test_no_module_outside_the_bus_sends_stream_commands_or_names_its_streams():
    sources = app_sources()
    assert ROOT / "plugins_app" / "events.py" in sources and not any(BUS in f.parents for f in sources)
    offenders = {str(f.relative_to(ROOT)): uses for f in sources if (uses := stream_uses(f))}
    assert offenders == {}


def test_the_check_sees_a_stream_command_and_a_stream_name(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from plugins_app.bus import GROUP\nfrom plugins_app import bus\n"
                      "bus.client().xadd(bus.stream_key(), {})\nbus.client().lrange('k', 0, -1)\nimport redis.asyncio\n")
    assert sorted(stream_uses(sample)) == ["imports GROUP", "line 3: .stream_key", "line 3: .xadd",
                                           "line 5: import redis.asyncio"]
