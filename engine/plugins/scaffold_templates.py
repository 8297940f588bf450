"""The scaffold's hook templates, one set per text runtime (engine/plugins/scaffold.py writes them into a new plugin).

Every template must pass the checks an agent call applies (engine/stack.py `judge_for`): assemble and compact
return the incoming messages (trimmed), never an empty list, which the engine would refuse and fall back on.
"""

from __future__ import annotations

import json

from engine import hooks as H


def result_for(hook: str) -> dict:
    return {
        H.INGEST: {"type": "ingest_result", "memories": []},
        H.ASSEMBLE: {"type": "assemble_result", "messages": []},
        H.COMPACT: {"type": "compact_result", "messages": []},
        H.TRANSFORM_TOOL_RESULT: {"type": "skip"},
    }.get(hook, {"type": "ok"})



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

TEXT_RUNTIMES = ("python", "node", "ruby", "php", "bash", "lua", "native", "deno", "bun", "go", "v")


def render(runtime: str, hook: str, name: str) -> str:
    reply = json.dumps(result_for(hook))
    request, reply_shape = SHAPES[hook]
    fmt = {"hook": hook, "reply": reply, "name": name, "request": request, "reply_shape": reply_shape}
    if runtime == "python":
        src = _PY.get(hook) or _PY_DEFAULT.format(**{**fmt, "reply": repr(result_for(hook))})
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
