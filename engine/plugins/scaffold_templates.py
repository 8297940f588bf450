"""The scaffold's hook templates, one set per text runtime (engine/plugins/scaffold.py writes them into a new plugin):
the shapes every hook receives and answers here, the templates by runtime family in engine/plugins/scaffold_scripted.py
(python, node/deno/bun, ruby, php) and engine/plugins/scaffold_systems.py (bash/native, lua, go, v).

Every template must pass the checks an agent call applies (engine/stack.py `judge_for`): assemble and compact
return the incoming messages (trimmed), never an empty list, which the engine would refuse and fall back on.
"""

from __future__ import annotations

import json

from engine import hooks as H
from engine.plugins import scaffold_scripted, scaffold_systems


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


TEXT_RUNTIMES = ("python", "node", "ruby", "php", "bash", "lua", "native", "deno", "bun", "go", "v")


def render(runtime: str, hook: str, name: str) -> str:
    request, reply_shape = SHAPES[hook]
    fmt = {"hook": hook, "reply": json.dumps(result_for(hook)), "name": name, "request": request,
           "reply_shape": reply_shape}
    family = scaffold_scripted if runtime in scaffold_scripted.RUNTIMES else scaffold_systems
    return family.render(runtime, hook, fmt)
