"""Hook templates of the scaffold for the scripting runtimes with JSON at hand: python, node/deno/bun, ruby and
php (engine/plugins/scaffold_templates.py picks the family; the rules every template follows are there)."""

from __future__ import annotations

import json

from engine import hooks as H

RUNTIMES = ("python", "node", "deno", "bun", "ruby", "php")

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


def render(runtime: str, hook: str, fmt: dict[str, str]) -> str:
    """The template of `hook` for `runtime` (one of RUNTIMES); `fmt` holds the plugin name and the hook's request,
    reply and shapes (scaffold_templates.render)."""
    reply, name = fmt["reply"], fmt["name"]
    if runtime == "python":
        src = _PY.get(hook) or _PY_DEFAULT.format(**{**fmt, "reply": repr(json.loads(reply))})
        return src.replace("{NAME}", name)
    if runtime in _JS_READ:
        head, tail = _JS_READ[runtime]
        body = _JS_BODY[hook].replace("NAME", name) if hook in _JS_BODY else _JS_DEFAULT.format(**fmt)
        return f"// {hook}: request {fmt['request']}; reply {fmt['reply_shape']}.\n" + head + body + tail
    if runtime == "ruby":
        src = _RUBY.get(hook) or _RUBY_DEFAULT.format(**fmt, reply_ruby=repr(reply))
        return src.replace("NAME", name) if hook in _RUBY else src
    src = _PHP.get(hook) or _PHP_DEFAULT.format(**fmt, reply_php="'" + reply + "'")
    return src.replace("NAME", name) if hook in _PHP else src
