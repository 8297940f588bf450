"""The message dialects (engine/dialects.py) on histories recorded from real frameworks (tests/fixtures/dialects/):
detected, checked, converted to LibreFang's format with every tool call next to its result, and back exactly as the
agent sent them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import dialects
from engine import hook_requests as R
from engine.errors import validation_details
from engine.overrides import restore_pinned

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "dialects").glob("*.json"))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(params=FIXTURES, ids=[p.stem for p in FIXTURES])
def recorded(request) -> dict:
    return load(request.param)


def tool_pairs(messages: list[dict]) -> list[tuple[int, int]]:
    """(index of the tool_use, index of its tool_result) for every call in LibreFang messages."""
    uses = {b["id"]: i for i, m in enumerate(messages) if isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_use"}
    return [(uses[b["tool_use_id"]], i) for i, m in enumerate(messages) if isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_result"]


def test_it_recognises_each_frameworks_history(recorded):
    assert dialects.detect(recorded["request"]) == recorded["dialect"]


@pytest.mark.parametrize("hook", ["assemble", "compact", "after_turn"])
def test_it_gives_plugins_librefangs_format_with_tool_calls_paired(recorded, hook):
    call = R.accept(hook, recorded["request"])
    plugin_view = call.request["messages"]
    for m in plugin_view:
        dialects.LibreFangMessage.model_validate(m)
    pairs = tool_pairs(plugin_view)
    assert pairs, "every recorded history has a tool call"
    for use, result in pairs:  # each result follows its call directly
        assert result == use + 1 and plugin_view[use]["role"] == "assistant" and plugin_view[result]["role"] == "user"
    results = [b for m in plugin_view if isinstance(m["content"], list) for b in m["content"]
               if b.get("type") == "tool_result"]
    assert all(b["tool_name"] and isinstance(b["content"], str) and b["content"] for b in results)
    assert "dialect" not in call.request


def test_it_answers_unchanged_messages_exactly_as_the_agent_sent_them(recorded):
    call = R.accept("assemble", recorded["request"])
    reply = call.reply({"type": "assemble_result", "messages": call.request["messages"], "source": "p"})
    assert reply["messages"] == recorded["request"]["messages"]
    assert reply["dialect"] == recorded["dialect"] and "system" not in reply


def test_it_converts_what_a_plugin_changed_into_the_agents_dialect(recorded):
    # the default engine's compaction keeps the last message and adds nothing; a plugin adds a summary message
    call = R.accept("compact", recorded["request"])
    kept = call.request["messages"][-1:]
    summary = {"role": "user", "content": [{"type": "text", "text": "Summary of earlier turns."}]}
    reply = call.reply({"messages": [summary, *kept]})
    dialect = recorded["dialect"]
    first = reply["messages"][0]
    if dialect in ("openai", "openai_responses"):
        assert first == {"role": "user", "content": "Summary of earlier turns."}
    else:
        assert first == summary
    assert reply["messages"][1:] == recorded["request"]["messages"][-1:]


def test_it_takes_anthropics_system_prompt_as_the_system_prompt():
    request = load(next(p for p in FIXTURES if "anthropic" in p.stem))["request"]
    call = R.accept("assemble", request)
    assert call.request["system_prompt"] == "You are a scheduling assistant." and "system" not in call.request
    assert all(m["role"] in ("user", "assistant") for m in call.request["messages"])
    # a system message a plugin adds goes back as Anthropic's `system`, not as a message
    reply = call.reply({"messages": [{"role": "system", "content": "Be terse."}, *call.request["messages"]]})
    assert reply["system"] == "Be terse." and reply["messages"] == request["messages"]


def test_it_keeps_pinned_messages_pinned_through_the_conversion():
    history = [{"role": "system", "content": "rules", "pinned": True},
               {"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "done", "pinned": True}]
    call = R.accept("assemble", {"messages": history})
    assert [m.get("pinned", False) for m in call.request["messages"]] == [True, False, False, True]
    # a plugin that keeps only the user's message: the engine puts the pinned ones back (engine/overrides.py)
    restored, warnings = restore_pinned(call.request["messages"], [call.request["messages"][1]])
    assert len(warnings) == 2
    assert call.reply({"messages": restored})["messages"] == [history[0], history[1], history[3]]


def test_it_leaves_librefang_requests_as_they_are():
    request = {"agent_id": "a", "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "n", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]}
    call = R.accept("assemble", request)
    assert call.request is request and call.conversion is None
    assert call.reply({"messages": []}) == {"messages": []}


def test_a_named_dialect_wins_and_plain_text_comes_back_without_librefangs_fields():
    call = R.accept("assemble", {"dialect": "openai", "messages": [{"role": "user", "content": "hi"}]})
    reply = call.reply({"messages": [{"role": "user", "content": "hi", "pinned": False},
                                     {"role": "assistant", "content": "new", "pinned": False}]})
    assert reply["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "new"}]


@pytest.mark.parametrize(("request_", "loc"), [
    ({"messages": [{"role": "tool", "content": "x"}]}, ["messages", "0"]),  # no tool_call_id
    ({"messages": [{"role": "user", "content": None}]}, ["messages", "0"]),
    ({"messages": [{"type": "function_call", "call_id": "c"}]}, ["messages", "0"]),
    ({"dialect": "klingon", "messages": []}, ["dialect"]),
    ({"messages": [{"role": "robot", "content": "x"}]}, ["messages", "0", "role"]),
])
def test_it_refuses_malformed_messages_in_the_agents_own_terms(request_, loc):
    with pytest.raises(R.ValidationError) as refused:
        R.accept("assemble", request_)
    assert [d["loc"] for d in validation_details(refused.value.errors())] == [loc]
