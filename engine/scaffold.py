"""New plugin directories from templates, one set per runtime. Every template speaks the protocol (reads the JSON
request from stdin, prints one JSON reply line) and runs as written.

Differences from LibreFang's scaffold (research §6): `runtime` goes INSIDE `[hooks]` (LibreFang puts it at the top
level, where its own parser ignores it), the description is TOML-escaped, and wasm is delegated to engine.wasm.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from engine import hooks as H
from engine.manifest import NAME_RE
from engine.runtimes import RUNTIMES, resolve_tag

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


def _result_for(hook: str) -> dict:
    return {
        H.INGEST: {"type": "ingest_result", "memories": []},
        H.ASSEMBLE: {"type": "assemble_result", "messages": []},
        H.COMPACT: {"type": "compact_result", "messages": []},
        H.TRANSFORM_TOOL_RESULT: {"type": "skip"},
    }.get(hook, {"type": "ok"})


# ---- templates: the constant replies (bash, lua, native) and real logic (python, node, ruby, php) ----

_PY = {
    H.INGEST: '''"""ingest: called with each user message; return memories to inject (scope them by peer_id)."""
import json
import sys

req = json.loads(sys.stdin.read() or "{}")
message = req.get("message", "")
print(f"{NAME} ingest for agent {req.get('agent_id')!r}: {len(message)} chars", file=sys.stderr)
print(json.dumps({"type": "ingest_result", "memories": []}))
''',
    H.ASSEMBLE: '''"""assemble: choose the messages for the next LLM call. Keeps the newest messages within the budget."""
import json
import sys

req = json.loads(sys.stdin.read() or "{}")
messages = req.get("messages", [])
budget = max(0, int(req.get("context_window_tokens", 200000)) - 4000) * 4  # ~4 chars per token
kept, used = [], 0
for m in reversed(messages):
    size = len(json.dumps(m.get("content", "")))
    if kept and used + size > budget and not m.get("pinned"):
        continue
    kept.append(m)
    used += size
print(json.dumps({"type": "assemble_result", "messages": list(reversed(kept))}))
''',
    H.COMPACT: '''"""compact: shrink the history under pressure. Keeps pinned messages and the last 10 others."""
import json
import sys

req = json.loads(sys.stdin.read() or "{}")
messages = req.get("messages", [])
unpinned = [i for i, m in enumerate(messages) if not m.get("pinned")]
keep = set(unpinned[-10:]) | {i for i, m in enumerate(messages) if m.get("pinned")}
dropped = len(messages) - len(keep)
summary = f"{dropped} earlier messages were compacted."
out = [m for i, m in enumerate(messages) if i in keep]
print(json.dumps({"type": "compact_result", "messages": out, "summary": summary}))
''',
    H.TRANSFORM_TOOL_RESULT: '''"""transform_tool_result: rewrite a tool result, or answer {"type": "skip"} to leave it alone."""
import json
import sys

req = json.loads(sys.stdin.read() or "{}")
content = req.get("content") or req.get("result") or ""
if len(content) > 20000:
    print(json.dumps({"type": "transformed", "result": content[:20000] + "\\n[truncated]"}))
else:
    print(json.dumps({"type": "skip"}))
''',
}
_PY_DEFAULT = '''"""{hook}: see the LibreFang context-engine plugin docs for the request fields."""
import json
import sys

req = json.loads(sys.stdin.read() or "{{}}")
print(json.dumps({reply}))
'''

_NODE = {
    H.INGEST: '''// ingest: called with each user message; return memories to inject (scope them by peer_id).
let input = "";
process.stdin.on("data", (c) => { input += c; });
process.stdin.on("end", () => {
  const req = JSON.parse(input || "{}");
  console.error(`NAME ingest for agent ${req.agent_id}: ${(req.message || "").length} chars`);
  console.log(JSON.stringify({ type: "ingest_result", memories: [] }));
});
''',
    H.ASSEMBLE: '''// assemble: choose the messages for the next LLM call. Keeps the newest messages within the budget.
let input = "";
process.stdin.on("data", (c) => { input += c; });
process.stdin.on("end", () => {
  const req = JSON.parse(input || "{}");
  const messages = req.messages || [];
  const budget = Math.max(0, (req.context_window_tokens || 200000) - 4000) * 4;
  const kept = [];
  let used = 0;
  for (const m of [...messages].reverse()) {
    const size = JSON.stringify(m.content || "").length;
    if (kept.length && used + size > budget && !m.pinned) continue;
    kept.push(m);
    used += size;
  }
  console.log(JSON.stringify({ type: "assemble_result", messages: kept.reverse() }));
});
''',
}
_NODE_DEFAULT = '''// {hook}: see the LibreFang context-engine plugin docs for the request fields.
let input = "";
process.stdin.on("data", (c) => {{ input += c; }});
process.stdin.on("end", () => {{
  JSON.parse(input || "{{}}");
  console.log(JSON.stringify({reply}));
}});
'''

_RUBY = {
    H.INGEST: '''# ingest: called with each user message; return memories to inject (scope them by peer_id).
require "json"
req = JSON.parse($stdin.read.then { |s| s.empty? ? "{}" : s })
warn "NAME ingest for agent #{req["agent_id"]}: #{req.fetch("message", "").length} chars"
puts JSON.generate({ "type" => "ingest_result", "memories" => [] })
''',
    H.ASSEMBLE: '''# assemble: choose the messages for the next LLM call (here: all of them, unchanged).
require "json"
req = JSON.parse($stdin.read.then { |s| s.empty? ? "{}" : s })
puts JSON.generate({ "type" => "assemble_result", "messages" => req.fetch("messages", []) })
''',
}
_RUBY_DEFAULT = '''# {hook}: see the LibreFang context-engine plugin docs for the request fields.
require "json"
JSON.parse($stdin.read.then {{ |s| s.empty? ? "{{}}" : s }})
puts {reply_ruby}
'''

_PHP = {
    H.INGEST: '''<?php
// ingest: called with each user message; return memories to inject (scope them by peer_id).
$req = json_decode(stream_get_contents(STDIN) ?: "{}", true) ?? [];
fwrite(STDERR, "NAME ingest for agent " . ($req["agent_id"] ?? "") . ": " . strlen($req["message"] ?? "") . " chars\\n");
echo json_encode(["type" => "ingest_result", "memories" => []]), "\\n";
''',
    H.ASSEMBLE: '''<?php
// assemble: choose the messages for the next LLM call (here: all of them, unchanged).
$req = json_decode(stream_get_contents(STDIN) ?: "{}", true) ?? [];
echo json_encode(["type" => "assemble_result", "messages" => $req["messages"] ?? []]), "\\n";
''',
}
_PHP_DEFAULT = '''<?php
// {hook}: see the LibreFang context-engine plugin docs for the request fields.
json_decode(stream_get_contents(STDIN) ?: "{{}}", true);
echo {reply_php}, "\\n";
'''

_BASH_DEFAULT = '''#!/usr/bin/env bash
# {hook}: the JSON request arrives on stdin; print one JSON line. Use jq for real parsing.
set -euo pipefail
_input=$(cat)
echo "{name} {hook}: ${{#_input}} bytes of request" >&2
printf '%s\\n' '{reply}'
'''

_LUA_DEFAULT = '''-- {hook}: the JSON request arrives on stdin; print one JSON line (use dkjson or cjson for real parsing).
local input = io.read("a") or ""
io.stderr:write("{name} {hook}: " .. #input .. " bytes of request\\n")
print('{reply}')
'''

_NATIVE_DEFAULT = '''#!/bin/sh
# {hook}: replace this wrapper with your own executable; it reads JSON on stdin and prints one JSON line.
_input=$(cat)
printf '%s\\n' '{reply}'
'''

_DENO_DEFAULT = '''// {hook}: the JSON request arrives on stdin; print one JSON line.
const input = await new Response(Deno.stdin.readable).text();
const req = JSON.parse(input || "{{}}");
console.error(`{name} {hook}: ${{Object.keys(req).length}} request fields`);
console.log(JSON.stringify({reply}));
'''

_BUN_DEFAULT = '''// {hook}: the JSON request arrives on stdin; print one JSON line.
const input = await Bun.stdin.text();
const req = JSON.parse(input || "{{}}");
console.error(`{name} {hook}: ${{Object.keys(req).length}} request fields`);
console.log(JSON.stringify({reply}));
'''

_GO_DEFAULT = '''// {hook}: the JSON request arrives on stdin; print one JSON line. Run with `go run`.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

func main() {{
	data, _ := io.ReadAll(os.Stdin)
	var req map[string]interface{{}}
	if err := json.Unmarshal(data, &req); err != nil && len(data) > 0 {{
		fmt.Fprintln(os.Stderr, "invalid request:", err)
		os.Exit(1)
	}}
	fmt.Fprintf(os.Stderr, "{name} {hook}: %d request fields\\n", len(req))
	fmt.Println(`{reply}`)
}}
'''

_V_DEFAULT = '''// {hook}: the JSON request arrives on stdin; print one JSON line (use the json module for real parsing).
import os

fn main() {{
	input := os.get_raw_lines_joined()
	eprintln('{name} {hook}: ${{input.len}} bytes of request')
	println('{reply}')
}}
'''

_TEXT_RUNTIMES = ("python", "node", "ruby", "php", "bash", "lua", "native", "deno", "bun", "go", "v")


def _render(runtime: str, hook: str, name: str) -> str:
    reply = json.dumps(_result_for(hook))
    if runtime == "python":
        src = _PY.get(hook) or _PY_DEFAULT.format(hook=hook, reply=repr(_result_for(hook)))
        return src.replace("{NAME}", name)
    if runtime == "node":
        src = _NODE.get(hook) or _NODE_DEFAULT.format(hook=hook, reply=reply)
        return src.replace("NAME", name) if hook in _NODE else src
    if runtime == "ruby":
        src = _RUBY.get(hook) or _RUBY_DEFAULT.format(hook=hook, reply_ruby=repr(reply))
        return src.replace("NAME", name) if hook in _RUBY else src
    if runtime == "php":
        src = _PHP.get(hook) or _PHP_DEFAULT.format(hook=hook, reply_php="'" + reply + "'")
        return src.replace("NAME", name) if hook in _PHP else src
    if runtime == "bash":
        return _BASH_DEFAULT.format(hook=hook, reply=reply, name=name)
    if runtime == "lua":
        return _LUA_DEFAULT.format(hook=hook, reply=reply, name=name)
    if runtime in ("deno", "bun"):
        return (_DENO_DEFAULT if runtime == "deno" else _BUN_DEFAULT).format(hook=hook, reply=reply, name=name)
    if runtime == "go":
        return _GO_DEFAULT.format(hook=hook, reply=reply, name=name)
    if runtime == "v":
        return _V_DEFAULT.format(hook=hook, reply=reply, name=name)
    return _NATIVE_DEFAULT.format(hook=hook, reply=reply)


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


def manifest_text(name: str, description: str, runtime: str, hook_files: dict[str, str]) -> str:
    lines = [
        f"name = {toml_string(name)}",
        'version = "0.1.0"',
        f"description = {toml_string(description)}",
        'author = ""',
        '# librefang_min_version = "2026.4.0"',
        "",
        "[hooks]",
        f"runtime = {toml_string(runtime)}",
    ]
    for hook in H.ALL_HOOKS:
        if hook in hook_files:
            lines.append(f"{hook} = {toml_string(hook_files[hook])}")
    lines += [
        "# hook_timeout_secs = 30",
        '# on_hook_failure = "warn"   # warn | skip | abort',
        "# max_retries = 0",
        '# ingest_filter = "remember"',
        "",
        "# [env]",
        '# MY_API_KEY = "${MY_API_KEY}"',
    ]
    if runtime == "python":
        lines.insert(lines.index("[hooks]") - 1, 'requirements = "requirements.txt"')
    return "\n".join(lines) + "\n"


def plan(name: str, description: str, runtime: str | None, hooks: list[str] | None) -> ScaffoldPlan:
    """What to write for a new plugin. Raises ScaffoldError."""
    validate_name(name)
    description = (description or "").strip()
    if len(description) > MAX_DESCRIPTION:
        raise ScaffoldError("invalid_description", f"description is longer than {MAX_DESCRIPTION} characters")
    if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", description):
        raise ScaffoldError("invalid_description", "description contains control characters")
    tag = resolve_runtime(runtime)
    chosen = normalise_hooks(hooks)
    if tag == "wasm":
        return _wasm_plan(name, description, chosen)
    if tag not in _TEXT_RUNTIMES:
        raise ScaffoldError("runtime_not_scaffoldable",
                            f"no scaffold template for runtime {tag!r} yet; templates exist for "
                            f"{', '.join(_TEXT_RUNTIMES)} (wasm when the WASM runtime is installed)")
    ext = RUNTIMES[tag].extension
    files: dict[str, bytes] = {}
    hook_files: dict[str, str] = {}
    executable: set[str] = set()
    for hook in chosen:
        rel = f"hooks/{hook}.{ext}" if ext else f"hooks/{hook}"
        hook_files[hook] = rel
        files[rel] = _render(tag, hook, name).encode("utf-8")
        if tag in ("native", "bash"):
            executable.add(rel)
    files["plugin.toml"] = manifest_text(name, description, tag, hook_files).encode("utf-8")
    if tag == "python":
        files["requirements.txt"] = b"# Python dependencies, one per line (installed by `librefang plugin install-deps`)\n"
    return ScaffoldPlan(tag, files, executable)


def _wasm_plan(name: str, description: str, hooks: list[str]) -> ScaffoldPlan:
    try:
        from engine import wasm  # provided by the WASM runtime module
    except ImportError:
        wasm = None
    make = getattr(wasm, "scaffold_files", None) if wasm is not None else None
    if make is None:
        raise ScaffoldError("runtime_not_scaffoldable", "the wasm runtime has no scaffold template in this build")
    try:
        files = make(name, description, hooks)
    except ValueError as exc:
        raise ScaffoldError("invalid_hook", str(exc)) from exc
    return ScaffoldPlan("wasm", {k: (v if isinstance(v, bytes) else str(v).encode()) for k, v in files.items()}, set())
