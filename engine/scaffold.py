"""New plugin directories from templates, one set per runtime. Every template speaks the protocol (reads the JSON
request from stdin, prints one JSON reply line) and runs as written.

Differences from LibreFang's scaffold: `runtime` goes INSIDE `[hooks]` (LibreFang puts it at the top
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


# ---- templates ----
# Every template must pass the checks an agent call applies (engine/stack.py `judge_for`): assemble and compact
# return the incoming messages (trimmed), never an empty list, which the engine would refuse and fall back on.

# The seven hooks LibreFang's scaffold writes for every runtime (the unused ones commented out in plugin.toml).
SCAFFOLD_HOOKS: tuple[str, ...] = (H.INGEST, H.AFTER_TURN, H.ASSEMBLE, H.COMPACT, H.BOOTSTRAP, H.PREPARE_SUBAGENT,
                                   H.MERGE_SUBAGENT)

# What each hook receives and must answer, written into the templates and next to the hook lines of plugin.toml.
SHAPES: dict[str, tuple[str, str]] = {
    H.INGEST: ('{"type":"ingest","agent_id","message","peer_id"}', '{"type":"ingest_result","memories":[{"content"}]}'),
    H.AFTER_TURN: ('{"type":"after_turn","agent_id","messages":[...]}', '{"type":"ok"} (optional "memories", "log")'),
    H.ASSEMBLE: ('{"type":"assemble","agent_id","messages":[...],"context_window_tokens"}',
                 '{"type":"assemble_result","messages":[...]} (never empty)'),
    H.COMPACT: ('{"type":"compact","agent_id","messages":[...],"context_window_tokens"}',
                '{"type":"compact_result","messages":[...],"summary"}'),
    H.BOOTSTRAP: ('{"type":"bootstrap","agent_id"}', '{"type":"ok"} (gets 2x the timeout)'),
    H.PREPARE_SUBAGENT: ('{"type":"prepare_subagent","parent_id","child_id"}', '{"type":"ok"}'),
    H.MERGE_SUBAGENT: ('{"type":"merge_subagent","parent_id","child_id"}', '{"type":"ok"}'),
    H.TRANSFORM_TOOL_RESULT: ('{"type":"transform_tool_result","agent_id","tool_name","content"}',
                              '{"type":"skip"} or {"type":"transformed","result"}'),
    H.ON_EVENT: ('{"type":"on_event","event":{"name","payload","source_plugin"}}', '{"type":"ok"}'),
}

_PY = {
    H.INGEST: '''"""ingest: called with each user message; return memories to inject (scope them by peer_id)."""
import json
import sys

req = json.loads(sys.stdin.read() or "{}")
message = req.get("message", "")
print(f"{NAME} ingest for agent {req.get('agent_id')!r}: {len(message)} chars", file=sys.stderr)
print(json.dumps({"type": "ingest_result", "memories": []}))
''',
    H.ASSEMBLE: '''"""assemble: choose the messages for the next LLM call. Keeps the newest messages within the budget (and
every pinned one); never answer an empty list: the engine would refuse it and use its default."""
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
_PY_DEFAULT = '''"""{hook}: request {request}; reply {reply_shape}."""
import json
import sys

req = json.loads(sys.stdin.read() or "{{}}")
print(json.dumps({reply}))
'''

# node, deno and bun share the logic; only reading stdin differs.
_JS_READ = {
    "node": ('let input = "";\nprocess.stdin.on("data", (c) => { input += c; });\nprocess.stdin.on("end", () => {\n',
             "});\n"),
    "deno": ("const input = await new Response(Deno.stdin.readable).text();\n{\n", "}\n"),
    "bun": ("const input = await Bun.stdin.text();\n{\n", "}\n"),
}
_JS_BODY = {
    H.INGEST: '''  const req = JSON.parse(input || "{}");
  console.error(`NAME ingest for agent ${req.agent_id}: ${(req.message || "").length} chars`);
  console.log(JSON.stringify({ type: "ingest_result", memories: [] }));
''',
    H.ASSEMBLE: '''  const req = JSON.parse(input || "{}");
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
''',
    H.COMPACT: '''  const req = JSON.parse(input || "{}");
  const messages = req.messages || [];
  const unpinned = messages.map((m, i) => (m.pinned ? -1 : i)).filter((i) => i >= 0);
  const keep = new Set(unpinned.slice(-10));
  const out = messages.filter((m, i) => m.pinned || keep.has(i));
  const summary = `${messages.length - out.length} earlier messages were compacted.`;
  console.log(JSON.stringify({ type: "compact_result", messages: out, summary }));
''',
}
_JS_DEFAULT = '''  JSON.parse(input || "{{}}");
  console.log(JSON.stringify({reply}));
'''

_RUBY = {
    H.INGEST: '''# ingest: called with each user message; return memories to inject (scope them by peer_id).
require "json"
req = JSON.parse($stdin.read.then { |s| s.empty? ? "{}" : s })
warn "NAME ingest for agent #{req["agent_id"]}: #{req.fetch("message", "").length} chars"
puts JSON.generate({ "type" => "ingest_result", "memories" => [] })
''',
    H.ASSEMBLE: '''# assemble: choose the messages for the next LLM call (here: all of them, unchanged; never an empty list).
require "json"
req = JSON.parse($stdin.read.then { |s| s.empty? ? "{}" : s })
puts JSON.generate({ "type" => "assemble_result", "messages" => req.fetch("messages", []) })
''',
    H.COMPACT: '''# compact: shrink the history under pressure. Keeps pinned messages and the last 10 others.
require "json"
req = JSON.parse($stdin.read.then { |s| s.empty? ? "{}" : s })
messages = req.fetch("messages", [])
keep = messages.each_index.reject { |i| messages[i]["pinned"] }.last(10)
out = messages.each_with_index.select { |m, i| m["pinned"] || keep.include?(i) }.map(&:first)
summary = "#{messages.length - out.length} earlier messages were compacted."
puts JSON.generate({ "type" => "compact_result", "messages" => out, "summary" => summary })
''',
}
_RUBY_DEFAULT = '''# {hook}: request {request}; reply {reply_shape}.
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
// assemble: choose the messages for the next LLM call (here: all of them, unchanged; never an empty list).
$req = json_decode(stream_get_contents(STDIN) ?: "{}", true) ?? [];
echo json_encode(["type" => "assemble_result", "messages" => $req["messages"] ?? []]), "\\n";
''',
    H.COMPACT: '''<?php
// compact: shrink the history under pressure. Keeps pinned messages and the last 10 others.
$req = json_decode(stream_get_contents(STDIN) ?: "{}", true) ?? [];
$messages = $req["messages"] ?? [];
$unpinned = array_keys(array_filter($messages, fn ($m) => empty($m["pinned"])));
$keep = array_flip(array_slice($unpinned, -10));
$out = [];
foreach ($messages as $i => $m) {
    if (!empty($m["pinned"]) || isset($keep[$i])) { $out[] = $m; }
}
$summary = (count($messages) - count($out)) . " earlier messages were compacted.";
echo json_encode(["type" => "compact_result", "messages" => $out, "summary" => $summary]), "\\n";
''',
}
_PHP_DEFAULT = '''<?php
// {hook}: request {request}; reply {reply_shape}.
json_decode(stream_get_contents(STDIN) ?: "{{}}", true);
echo {reply_php}, "\\n";
'''

# bash and native (a bash wrapper to replace with a binary) parse JSON with jq, declared in plugin.toml
# [[requires]] so Doctor says when it is missing.
_SH_JQ = {
    H.ASSEMBLE: '''# all messages, unchanged (never an empty list)
jq -c '{type: "assemble_result", messages: (.messages // [])}' <<<"$_input"
''',
    H.COMPACT: r'''# keep pinned messages and the last 10 others
jq -c '(.messages // []) as $m
  | ([range(0; $m | length) | select($m[.].pinned | not)] | .[-10:]) as $keep
  | [range(0; $m | length) | select(. as $i | $m[$i].pinned or ($keep | any(. == $i)))] as $idx
  | {type: "compact_result", messages: [$idx[] | $m[.]],
     summary: "\(($m | length) - ($idx | length)) earlier messages were compacted."}' <<<"$_input"
''',
}
_BASH_HEAD = '''#!/usr/bin/env bash
# {hook}: request {request}; reply {reply_shape}.
set -euo pipefail
_input=$(cat)
echo "{name} {hook}: ${{#_input}} bytes of request" >&2
'''
_NATIVE_HEAD = '''#!/usr/bin/env bash
# {hook}: replace this wrapper with your own executable; it reads JSON on stdin and prints one JSON line.
# request {request}; reply {reply_shape}.
set -eu
_input=$(cat)
'''

_LUA_RAW_ARRAY = '''-- The raw JSON text of the top-level array `key` (passes messages through without a JSON library).
local function raw_array(input, key)
  local _, e = input:find('"' .. key .. '"%s*:%s*%[')
  if not e then return "[]" end
  local depth, in_string, escaped = 0, false, false
  for i = e, #input do
    local c = input:sub(i, i)
    if in_string then
      if escaped then escaped = false
      elseif c == "\\\\" then escaped = true
      elseif c == '"' then in_string = false end
    elseif c == '"' then in_string = true
    elseif c == "[" then depth = depth + 1
    elseif c == "]" then
      depth = depth - 1
      if depth == 0 then return input:sub(e, i) end
    end
  end
  return "[]"
end

local input = io.read("a") or ""
'''
_LUA = {
    H.ASSEMBLE: "-- assemble: all messages, unchanged (never an empty list).\n" + _LUA_RAW_ARRAY
    + '''print('{"type":"assemble_result","messages":' .. raw_array(input, "messages") .. '}')
''',
    H.COMPACT: "-- compact: this template keeps every message; decode with dkjson or cjson to drop old ones.\n"
    + _LUA_RAW_ARRAY + '''print('{"type":"compact_result","messages":' .. raw_array(input, "messages") ..
      ',"summary":"nothing was compacted"}')
''',
}
_LUA_DEFAULT = '''-- {hook}: request {request}; reply {reply_shape}.
-- (use dkjson or cjson for real parsing)
local input = io.read("a") or ""
io.stderr:write("{name} {hook}: " .. #input .. " bytes of request\\n")
print('{reply}')
'''

_GO_HEAD = '''// {hook}: request {request}; reply {reply_shape}. Run with `go run`.
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
'''
_GO = {
    H.ASSEMBLE: '''	// all messages, unchanged (never an empty list)
	messages, _ := req["messages"].([]interface{})
	out, _ := json.Marshal(map[string]interface{}{"type": "assemble_result", "messages": messages})
	fmt.Println(string(out))
}
''',
    H.COMPACT: '''	// keep pinned messages and the last 10 others
	messages, _ := req["messages"].([]interface{})
	pinned := func(m interface{}) bool { mm, ok := m.(map[string]interface{}); return ok && mm["pinned"] == true }
	unpinned := []int{}
	for i, m := range messages {
		if !pinned(m) {
			unpinned = append(unpinned, i)
		}
	}
	keep := map[int]bool{}
	from := len(unpinned) - 10 // no builtin max before Go 1.21
	if from < 0 {
		from = 0
	}
	for _, i := range unpinned[from:] {
		keep[i] = true
	}
	kept := []interface{}{}
	for i, m := range messages {
		if keep[i] || pinned(m) {
			kept = append(kept, m)
		}
	}
	summary := fmt.Sprintf("%d earlier messages were compacted.", len(messages)-len(kept))
	out, _ := json.Marshal(map[string]interface{}{"type": "compact_result", "messages": kept, "summary": summary})
	fmt.Println(string(out))
}
''',
}
_GO_DEFAULT_TAIL = '''	fmt.Println(`{reply}`)
}}
'''

_V_RAW_ARRAY = '''// the raw JSON text of the top-level array `key` (passes messages through without decoding them)
fn raw_array(input string, key string) string {
	needle := '"${key}":'
	mut i := input.index(needle) or { return '[]' }
	i += needle.len
	for i < input.len && (input[i] == ` ` || input[i] == `\\n` || input[i] == `\\t` || input[i] == `\\r`) {
		i++
	}
	if i >= input.len || input[i] != `[` {
		return '[]'
	}
	mut depth := 0
	mut in_string := false
	mut escaped := false
	for j := i; j < input.len; j++ {
		c := input[j]
		if in_string {
			if escaped {
				escaped = false
			} else if c == `\\\\` {
				escaped = true
			} else if c == `"` {
				in_string = false
			}
			continue
		}
		if c == `"` {
			in_string = true
		} else if c == `[` {
			depth++
		} else if c == `]` {
			depth--
			if depth == 0 {
				return input[i..j + 1]
			}
		}
	}
	return '[]'
}
'''
_V = {
    H.ASSEMBLE: "// assemble: all messages, unchanged (never an empty list).\nimport os\n\n" + _V_RAW_ARRAY + '''
fn main() {
	input := os.get_raw_lines_joined()
	println('{"type":"assemble_result","messages":' + raw_array(input, 'messages') + '}')
}
''',
    H.COMPACT: "// compact: this template keeps every message; decode with the json module to drop old ones.\n"
    "import os\n\n" + _V_RAW_ARRAY + '''
fn main() {
	input := os.get_raw_lines_joined()
	println('{"type":"compact_result","messages":' + raw_array(input, 'messages') + ',"summary":"nothing was compacted"}')
}
''',
}
_V_DEFAULT = '''// {hook}: request {request}; reply {reply_shape}.
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
    request, reply_shape = SHAPES[hook]
    fmt = {"hook": hook, "reply": reply, "name": name, "request": request, "reply_shape": reply_shape}
    if runtime == "python":
        src = _PY.get(hook) or _PY_DEFAULT.format(**{**fmt, "reply": repr(_result_for(hook))})
        return src.replace("{NAME}", name)
    if runtime in _JS_READ:
        head, tail = _JS_READ[runtime]
        body = _JS_BODY[hook].replace("NAME", name) if hook in _JS_BODY else _JS_DEFAULT.format(**fmt)
        return f"// {hook}: request {request}; reply {reply_shape}.\n" + head + body + tail
    if runtime == "ruby":
        src = _RUBY.get(hook) or _RUBY_DEFAULT.format(**fmt, reply_ruby=repr(reply))
        return src.replace("NAME", name) if hook in _RUBY else src
    if runtime == "php":
        src = _PHP.get(hook) or _PHP_DEFAULT.format(**fmt, reply_php="'" + reply + "'")
        return src.replace("NAME", name) if hook in _PHP else src
    if runtime in ("bash", "native"):
        head = (_BASH_HEAD if runtime == "bash" else _NATIVE_HEAD).format(**fmt)
        return head + (_SH_JQ.get(hook) or f"printf '%s\\n' '{reply}'\n")
    if runtime == "lua":
        return _LUA.get(hook) or _LUA_DEFAULT.format(**fmt)
    if runtime == "go":
        return _GO_HEAD.format(**fmt) + (_GO.get(hook) or _GO_DEFAULT_TAIL.format(**fmt))
    return _V.get(hook) or _V_DEFAULT.format(**fmt)


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
        return _wasm_plan(name, description, author, chosen, written)
    if tag not in _TEXT_RUNTIMES:
        raise ScaffoldError("runtime_not_scaffoldable",
                            f"no scaffold template for runtime {tag!r} yet; templates exist for "
                            f"{', '.join(_TEXT_RUNTIMES)} and wasm")
    ext = RUNTIMES[tag].extension
    files: dict[str, bytes] = {}
    hook_files: dict[str, str] = {}
    executable: set[str] = set()
    for hook in written:
        rel = f"hooks/{hook}.{ext}" if ext else f"hooks/{hook}"
        hook_files[hook] = rel
        files[rel] = _render(tag, hook, name).encode("utf-8")
        if tag in ("native", "bash"):
            executable.add(rel)
    files["plugin.toml"] = manifest_text(name, description, tag, hook_files, chosen, author).encode("utf-8")
    if tag == "python":
        files["requirements.txt"] = b"# Python dependencies, one per line (installed by `librefang plugin install-deps`)\n"
    return ScaffoldPlan(tag, files, executable)


# An ABI v2 module that answers {"type": "<hook>_result", "messages": <the request's messages array>, ...}: it copies
# the raw JSON array found after the first `"messages":` key (string-aware bracket matching), so the assemble and
# compact templates pass the engine's checks without a JSON library inside the module.
_WASM_ECHO = """;; {hook}: request {request}; reply {reply_shape}.
;; Build: python -c "import wasmtime,sys; open(sys.argv[2],'wb').write(wasmtime.wat2wasm(open(sys.argv[1]).read()))" \\
;;   {hook}.wat {hook}.wasm
(module
  (import "az" "az_log" (func $az_log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const {heap}))
  (data (i32.const 1024) "\\"messages\\":")
  (data (i32.const 1040) "[]")
  (data (i32.const {prefix_at}) "{prefix}")
  (data (i32.const {suffix_at}) "{suffix}")
  (data (i32.const {msg_at}) "{msg}")
  (func $alloc (export "az_alloc") (param $size i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $size)))
    (block $fits
      (loop $grow
        (br_if $fits (i32.le_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536))))
        (if (i32.lt_s (memory.grow (i32.const 1)) (i32.const 0)) (then unreachable))
        (br $grow)))
    (local.get $ptr))
  ;; the offset just after the first `"messages":` in [ptr, ptr+len), or -1
  (func $find (param $ptr i32) (param $len i32) (result i32)
    (local $i i32) (local $j i32) (local $last i32)
    (if (i32.lt_u (local.get $len) (i32.const 11)) (then (return (i32.const -1))))
    (local.set $last (i32.add (local.get $ptr) (i32.sub (local.get $len) (i32.const 11))))
    (local.set $i (local.get $ptr))
    (block $none
      (loop $scan
        (br_if $none (i32.gt_u (local.get $i) (local.get $last)))
        (local.set $j (i32.const 0))
        (block $differs
          (loop $cmp
            (br_if $differs (i32.ne (i32.load8_u (i32.add (local.get $i) (local.get $j)))
                                    (i32.load8_u (i32.add (i32.const 1024) (local.get $j)))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br_if $cmp (i32.lt_u (local.get $j) (i32.const 11))))
          (return (i32.add (local.get $i) (i32.const 11))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))
    (i32.const -1))
  ;; $p points at '[': the offset just after its matching ']', or -1
  (func $array_end (param $p i32) (param $limit i32) (result i32)
    (local $depth i32) (local $in_string i32) (local $escaped i32) (local $c i32)
    (block $bad
      (loop $walk
        (br_if $bad (i32.ge_u (local.get $p) (local.get $limit)))
        (local.set $c (i32.load8_u (local.get $p)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (if (local.get $in_string)
          (then
            (if (local.get $escaped)
              (then (local.set $escaped (i32.const 0)))
              (else
                (if (i32.eq (local.get $c) (i32.const 92)) (then (local.set $escaped (i32.const 1))))
                (if (i32.eq (local.get $c) (i32.const 34)) (then (local.set $in_string (i32.const 0)))))))
          (else
            (if (i32.eq (local.get $c) (i32.const 34)) (then (local.set $in_string (i32.const 1))))
            (if (i32.eq (local.get $c) (i32.const 91)) (then (local.set $depth (i32.add (local.get $depth) (i32.const 1)))))
            (if (i32.eq (local.get $c) (i32.const 93))
              (then
                (local.set $depth (i32.sub (local.get $depth) (i32.const 1)))
                (if (i32.eqz (local.get $depth)) (then (return (local.get $p))))))))
        (br $walk)))
    (i32.const -1))
  (func (export "az_tool_execute") (param $ptr i32) (param $len i32) (result i64)
    (local $start i32) (local $end i32) (local $limit i32) (local $c i32) (local $n i32) (local $out i32)
    (local $total i32)
    (call $az_log (i32.const 2) (i32.const {msg_at}) (i32.const {msg_len}))
    (local.set $limit (i32.add (local.get $ptr) (local.get $len)))
    (local.set $end (i32.const -1))
    (local.set $start (call $find (local.get $ptr) (local.get $len)))
    (if (i32.ge_s (local.get $start) (i32.const 0))
      (then
        (block $text
          (loop $skip_space
            (br_if $text (i32.ge_u (local.get $start) (local.get $limit)))
            (local.set $c (i32.load8_u (local.get $start)))
            (br_if $text (i32.eqz (i32.or (i32.or (i32.eq (local.get $c) (i32.const 32)) (i32.eq (local.get $c) (i32.const 9)))
                                          (i32.or (i32.eq (local.get $c) (i32.const 10)) (i32.eq (local.get $c) (i32.const 13))))))
            (local.set $start (i32.add (local.get $start) (i32.const 1)))
            (br $skip_space)))
        (if (i32.lt_u (local.get $start) (local.get $limit))
          (then (if (i32.eq (i32.load8_u (local.get $start)) (i32.const 91))
            (then (local.set $end (call $array_end (local.get $start) (local.get $limit)))))))))
    (if (i32.lt_s (local.get $end) (i32.const 0))
      (then (local.set $start (i32.const 1040)) (local.set $end (i32.const 1042))))
    (local.set $n (i32.sub (local.get $end) (local.get $start)))
    (local.set $total (i32.add (i32.add (i32.const {prefix_len}) (local.get $n)) (i32.const {suffix_len})))
    (local.set $out (call $alloc (local.get $total)))
    (memory.copy (local.get $out) (i32.const {prefix_at}) (i32.const {prefix_len}))
    (memory.copy (i32.add (local.get $out) (i32.const {prefix_len})) (local.get $start) (local.get $n))
    (memory.copy (i32.add (i32.add (local.get $out) (i32.const {prefix_len})) (local.get $n)) (i32.const {suffix_at})
                 (i32.const {suffix_len}))
    (i64.or (i64.extend_i32_u (local.get $out)) (i64.shl (i64.extend_i32_u (local.get $total)) (i64.const 32)))))
"""
_WASM_ECHO_PARTS = {
    H.ASSEMBLE: ('{"type":"assemble_result","messages":', "}"),
    H.COMPACT: ('{"type":"compact_result","messages":', ',"summary":"this template keeps every message"}'),
}


def wasm_echo_wat(hook: str, log_line: str) -> str:
    from engine.wasm.wat import wat_string

    prefix, suffix = (p.encode() for p in _WASM_ECHO_PARTS[hook])
    msg = log_line.encode("utf-8")
    prefix_at = 1056
    suffix_at = prefix_at + len(prefix) + 16
    msg_at = suffix_at + len(suffix) + 16
    heap = (msg_at + len(msg) + 15) // 16 * 16 + 16
    request, reply_shape = SHAPES[hook]
    return _WASM_ECHO.format(hook=hook, request=request, reply_shape=reply_shape, heap=heap, prefix_at=prefix_at,
                             prefix=wat_string(prefix), prefix_len=len(prefix), suffix_at=suffix_at,
                             suffix=wat_string(suffix), suffix_len=len(suffix), msg_at=msg_at,
                             msg=wat_string(msg), msg_len=len(msg))


def _wasm_plan(name: str, description: str, author: str, chosen: list[str], written: list[str]) -> ScaffoldPlan:
    try:
        import wasmtime

        from engine import wasm
    except ImportError as exc:
        raise ScaffoldError("runtime_not_scaffoldable", "the wasm runtime is not available in this build") from exc
    files: dict[str, bytes] = {}
    hook_files: dict[str, str] = {}
    for hook in written:
        log_line = f"{name}: {hook} called"
        wat = wasm_echo_wat(hook, log_line) if hook in _WASM_ECHO_PARTS else wasm.hook_wat(log_line, _result_for(hook))
        files[f"hooks/{hook}.wat"] = wat.encode("utf-8")
        files[f"hooks/{hook}.wasm"] = bytes(wasmtime.wat2wasm(wat))
        hook_files[hook] = f"hooks/{hook}.wasm"
    text = manifest_text(name, description, "wasm", hook_files, chosen, author)
    text += ("\n# Host calls beyond az_log need a capability here AND the service policy\n"
             "# ([runtime.wasm] allowed_host_calls in config.toml), e.g. \"host:az_env_get\";\n"
             "# az_http_get also needs allow_network = true in [hooks] and the host in allowed_hosts.\n"
             "[wasm]\ncapabilities = []\n")
    files["plugin.toml"] = text.encode("utf-8")
    return ScaffoldPlan("wasm", files, set())
