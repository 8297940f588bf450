"""Hook templates of the scaffold for the shell, embedded and compiled runtimes: bash and native (jq), lua, go
and v (engine/plugins/scaffold_templates.py picks the family; the rules every template follows are there)."""

from __future__ import annotations

from engine import hooks as H

RUNTIMES = ("bash", "native", "lua", "go", "v")

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


def render(runtime: str, hook: str, fmt: dict[str, str]) -> str:
    """The template of `hook` for `runtime` (one of RUNTIMES); `fmt` holds the plugin name and the hook's request,
    reply and shapes (scaffold_templates.render)."""
    if runtime in ("bash", "native"):
        head = (_BASH_HEAD if runtime == "bash" else _NATIVE_HEAD).format(**fmt)
        return head + (_SH_JQ.get(hook) or f"printf '%s\\n' '{fmt['reply']}'\n")
    if runtime == "lua":
        return _LUA.get(hook) or _LUA_DEFAULT.format(**fmt)
    if runtime == "go":
        return _GO_HEAD.format(**fmt) + (_GO.get(hook) or _GO_DEFAULT_TAIL.format(**fmt))
    return _V.get(hook) or _V_DEFAULT.format(**fmt)
