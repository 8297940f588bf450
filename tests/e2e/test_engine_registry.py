"""Registry-shaped plugins (like those of the librefang-registry repository) through the real service: python, stdlib only, state under ~ (HOME),
`{"memories"}` replies without `type`, list-of-blocks content, and an after_turn -> ingest round trip that recalls
what was stored, via daphne + Redis + the worker."""

from __future__ import annotations

import json
import time

from tests.plugin_factory import make_plugin, write_config
from tests.waiting import wait_until

# Modelled on auto-summarizer / todo-tracker: after_turn writes ~/.librefang/plugins/<name>/<agent>.json and also
# returns memories for the host's store; ingest reads the state file back. No `type` anywhere.
AFTER_TURN = """
import json, os, sys

def text_of(content):
    if isinstance(content, str):
        return content
    return " ".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")

req = json.load(sys.stdin)
agent = req["agent_id"]
todos = [text_of(m["content"]).split("TODO:", 1)[1].strip() for m in req["messages"]
         if m["role"] == "user" and "TODO:" in text_of(m["content"])]
state_dir = os.path.join(os.path.expanduser("~"), ".librefang", "plugins", "todo-tracker")
os.makedirs(state_dir, exist_ok=True)
with open(os.path.join(state_dir, agent + ".json"), "w") as fh:
    json.dump({"todos": todos}, fh)
print(json.dumps({"memories": [{"content": "Pending task: " + t} for t in todos]}))
"""

INGEST = """
import json, os, sys
req = json.load(sys.stdin)
path = os.path.join(os.path.expanduser("~"), ".librefang", "plugins", "todo-tracker", req["agent_id"] + ".json")
todos = json.load(open(path))["todos"] if os.path.exists(path) else []
print(json.dumps({"memories": [{"content": "Open todos: " + ", ".join(todos)}] if todos else []}))
"""


def test_it_runs_a_registry_shaped_plugin_unmodified_with_an_after_turn_to_ingest_round_trip(live, tmp_path):
    make_plugin(live.home / "plugins", "todo-tracker", {"after_turn": AFTER_TURN, "ingest": INGEST},
                top_extra='[i18n.zh]\nname = "待办跟踪"')
    fake_home = live.home / "plugin_data" / "todo-tracker"  # a hook's HOME is its data directory
    # the registry's manifests have no runtime line at all: rewrite ours the same way
    toml = live.home / "plugins" / "todo-tracker" / "plugin.toml"
    toml.write_text(toml.read_text().replace('runtime = "python"\n', ""))
    write_config(live.home, plugin="todo-tracker")
    agent = f"agent-{time.monotonic_ns()}"
    turn = [
        {"role": "user", "content": [{"type": "text", "text": "TODO: renew the kafka certificate"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Noted."},
                                          {"type": "tool_use", "id": "t1", "name": "note", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "tool_name": "note",
                                      "content": "ok", "is_error": False, "status": "success"}]},
    ]
    status, body = live.hook("after_turn", {"agent_id": agent, "peer_id": "u1", "messages": turn})
    assert status == 202, body

    state = fake_home / ".librefang" / "plugins" / "todo-tracker" / f"{agent}.json"

    def ask() -> dict:
        status, reply = live.hook("ingest", {"agent_id": agent, "peer_id": "u1",
                                             "message": "what about the kafka certificate?"})
        assert status == 200, reply
        return reply

    reply = wait_until(ask, 60, "two memories recalled", until=lambda reply: len(reply["memories"]) == 2)
    memories = reply["memories"]
    assert json.loads(state.read_text()) == {"todos": ["renew the kafka certificate"]}
    # the after_turn memory, recalled by the default engine's full-text search, then the plugin's own memory
    recalled, own = memories
    assert {k: recalled[k] for k in ("content", "scope", "source")} == {
        "content": "Pending task: renew the kafka certificate", "scope": "default_recall", "source": "todo-tracker"}
    assert recalled["id"] and 0 < recalled["score"] <= 1 and recalled["created_at"]  # the stored memory's id
    assert own == {"content": "Open todos: renew the kafka certificate", "scope": "hook"}
    assert reply["source"] == "todo-tracker"
    # another agent shares nothing
    status, other = live.hook("ingest", {"agent_id": agent + "-other", "message": "kafka certificate"})
    assert other["memories"] == []


def test_it_keeps_registry_state_under_the_real_home_inside_the_sandbox(live, tmp_path):
    """Registry plugins keep their state under `~/.librefang/plugins/<name>/` (LibreFang's home): a hook's HOME is
    its own data directory, so that state lands there, writable and its own (its plugin directory is read-only),
    while the service's home stays hidden (no api_token under that `~/.librefang`)."""
    name = "todo-tracker-home"
    peek = ('token = os.path.join(os.path.expanduser("~"), ".librefang", "api_token")\n'
            'print("api_token visible" if os.path.exists(token) else "api_token hidden", file=sys.stderr)\n')
    hooks = {"after_turn": AFTER_TURN.replace("todo-tracker", name),
             "ingest": INGEST.replace("todo-tracker", name).replace("req = json.load(sys.stdin)\n",
                                                                     "req = json.load(sys.stdin)\n" + peek)}
    make_plugin(live.home / "plugins", name, hooks)
    write_config(live.home, plugin=name)
    agent = f"agent-{time.monotonic_ns()}"
    turn = [{"role": "user", "content": "TODO: rotate the backup key"}]
    status, body = live.hook("after_turn", {"agent_id": agent, "messages": turn})
    assert status == 202, body
    state = live.home / "plugin_data" / name / ".librefang" / "plugins" / name / f"{agent}.json"
    wait_until(state.exists, 60, f"the plugin's state file {state}")
    assert json.loads(state.read_text()) == {"todos": ["rotate the backup key"]}
    status, reply = live.hook("ingest", {"agent_id": agent, "message": "backup key?"})
    assert status == 200 and reply["source"] == name, reply
    assert {"content": "Open todos: rotate the backup key", "scope": "hook"} in reply["memories"]
    status, trace = wait_until(  # traces are recorded in the background
        lambda: live.request("GET", f"/api/context-engine/traces/{reply['trace_ids'][0]}"), 30,
        "the ingest call's trace stored", until=lambda answer: answer[0] == 200)
    assert status == 200 and "api_token hidden" in trace["stderr_tail"], trace
