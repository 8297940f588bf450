"""Rules of the product code that a reader relies on: a module's `_private` names are its own (no other module
imports them or reaches them through the module), so each module's public names are the whole of what it offers.

`python tests/test_code_rules.py` prints what the rules see: every use of another module's private name, and the
longest functions of the product code.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("engine", "plugins_app", "librefang_site", "clients/python/librefang_client")
# Calls whose result is one of our modules, loaded by path (the zygote loads engine/process/ outside the engine
# package): names bound to them count as modules too.
MODULE_LOADERS = frozenset({"_load", "load_module", "module_from_spec", "import_module"})


def _product_files() -> list[Path]:
    files = []
    for top in PRODUCT:
        files += [p for p in sorted((ROOT / top).rglob("*.py")) if "migrations" not in p.parts]
    return files


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_path(path: Path, level: int, module: str | None) -> Path | None:
    """The file of module `module` imported from `path` (`level` dots), if it is one of ours."""
    if level:
        base = path.parent
        for _ in range(level - 1):
            base = base.parent
    else:
        base = ROOT
    parts = module.split(".") if module else []
    target = base.joinpath(*parts)
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if parts and candidate.is_file():
            return candidate
    if not parts and (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def private_uses(path: Path) -> list[str]:
    """Each use in `path` of a private name of another of our modules: `from x import _y`, and `x._y` where `x` is
    a module imported (or loaded) by this one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _module_path(path, node.level, node.module)
            for alias in node.names:
                if source is None:
                    continue
                if _private(alias.name) and source != path:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name}")
                submodule = _module_path(path, node.level, f"{node.module}.{alias.name}" if node.module else alias.name)
                if submodule is not None:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _module_path(path, 0, alias.name) is not None:
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in MODULE_LOADERS:
                modules.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def longest_functions(n: int = 5) -> list[tuple[int, str]]:
    rows = []
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rows.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)[:n]


def test_no_module_uses_another_modules_private_names():
    uses = [use for path in _product_files() for use in private_uses(path)]
    assert uses == [], "\n".join(uses)


def test_the_rule_sees_each_kind_of_use(tmp_path, monkeypatch):
    """The checker itself: an import of a private name, and an attribute reached through an imported module or one
    loaded by path, are each found; a module's own private names and public names with a private alias are not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "other.py").write_text("def _hidden(): pass\ndef shown(): pass\n")
    (package / "user.py").write_text(
        "from .other import _hidden\nfrom . import other\nfrom .other import shown as _shown\n"
        "loaded = _load('other')\n_own = 1\n"
        "def f():\n    return other._hidden, loaded._hidden, _own, _shown, other.shown\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    uses = private_uses(package / "user.py")
    assert uses == ["pkg/user.py:1 imports _hidden", "pkg/user.py:7 uses other._hidden",
                    "pkg/user.py:7 uses loaded._hidden"]


if __name__ == "__main__":
    all_uses = [use for path in _product_files() for use in private_uses(path)]
    print(f"{len(all_uses)} uses of another module's private names")
    for use in all_uses:
        print("  " + use)
    print("longest functions (lines):")
    for lines, where in longest_functions(8):
        print(f"  {lines:4d}  {where}")
