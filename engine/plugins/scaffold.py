"""New plugin directories from templates, one set per runtime. Every template speaks the protocol (reads the JSON
request from stdin, prints one JSON reply line) and runs as written.

Differences from LibreFang's scaffold: `runtime` goes INSIDE `[hooks]` (LibreFang puts it at the top
level, where its own parser ignores it), the description is TOML-escaped, and wasm is delegated to engine/plugins/scaffold_wasm.py. The templates are in engine/plugins/scaffold_templates.py
(by runtime family: scaffold_scripted.py, scaffold_systems.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from engine import hooks as H
from engine.plugins.manifest import NAME_RE
from engine.plugins.scaffold_templates import SCAFFOLD_HOOKS, SHAPES, TEXT_RUNTIMES, render
from engine.process.runtimes import RUNTIMES, resolve_tag

DEFAULT_HOOKS: tuple[str, ...] = (H.INGEST, H.AFTER_TURN)
MAX_DESCRIPTION = 500


class ScaffoldError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class ScaffoldPlan:
    """Files to write (relative path -> bytes) and which of them must be executable."""

    runtime: str
    files: dict[str, bytes]
    executable: set[str]


def toml_string(value: str) -> str:
    """A TOML basic string literal (JSON string escaping is a subset TOML accepts, except for \\/ which we avoid)."""
    return json.dumps(value, ensure_ascii=False)


def validate_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ScaffoldError("invalid_name", f"plugin name {name!r} is not allowed: use 1-128 ASCII letters, digits, "
                                            "'-' or '_', starting with a letter or digit")


def normalise_hooks(hooks: list[str] | None) -> list[str]:
    chosen = list(DEFAULT_HOOKS) if not hooks else list(dict.fromkeys(hooks))
    unknown = [h for h in chosen if not H.is_hook(h)]
    if unknown:
        raise ScaffoldError("invalid_hook", f"unknown hook(s) {', '.join(map(repr, unknown))}; "
                                            f"hooks are: {', '.join(H.ALL_HOOKS)}")
    return [h for h in H.ALL_HOOKS if h in chosen]


def resolve_runtime(runtime: str | None) -> str:
    resolved = resolve_tag(runtime or "python")
    if resolved.custom_launcher or resolved.warning:
        raise ScaffoldError("invalid_runtime", f"unknown runtime {runtime!r}; choose one of "
                                               f"{', '.join(sorted(RUNTIMES))}")
    return resolved.runtime.tag


def manifest_text(name: str, description: str, runtime: str, hook_files: dict[str, str], active: list[str],
                  author: str = "") -> str:
    """plugin.toml: the `active` hooks declared, every other scaffolded hook commented out with the request it
    receives and the reply it must give, so uncommenting one line turns it on."""
    lines = [
        f"name = {toml_string(name)}",
        'version = "0.1.0"',
        f"description = {toml_string(description)}",
        f"author = {toml_string(author)}",
        '# librefang_min_version = "2026.4.0"',
    ]
    if runtime == "python":
        lines.append('requirements = "requirements.txt"')
    if runtime in ("bash", "native"):
        lines += ["", "[[requires]]  # the templates parse JSON with jq", 'binary = "jq"',
                  'install_hint = "apt install jq (or brew install jq)"']
    lines += ["", "[hooks]", f"runtime = {toml_string(runtime)}"]
    for hook in H.ALL_HOOKS:
        if hook in active:
            lines.append(f"{hook} = {toml_string(hook_files[hook])}")
    unused = [h for h in H.ALL_HOOKS if h in hook_files and h not in active]
    if unused:
        lines.append("# Scaffolded but not active: uncomment a line to turn the hook on.")
    for hook in unused:
        request, reply = SHAPES[hook]
        lines += [f"#   {hook}: receives {request}", f"#   and answers {reply}",
                  f"# {hook} = {toml_string(hook_files[hook])}"]
    lines += [
        "# hook_timeout_secs = 30",
        '# on_hook_failure = "warn"   # warn | skip | abort',
        "# max_retries = 0",
        '# ingest_filter = "remember"',
        "",
        "# [env]",
        '# MY_API_KEY = "${MY_API_KEY}"',
    ]
    return "\n".join(lines) + "\n"


def check_description(description: str, label: str = "description") -> str:
    description = (description or "").strip()
    if len(description) > MAX_DESCRIPTION:
        raise ScaffoldError(f"invalid_{label}", f"{label} is longer than {MAX_DESCRIPTION} characters")
    if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", description):
        raise ScaffoldError(f"invalid_{label}", f"{label} contains control characters")
    return description


def plan(name: str, description: str, runtime: str | None, hooks: list[str] | None, author: str = "") -> ScaffoldPlan:
    """What to write for a new plugin: the seven hook templates (plus any other chosen hook), the chosen ones
    active. Raises ScaffoldError."""
    validate_name(name)
    description = check_description(description)
    author = check_description(author, "author")
    tag = resolve_runtime(runtime)
    chosen = normalise_hooks(hooks)
    written = [h for h in H.ALL_HOOKS if h in SCAFFOLD_HOOKS or h in chosen]
    if tag == "wasm":
        from engine.plugins.scaffold_wasm import wasm_plan  # imports wasmtime: only for wasm plugins

        return wasm_plan(name, description, author, chosen, written)
    if tag not in TEXT_RUNTIMES:
        raise ScaffoldError("runtime_not_scaffoldable",
                            f"no scaffold template for runtime {tag!r} yet; templates exist for "
                            f"{', '.join(TEXT_RUNTIMES)} and wasm")
    ext = RUNTIMES[tag].extension
    files: dict[str, bytes] = {}
    hook_files: dict[str, str] = {}
    executable: set[str] = set()
    for hook in written:
        rel = f"hooks/{hook}.{ext}" if ext else f"hooks/{hook}"
        hook_files[hook] = rel
        files[rel] = render(tag, hook, name).encode("utf-8")
        if tag in ("native", "bash"):
            executable.add(rel)
    files["plugin.toml"] = manifest_text(name, description, tag, hook_files, chosen, author).encode("utf-8")
    if tag == "python":
        files["requirements.txt"] = b"# Python dependencies, one per line (installed by `librefang plugin install-deps`)\n"
    return ScaffoldPlan(tag, files, executable)
