"""plugin_stack conformance: the per-hook semantics of a stack (engine/stack.py), with the
differences from LibreFang listed under "Stacks" in docs/compatibility.md."""

from __future__ import annotations

import threading

from tests.engine.test_conformance_hooks import FAIL, MSGS, recorder, requests_seen
from tests.plugin_factory import make_plugin, write_config
from tests.waiting import WaitTimedOut, wait_until


def mem(content):
    return f'{{"memories": [{{"content": "{content}"}}]}}'


def stack(ehome, plugins: dict[str, dict], extra="", toml: dict | None = None):
    for name, hooks in plugins.items():
        make_plugin(ehome.plugins_dir, name, hooks, toml_extra=(toml or {}).get(name, ""))
    write_config(ehome.root, stack=list(plugins), extra=extra)


# Each layer says it started and waits for the go the test gives once both have (a layer sees its own data
# directory only, so the test carries the word between them): it returns only if the other runs at the same time.
RENDEZVOUS = """
import json, os, sys, time
sys.stdin.read()
data = os.environ["LIBREFANG_PLUGIN_DATA_DIR"]
open(os.path.join(data, "started"), "w").close()
end = time.monotonic() + 15
while not os.path.exists(os.path.join(data, "go")):
    if time.monotonic() > end:
        sys.exit("the other layer never started")
    time.sleep(0.02)
print(json.dumps({reply}))
"""


def _go_once_all_started(dirs: list, timeout: float = 20.0) -> threading.Thread:
    def watch():
        try:
            wait_until(lambda: all((d / "started").exists() for d in dirs), timeout, "every layer started")
        except WaitTimedOut:
            return  # no go: the layers fail saying the other never started
        for d in dirs:
            (d / "go").touch()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_ingest_runs_every_layer_concurrently_and_recalls_the_default_once(engine, ehome, sinks):
    sinks["memory"].remember("a", None, "stored kafka note")
    stack(ehome, {"one": {"ingest": RENDEZVOUS.format(reply=mem("from one"))},
                  "two": {"ingest": RENDEZVOUS.format(reply=mem("from two"))},
                  "three": {"ingest": FAIL}}, toml={"one": "hook_timeout_secs = 20", "two": "hook_timeout_secs = 20"})
    watcher = _go_once_all_started([ehome.data_dir("one"), ehome.data_dir("two")])
    reply = engine.handle("ingest", {"agent_id": "a", "message": "kafka"})
    watcher.join()
    assert [m["content"] for m in reply.result["memories"]] == ["stored kafka note", "from one", "from two"]
    assert reply.source == "one,two" and reply.fallback_reason == "three: script_error: exit code 3: broken"


def test_ingest_orders_layers_by_plugin_stack_weights(engine, ehome):
    stack(ehome, {"a": {"ingest": recorder("ingest", mem("A"))}, "b": {"ingest": recorder("ingest", mem("B"))},
                  "c": {"ingest": recorder("ingest", mem("C"))}},
          extra="[context_engine.plugin_stack_weights]\nc = 2.0\nb = 0.5")
    reply = engine.handle("ingest", {"agent_id": "x", "message": "m"})
    assert [m["content"] for m in reply.result["memories"]] == ["C", "A", "B"]


def test_assemble_first_non_empty_wins_and_layers_without_the_hook_are_skipped(engine, ehome):
    stack(ehome, {"nohook": {"ingest": recorder("ingest")},
                  "empty": {"assemble": recorder("assemble", '{"messages": []}')},
                  "winner": {"assemble": recorder("assemble", '{"messages": req["messages"][-1:]}')},
                  "never": {"assemble": recorder("assemble", '{"messages": req["messages"]}')}})
    reply = engine.handle("assemble", {"agent_id": "a", "messages": MSGS})
    assert reply.source == "winner" and reply.result["messages"] == [MSGS[0], MSGS[-1]]
    assert requests_seen(ehome, "never", "assemble") == []
    assert reply.fallback_reason == "empty: invalid_output: assemble returned no usable messages"


def test_assemble_uses_the_default_when_every_layer_fails(engine, ehome):
    stack(ehome, {"f1": {"assemble": FAIL}, "f2": {"assemble": recorder("assemble", '{"messages": []}')}})
    reply = engine.handle("assemble", {"agent_id": "a", "messages": MSGS[:2]})
    assert reply.source == "default" and reply.result["messages"] == MSGS[:2]
    assert reply.result["recovery_stage"] == "none"


def test_compact_first_usable_result_wins(engine, ehome):
    stack(ehome, {"bad": {"compact": FAIL},
                  "good": {"compact": recorder("compact", '{"messages": req["messages"][-1:], "summary": "S"}')}})
    reply = engine.handle("compact", {"agent_id": "a", "messages": MSGS})
    assert reply.source == "good" and reply.result["summary"] == "S" and reply.result["used_fallback"] is False


def test_after_turn_runs_every_layer_and_isolates_failures(engine, ehome, sinks):
    stack(ehome, {"x": {"after_turn": recorder("after_turn", mem("x fact"))}, "broken": {"after_turn": FAIL},
                  "y": {"after_turn": recorder("after_turn", mem("y fact"))}})
    reply = engine.handle("after_turn", {"agent_id": "a", "messages": MSGS[1:2]})
    assert sorted(m["content"] for m in sinks["memory"].items) == ["x fact", "y fact"]
    assert reply.source == "x,y" and reply.result["memories_stored"] == 2


def test_after_turn_events_reach_the_other_layers_on_event_only(engine, ehome):
    emitter = recorder("after_turn", '{"events": [{"name": "topic_changed", "payload": {"to": "kafka"}}]}')
    stack(ehome, {"emitter": {"after_turn": emitter, "on_event": recorder("on_event")},
                  "listener": {"on_event": recorder("on_event")}})
    engine.handle("after_turn", {"agent_id": "a", "messages": MSGS[1:2]})
    assert requests_seen(ehome, "listener", "on_event") == [
        {"event": {"name": "topic_changed", "payload": {"to": "kafka"}, "source_plugin": "emitter"}}]
    assert requests_seen(ehome, "emitter", "on_event") == []  # self-events are skipped


def test_transform_first_transformed_wins_and_later_layers_are_not_called(engine, ehome):
    stack(ehome, {"skipper": {"transform_tool_result": recorder("transform_tool_result", '{"type": "skip"}')},
                  "failing": {"transform_tool_result": FAIL},
                  "rewriter": {"transform_tool_result": recorder("transform_tool_result", '{"content": "R"}')},
                  "later": {"transform_tool_result": recorder("transform_tool_result", '{"content": "L"}')}})
    reply = engine.handle("transform_tool_result", {"tool_name": "t", "content": "orig"})
    assert reply.source == "rewriter" and reply.result["content"] == "R"
    assert len(requests_seen(ehome, "skipper", "transform_tool_result")) == 1
    assert requests_seen(ehome, "later", "transform_tool_result") == []


def test_bootstrap_and_subagent_hooks_run_every_layer_in_order_past_failures(engine, ehome):
    stack(ehome, {"b1": {"bootstrap": FAIL, "prepare_subagent": FAIL},
                  "b2": {"bootstrap": recorder("bootstrap"), "prepare_subagent": recorder("prepare_subagent")}})
    assert engine.handle("bootstrap", {}).source == "b2"
    reply = engine.handle("prepare_subagent", {"parent_id": "p", "child_id": "c"})
    assert reply.source == "b2" and reply.fallback_reason.startswith("b1: script_error")
    assert len(requests_seen(ehome, "b2", "bootstrap")) == 1


def test_each_layer_uses_its_own_timeout(engine, ehome):
    # 3 s is the point: longer than one layer's timeout, well within the other's
    sleepy = "import json, sys, time; sys.stdin.read(); time.sleep(3); print(json.dumps(%s))"
    stack(ehome, {"quick": {"ingest": sleepy % mem("q")}, "patient": {"ingest": sleepy % mem("p")}},
          toml={"quick": "hook_timeout_secs = 0.5", "patient": "hook_timeout_secs = 20"})
    reply = engine.handle("ingest", {"agent_id": "a", "message": "m"})
    assert [m["content"] for m in reply.result["memories"]] == ["p"]
    assert reply.fallback_reason.startswith("quick: timeout: hook did not finish within 0.5s")


def test_the_deadline_covers_each_layers_timeout_and_retries(engine, ehome):
    stack(ehome, {"a": {"assemble": FAIL, "ingest": FAIL}, "b": {"assemble": FAIL, "ingest": FAIL}},
          toml={"a": "hook_timeout_secs = 2\nmax_retries = 1\nretry_delay_ms = 500", "b": "hook_timeout_secs = 3"})
    assert engine.deadline_secs("assemble") == 2 * 2 + 0.5 + 3  # sequential layers add up
    assert engine.deadline_secs("ingest") == 4.5  # concurrent layers: the slowest
    assert engine.deadline_secs("bootstrap") == 60.0  # nobody declares it: the default 30 s, doubled


def test_a_disabled_or_missing_plugin_is_left_out_of_the_stack(engine, ehome):
    stack(ehome, {"on": {"ingest": recorder("ingest", mem("on"))}, "off": {"ingest": recorder("ingest", mem("off"))}})
    (ehome.plugins_dir / "off" / ".disabled").write_text("")
    write_config(ehome.root, stack=["on", "off", "ghost"])
    assert engine.chain() == ["on"]
    assert [m["content"] for m in engine.handle("ingest", {"message": "m"}).result["memories"]] == ["on"]


def test_every_hook_has_a_declared_strategy_and_one_timeout_rule():
    from types import SimpleNamespace

    from engine import hooks as H
    from engine.strategies import ALL, FIRST_USABLE, MERGE, STRATEGIES

    assert set(STRATEGIES) == set(H.ALL_HOOKS)
    assert STRATEGIES["ingest"].mode == MERGE and STRATEGIES["after_turn"].mode == ALL
    assert {h for h, s in STRATEGIES.items() if s.mode == FIRST_USABLE} == {"assemble", "compact",
                                                                           "transform_tool_result"}
    settings = SimpleNamespace(hook_timeout_secs=4.0)
    assert H.timeout_for("bootstrap", settings) == 8.0 and H.timeout_for("ingest", settings) == 4.0
    assert H.timeout_for("compact") == H.DEFAULT_TIMEOUT_SECS
