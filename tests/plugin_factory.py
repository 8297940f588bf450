"""Write tiny real plugin directories for tests."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

PY_ECHO_INGEST = """
import json, sys
req = json.loads(sys.stdin.read())
print(json.dumps({"type": "ingest_result", "memories": [{"content": "echo: " + req["message"]}]}))
"""


def make_plugin(plugins_dir: Path, name: str, hooks: dict[str, str], *, runtime: str = "python",
                ext: str = "py", toml_extra: str = "", top_extra: str = "", executable: bool = False) -> Path:
    """`hooks` maps hook name -> script source; each goes to hooks/<hook>.<ext>."""
    pdir = Path(plugins_dir) / name
    (pdir / "hooks").mkdir(parents=True, exist_ok=True)
    lines = [f'name = "{name}"', 'version = "0.1.0"', f'description = "test plugin {name}"', 'author = "tests"']
    if top_extra:
        lines.append(textwrap.dedent(top_extra).strip())
    lines.append("")
    lines.append("[hooks]")
    lines.append(f'runtime = "{runtime}"')
    for hook, source in hooks.items():
        fname = f"hooks/{hook}.{ext}" if ext else f"hooks/{hook}"
        path = pdir / fname
        path.write_text(textwrap.dedent(source).lstrip())
        if executable:
            os.chmod(path, 0o755)
        lines.append(f'{hook} = "{fname}"')
    if toml_extra:
        lines.append(textwrap.dedent(toml_extra).strip())
    (pdir / "plugin.toml").write_text("\n".join(lines) + "\n")
    return pdir


def write_config(home: Path, *, plugin: str | None = None, stack: list[str] | None = None, extra: str = "") -> None:
    lines = ["[context_engine]"]
    if plugin:
        lines.append(f'plugin = "{plugin}"')
    if stack:
        lines.append("plugin_stack = [" + ", ".join(f'"{s}"' for s in stack) + "]")
    if extra:
        lines.append(textwrap.dedent(extra).strip())
    path = Path(home) / "config.toml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
