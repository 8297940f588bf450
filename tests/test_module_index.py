"""docs/architecture.md's module map is the one index of the engine's modules: every module of its packages is named
there once, nothing named there is gone, and each package's docstring points there instead of keeping a list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "engine/process", "engine/plugins", "engine/wasm", "engine/wasm/tools")


def _module_map() -> dict[str, list[str]]:
    """package -> the modules its section of the map names, in order."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    text = text[text.index("## Module map"):]
    return {m.group(1): re.findall(r"^- `([a-z0-9_]+\.py)`", m.group(2), re.M)
            for m in re.finditer(r"^### `([a-z/]+)/`[^\n]*\n(.*?)(?=^#{2,3} |\Z)", text, re.M | re.S)}


def test_the_module_map_names_every_module_of_the_engine_once():
    sections = _module_map()
    assert set(sections) == set(PACKAGES)
    for package in PACKAGES:
        on_disk = sorted(p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py")
        assert sorted(sections[package]) == on_disk, package


def test_each_package_points_to_the_map_instead_of_listing_its_modules():
    for package in PACKAGES[1:]:
        doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert '"Module map"' in doc, package
        assert not re.search(r"^\s*[a-z0-9_]+\.py\s", doc, re.M), f"{package}/__init__.py lists modules"
