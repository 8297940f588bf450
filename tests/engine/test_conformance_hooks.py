"""Every hook's request and reply shapes (LibreFang's code and docs, see docs/compatibility.md), through the real ContextEngine with
tiny real plugins. Failure policies, retries and TTL caches too."""

from __future__ import annotations

import json

from engine import protocol as P
from engine.home import Home
from engine.invoke import Verdict, invoke
from engine.plugins.catalog import Catalog
from engine.stack import ContextEngine, EngineDeps
from tests.engine.helpers import approve
from tests.plugin_factory import make_plugin, write_config

# A hook that stores its request under the data dir, then answers with REPLY (a JSON literal, may use `req`).
RECORDER = """
import json, os, sys
req = json.loads(sys.stdin.read())
path = os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "{hook}.jsonl")
with open(path, "a") as fh:
    fh.write(json.dumps(req) + "\\n")
print(json.dumps({reply}))
"""


def recorder(hook: str, reply: str = '{"type": "ok"}') -> str:
    return RECORDER.replace("{hook}", hook).replace("{reply}", reply)


def requests_seen(home: Home, plugin: str, hook: str) -> list[dict]:
    path = home.data_dir(plugin) / f"{hook}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def single(ehome, name, hooks, config_extra="", **kw):
    make_plugin(ehome.plugins_dir, name, hooks, **kw)
    write_config(ehome.root, plugin=name, extra=config_extra)


MSGS = [
    {"role": "system", "content": "be brief", "pinned": True},
    {"role": "user", "content": "hello " * 200},
    {"role": "assistant", "content": [{"type": "text", "text": "long answer " * 100},
                                      {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "x"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "tool_name": "search",
                                  "content": "result", "is_error": False, "status": "success"}]},
]


# ---- ingest ----

def test_ingest_sends_the_documented_request_and_appends_hook_memories_after_default_recall(engine, ehome, sinks):
    sinks["memory"].remember("a1", None, "the user likes kafka")
    single(ehome, "ing", {"ingest": recorder("ingest", '{"memories": [{"content": "from hook", "extra": 1}]}')})
    reply = engine.handle("ingest", {"agent_id": "a1", "message": "tell me about kafka"})
    assert requests_seen(ehome, "ing", "ingest") == [
        {"agent_id": "a1", "message": "tell me about kafka", "type": "ingest", "peer_id": None}]
    assert reply.result["memories"] == [{"content": "the user likes kafka", "scope": "default_recall"},
                                        {"content": "from hook", "extra": 1, "scope": "hook"}]
    assert reply.source == "ing" and reply.fallback_reason is None


def test_ingest_counts_a_reply_without_memories_or_type_as_success(engine, ehome, sinks):
    single(ehome, "plain", {"ingest": "import sys; sys.stdin.read(); print('just text')"})
    reply = engine.handle("ingest", {"agent_id": "a1", "message": "x"})
    assert reply.result["memories"] == [] and reply.source == "plain"
    assert sinks["invocations"].items[-1].ok


def test_ingest_runs_nothing_in_stable_prefix_mode(engine, ehome, sinks):
    sinks["memory"].remember("a1", None, "kafka facts")
    single(ehome, "ing", {"ingest": recorder("ingest")}, config_extra="stable_prefix_mode = true")
    reply = engine.handle("ingest", {"agent_id": "a1", "message": "kafka"})
    assert reply.result == {"type": "ingest_result", "memories": []}
    assert requests_seen(ehome, "ing", "ingest") == [] and sinks["invocations"].items == []


def test_ingest_filters_by_substring_regex_and_agent(engine, ehome, sinks):
    single(ehome, "filt", {"ingest": recorder("ingest", '{"memories": [{"content": "hit"}]}')},
           toml_extra='ingest_filter = "deploy"\ningest_regex = "prod|staging"\nonly_for_agent_ids = ["ops-"]')
    for agent, message in [("ops-1", "hello"), ("ops-1", "deploy to dev"), ("dev-1", "deploy to prod")]:
        reply = engine.handle("ingest", {"agent_id": agent, "message": message})
        assert reply.result["memories"] == [] and reply.source == "default"
    reply = engine.handle("ingest", {"agent_id": "ops-1", "message": "deploy to prod"})
    assert reply.result["memories"] == [{"content": "hit", "scope": "hook"}]
    assert len(requests_seen(ehome, "filt", "ingest")) == 1


def test_ingest_cache_answers_repeats_within_the_ttl_without_running_the_hook(engine, ehome, sinks):
    single(ehome, "cached", {"ingest": recorder("ingest", '{"memories": [{"content": "slow answer"}]}')},
           toml_extra="hook_cache_ttl_secs = 60")
    first = engine.handle("ingest", {"agent_id": "a", "message": "same"})
    second = engine.handle("ingest", {"agent_id": "a", "message": "same"})
    engine.handle("ingest", {"agent_id": "a", "message": "different"})
    assert first.result["memories"] == [{"content": "slow answer", "scope": "hook"}]
    assert second.result["memories"] == [{"content": "slow answer", "scope": "hook_cached"}]
    assert len(requests_seen(ehome, "cached", "ingest")) == 2


# ---- assemble ----

def test_assemble_sends_agent_id_and_full_messages_and_uses_the_plugin_window(engine, ehome):
    single(ehome, "asm", {"assemble": recorder("assemble", '{"messages": req["messages"][:1] + req["messages"][-1:]}')})
    reply = engine.handle("assemble", {"agent_id": "a1", "system_prompt": "sys", "messages": MSGS,
                                       "context_window_tokens": 1000})
    seen = requests_seen(ehome, "asm", "assemble")[0]
    assert seen == {"agent_id": "a1", "system_prompt": "sys", "messages": MSGS, "context_window_tokens": 1000,
                    "type": "assemble"}
    assert reply.result["messages"] == [MSGS[0], MSGS[-1]] and reply.source == "asm"


def test_assemble_restores_dropped_pinned_messages_and_says_so(engine, ehome, sinks):
    single(ehome, "dropper", {"assemble": recorder("assemble", '{"messages": req["messages"][1:]}')})
    reply = engine.handle("assemble", {"agent_id": "a1", "messages": MSGS})
    assert reply.result["messages"] == MSGS
    warning = "pinned message #0 (system) was dropped by the plugin and has been restored"
    assert reply.warnings == [warning]
    assert sinks["invocations"].items[-1].annotations == {"warnings": [warning]}


def test_a_cached_assemble_reply_is_judged_as_the_fresh_one_was(engine, ehome, sinks):
    """The reply cache keeps what the plugin answered, not what the engine made of it: an answer from the cache is
    judged again (its pinned messages put back and said), the plugin not run."""
    single(ehome, "dropper", {"assemble": recorder("assemble", '{"messages": req["messages"][1:]}')},
           toml_extra="assemble_cache_ttl_secs = 60")
    fresh = engine.handle("assemble", {"agent_id": "a1", "messages": MSGS})
    cached = engine.handle("assemble", {"agent_id": "a1", "messages": MSGS})
    assert len(requests_seen(ehome, "dropper", "assemble")) == 1
    assert cached.result == fresh.result and cached.result["messages"] == MSGS
    assert cached.warnings == fresh.warnings == ["pinned message #0 (system) was dropped by the plugin and has been "
                                                 "restored"]
    assert cached.source == fresh.source == "dropper" and cached.fallback_reason is None


def test_invoke_returns_the_callers_verdict_on_the_reply(ehome, sinks):
    """engine/invoke.py: the caller's judge sees each successful reply before it is recorded; what it took from it
    comes back with the attempt, its warnings go on the trace, and its failure is the attempt's."""
    make_plugin(ehome.plugins_dir, "judged", {"ingest": recorder("ingest", '{"memories": []}')})
    entry = Catalog(ehome).get("judged")
    request = {"agent_id": "a1", "message": "m"}

    def call(judge):
        return invoke(entry, "ingest", request, home=ehome, invocations=sinks["invocations"], stderr=sinks["stderr"],
                      judge=judge)

    taken = call(lambda reply: Verdict(result={"took": reply}, warnings=("looked at it",)))
    assert taken.ok and taken.verdict == Verdict({"took": {"memories": []}}, None, ("looked at it",))
    assert sinks["invocations"].items[-1].annotations == {"warnings": ["looked at it"]}
    refused = call(lambda reply: Verdict(failure="not what this call needs"))
    assert not refused.ok and refused.verdict.failure == "not what this call needs"
    assert (refused.failure.kind, refused.failure.message) == (P.INVALID_OUTPUT, "not what this call needs")
    assert sinks["invocations"].items[-1].error_kind == P.INVALID_OUTPUT


def test_assemble_falls_back_on_an_empty_list_and_counts_it_as_a_failure(engine, ehome, sinks):
    single(ehome, "empty", {"assemble": recorder("assemble", '{"messages": [{"role": "tool", "content": "x"}]}')})
    reply = engine.handle("assemble", {"agent_id": "a1", "messages": MSGS[:2]})
    assert reply.source == "default" and reply.result["messages"] == MSGS[:2]
    assert reply.fallback_reason == "empty: invalid_output: assemble returned no usable messages"
    assert sinks["invocations"].items[-1].error_kind == P.INVALID_OUTPUT


# ---- compact ----

def test_compact_sends_token_pressure_and_defaults_the_summary(engine, ehome):
    single(ehome, "cmp", {"compact": recorder("compact", '{"messages": req["messages"][-2:]}')})
    reply = engine.handle("compact", {"agent_id": "a1", "messages": MSGS, "model": "m",
                                      "context_window_tokens": 1000})
    seen = requests_seen(ehome, "cmp", "compact")[0]
    assert seen["token_pressure"]["max_tokens"] == 1000
    assert seen["token_pressure"]["recommendation"] in ("light", "moderate", "aggressive", "critical")
    assert set(seen) == {"type", "agent_id", "messages", "model", "context_window_tokens", "token_pressure"}
    assert reply.result == {"type": "compact_result", "messages": [MSGS[0], *MSGS[-2:]],
                            "summary": "plugin compaction", "compacted_count": 2, "used_fallback": False}


class StubLlm:
    """Stands in for the host's LLM endpoint (the Summarizer port); the app tests use a real HTTP server."""

    def __init__(self, answer="LLM SUMMARY"):
        self.answer = answer
        self.calls = []

    def summarize(self, text, max_tokens, prompt=None):
        self.calls.append((text, max_tokens, prompt))
        return self.answer


def llm_engine(ehome, sinks, llm):
    return ContextEngine(EngineDeps(home=ehome, memory=sinks["memory"], invocations=sinks["invocations"],
                                    stderr=sinks["stderr"], summarizer_for=lambda cfg: llm))


def test_compact_request_llm_summary_uses_the_host_llm_and_keeps_the_kept_messages(ehome, sinks):
    llm = StubLlm()
    directive = ('{"request_llm_summary": {"prompt": "be terse", "max_tokens": 300, '
                 '"summarize": req["messages"][1:3], "keep": req["messages"][3:]}}')
    single(ehome, "llm", {"compact": recorder("compact", directive)})
    reply = llm_engine(ehome, sinks, llm).handle("compact", {"agent_id": "a1", "messages": MSGS})
    assert reply.result == {"type": "compact_result", "messages": [MSGS[0], MSGS[3]], "summary": "LLM SUMMARY",
                            "compacted_count": 2, "used_fallback": False}
    text, max_tokens, prompt = llm.calls[0]
    assert text.startswith("user: hello hello") and (max_tokens, prompt) == (300, "be terse")


def test_compact_without_an_llm_falls_through_to_the_plugins_messages(ehome, sinks):
    directive = ('{"request_llm_summary": {"summarize": req["messages"][:1], "keep": []}, '
                 '"messages": req["messages"][-1:], "summary": "own"}')
    single(ehome, "llm", {"compact": recorder("compact", directive)})
    reply = llm_engine(ehome, sinks, None).handle("compact", {"agent_id": "a1", "messages": MSGS})
    assert reply.result["summary"] == "own" and reply.result["messages"] == [MSGS[0], MSGS[-1]]
    reply = llm_engine(ehome, sinks, StubLlm("")).handle("compact", {"agent_id": "a1", "messages": MSGS})
    assert reply.result["summary"] == "own"


# ---- after_turn ----

AFTER_TURN = """
import json, sys
req = json.loads(sys.stdin.read())
lengths = [len(m["content"]) if isinstance(m["content"], str) else len(m["content"][0]["text"]) for m in req["messages"]]
print(json.dumps({"memories": [{"content": "remember the deploy window", "tags": ["ops"]}, {"nope": 1}],
                  "log": "stored one", "annotations": {"lengths": lengths}}))
"""


def test_after_turn_truncates_to_500_chars_stores_memories_and_annotates_the_trace(engine, ehome, sinks):
    single(ehome, "at", {"after_turn": AFTER_TURN})
    reply = engine.handle("after_turn", {"agent_id": "a1", "peer_id": "u1", "messages": MSGS[1:3]})
    assert reply.result == {"type": "ok", "memories_stored": 1} and reply.source == "at"
    assert sinks["memory"].items == [{"agent_id": "a1", "peer_id": "u1", "content": "remember the deploy window",
                                      "source": "at"}]
    assert sinks["invocations"].items[-1].annotations == {"plugin": {"lengths": [500, 500]}}


def test_after_turn_max_chars_zero_sends_whole_messages(engine, ehome, sinks):
    single(ehome, "at", {"after_turn": AFTER_TURN}, config_extra="after_turn_max_chars = 0")
    engine.handle("after_turn", {"agent_id": "a1", "messages": MSGS[1:3]})
    assert sinks["invocations"].items[-1].annotations == {"plugin": {"lengths": [1200, 1200]}}


# ---- bootstrap ----

BOOTSTRAP = """
import json, sys, time
req = json.loads(sys.stdin.read())
time.sleep(1.3)  # the point: longer than the 1 s timeout, within the twice that bootstrap gets
print(json.dumps({"type": "ok", "env_overrides": {"FROM_BOOT": "yes", "STATIC": "boot"}, "ingest_filter": "magic"}))
"""
ENV_INGEST = """
import json, os, sys
sys.stdin.read()
print(json.dumps({"memories": [{"content": os.environ.get("FROM_BOOT", "-") + "/" + os.environ["STATIC"]}]}))
"""


def test_bootstrap_gets_twice_the_timeout_and_its_overrides_apply_to_later_calls(engine, ehome, sinks):
    single(ehome, "boot", {"bootstrap": BOOTSTRAP, "ingest": ENV_INGEST}, toml_extra="hook_timeout_secs = 1",
           top_extra='[env]\nSTATIC = "manifest"')
    assert engine.handle("ingest", {"agent_id": "a", "message": "x"}).result["memories"] == [
        {"content": "-/manifest", "scope": "hook"}]
    reply = engine.handle("bootstrap", {"context_window_tokens": 1000})
    assert reply.source == "boot" and reply.fallback_reason is None  # 1.3 s < 2 x 1 s
    assert engine.handle("ingest", {"agent_id": "a", "message": "x"}).result["memories"] == []  # filtered now
    assert engine.handle("ingest", {"agent_id": "a", "message": "magic"}).result["memories"] == [
        {"content": "yes/manifest", "scope": "hook"}]  # static [env] keys win over env_overrides
    assert '"max_recall_results": 5' in sinks["invocations"].items[1].input_preview


# ---- subagents, transform, on_event ----

def test_prepare_and_merge_subagent_send_parent_and_child(engine, ehome):
    single(ehome, "sub", {"prepare_subagent": recorder("prepare_subagent"),
                          "merge_subagent": recorder("merge_subagent")})
    assert engine.handle("prepare_subagent", {"parent_id": "p", "child_id": "c"}).source == "sub"
    engine.handle("merge_subagent", {"parent_id": "p", "child_id": "c"})
    assert requests_seen(ehome, "sub", "prepare_subagent") == [{"parent_id": "p", "child_id": "c",
                                                                "type": "prepare_subagent"}]
    assert requests_seen(ehome, "sub", "merge_subagent")[0]["type"] == "merge_subagent"


def test_transform_tool_result_sends_both_contracts_and_understands_every_reply(engine, ehome):
    for name, reply_json, expected in [
        ("code", '{"content": "REDACTED"}', "REDACTED"),
        ("docs", '{"type": "transformed", "result": "SHORT"}', "SHORT"),
    ]:
        single(ehome, name, {"transform_tool_result": recorder("transform_tool_result", reply_json)})
        reply = engine.handle("transform_tool_result", {"agent_id": "a", "tool_name": "read", "tool_use_id": "t9",
                                                        "input": {"path": "/x"}, "content": "secret stuff",
                                                        "is_error": False})
        assert reply.result == {"type": "transformed", "content": expected, "result": expected}
        seen = requests_seen(ehome, name, "transform_tool_result")[0]
        assert seen == {"type": "transform_tool_result", "agent_id": "a", "tool_name": "read", "tool_use_id": "t9",
                        "input": {"path": "/x"}, "args": {"path": "/x"}, "content": "secret stuff",
                        "result": "secret stuff", "is_error": False, "status": "success"}
    single(ehome, "docs_in", {"transform_tool_result": recorder("transform_tool_result", '{"content": req["result"].upper()}')})
    reply = engine.handle("transform_tool_result", {"tool_name": "t", "args": {}, "result": "docs shape"})
    assert reply.result["content"] == "DOCS SHAPE"


def test_transform_skip_and_missing_content_leave_the_result_unchanged_as_a_success(engine, ehome, sinks):
    for reply_json in ('{"type": "skip"}', '{"note": "nothing"}'):
        single(ehome, "noop", {"transform_tool_result": recorder("transform_tool_result", reply_json)})
        reply = engine.handle("transform_tool_result", {"tool_name": "t", "content": "orig"})
        assert reply.result == {"type": "unchanged", "content": "orig", "result": "orig"}
        assert reply.fallback_reason is None and sinks["invocations"].items[-1].ok


def test_on_event_receives_the_event_without_a_type(engine, ehome):
    single(ehome, "ev", {"on_event": recorder("on_event")})
    engine.handle("on_event", {"event": {"name": "x", "payload": {"k": 1}, "source_plugin": "other"}})
    assert requests_seen(ehome, "ev", "on_event") == [{"event": {"name": "x", "payload": {"k": 1},
                                                                 "source_plugin": "other"}}]


# ---- failure policy, retries ----

FAIL = "import sys; sys.stdin.read(); print('broken', file=sys.stderr); sys.exit(3)"


def test_on_hook_failure_warn_falls_back_with_a_reason(engine, ehome):
    single(ehome, "w", {"assemble": FAIL})
    reply = engine.handle("assemble", {"messages": MSGS[:2]})
    assert reply.source == "default" and not reply.aborted
    assert reply.fallback_reason == "w: script_error: exit code 3: broken"


def test_on_hook_failure_skip_falls_back_silently(engine, ehome):
    single(ehome, "s", {"assemble": FAIL}, toml_extra='on_hook_failure = "skip"')
    reply = engine.handle("assemble", {"messages": MSGS[:2]})
    assert reply.source == "default" and reply.fallback_reason is None and not reply.aborted


def test_on_hook_failure_abort_returns_an_error_instead_of_a_fallback(engine, ehome):
    single(ehome, "ab", {"ingest": FAIL, "assemble": FAIL, "bootstrap": FAIL}, toml_extra='on_hook_failure = "abort"')
    for hook, req in [("ingest", {"message": "x"}), ("assemble", {"messages": MSGS[:2]})]:
        reply = engine.handle(hook, req)
        assert reply.aborted
        assert reply.to_dict()["error"] == {"kind": "aborted", "plugin": "ab", "hook": hook, "cause": "script_error",
                                            "message": "exit code 3: broken"}
    assert not engine.handle("bootstrap", {}).aborted  # LibreFang ignores abort for bootstrap


def test_max_retries_retries_with_backoff_then_succeeds(engine, ehome, sinks):
    flaky = """
    import json, os, sys
    sys.stdin.read()
    p = os.path.join(os.environ["LIBREFANG_PLUGIN_DATA_DIR"], "n")
    n = int(open(p).read()) if os.path.exists(p) else 0
    open(p, "w").write(str(n + 1))
    if n < 2:
        sys.exit(1)
    print(json.dumps({"memories": [{"content": f"attempt {n + 1}"}]}))
    """
    single(ehome, "flaky", {"ingest": flaky}, toml_extra="max_retries = 2\nretry_delay_ms = 20")
    sleeps = []
    engine._sleep = sleeps.append
    reply = engine.handle("ingest", {"message": "x"})
    assert reply.result["memories"] == [{"content": "attempt 3", "scope": "hook"}]
    assert [i.ok for i in sinks["invocations"].items] == [False, False, True]
    assert sleeps == [0.02, 0.04]


def test_a_timed_out_hook_falls_back_with_a_classified_reason(engine, ehome):
    single(ehome, "slow", {"ingest": "import time; time.sleep(30)"}, toml_extra="hook_timeout_secs = 0.5")
    reply = engine.handle("ingest", {"message": "x"})
    assert reply.source == "default"
    assert reply.fallback_reason == "slow: timeout: hook did not finish within 0.5s; its process group was killed"


def test_circuit_breaker_fails_fast_after_max_failures_then_probes_after_reset(engine, ehome, sinks):
    single(ehome, "cb", {"ingest": FAIL}, toml_extra="circuit_breaker = { max_failures = 2, reset_secs = 60 }")
    now = [1000.0]
    engine.breakers.clock = lambda: now[0]
    for _ in range(2):
        assert engine.handle("ingest", {"agent_id": "a", "message": "x"}).fallback_reason.startswith("cb: script_error")
    reply = engine.handle("ingest", {"agent_id": "a", "message": "x"})
    assert reply.fallback_reason == "cb: circuit_open: circuit open after 2 consecutive failures; retrying in 60s"
    assert len(sinks["invocations"].items) == 2  # the hook did not run
    assert engine.handle("ingest", {"agent_id": "b", "message": "x"}).fallback_reason.startswith("cb: script_error")
    now[0] += 61
    assert engine.handle("ingest", {"agent_id": "a", "message": "x"}).fallback_reason.startswith("cb: script_error")
    assert engine.handle("ingest", {"agent_id": "a", "message": "x"}).fallback_reason.startswith("cb: circuit_open")


def test_shared_state_gives_each_agent_its_own_state_file(engine, ehome):
    src = """
    import json, os, sys
    sys.stdin.read()
    path = os.environ["LIBREFANG_STATE_FILE"]
    state = json.load(open(path))
    state["n"] = state.get("n", 0) + 1
    json.dump(state, open(path, "w"))
    print(json.dumps({"memories": [{"content": f"call {state['n']}"}]}))
    """
    single(ehome, "stateful", {"ingest": src}, toml_extra="enable_shared_state = true")
    got = [engine.handle("ingest", {"agent_id": agent, "message": "x"}).result["memories"][0]["content"]
           for agent in ("a/1", "a/1", "b")]
    assert got == ["call 1", "call 2", "call 1"]
    assert json.loads((ehome.data_dir("stateful") / "agents" / "a_1" / "state.json").read_text()) == {"n": 2}


def test_stderr_lines_go_to_the_stderr_loggers_and_the_sink(engine, ehome, sinks, caplog):
    import logging

    src = ("import sys, json; sys.stdin.read(); print('line one', file=sys.stderr); "
           "print('line two', file=sys.stderr); print('{}')")
    single(ehome, "noisy", {"ingest": src})
    with caplog.at_level(logging.DEBUG, logger="python_stderr"):
        engine.handle("ingest", {"message": "x"})
    lines = [(r.name, r.levelname, r.getMessage(), r.plugin, r.hook) for r in caplog.records
             if r.name == "python_stderr" and r.levelname == "INFO"]
    assert lines == [("python_stderr", "INFO", "line one", "noisy", "ingest"),
                     ("python_stderr", "INFO", "line two", "noisy", "ingest")]
    assert any(r.name == "python_stderr" and r.levelname == "DEBUG" for r in caplog.records)  # one-record summary
    assert sinks["stderr"].lines == [("noisy", "ingest", "line one"), ("noisy", "ingest", "line two")]


def test_malformed_requests_are_normalised_not_crashed_on(engine, ehome):
    for hook, req in [("assemble", {"messages": "not a list", "context_window_tokens": "big"}),
                      ("compact", {"messages": [1, None, {"role": "user", "content": "hi"}],
                                   "context_window_tokens": -5}),
                      ("after_turn", {"messages": {"role": "user"}}),
                      ("bootstrap", {"context_window_tokens": True}),
                      ("ingest", {"message": None, "agent_id": None})]:
        reply = engine.handle(hook, req)
        assert reply.source == "default" and not reply.aborted, hook
    reply = engine.handle("compact", {"messages": [1, {"role": "user", "content": "hi"}], "context_window_tokens": -5})
    assert reply.result["messages"] == [{"role": "user", "content": "hi"}]


SCHEMAS = """
[hooks.hook_schemas.ingest.input]
type = "object"
required = ["message", "session_id"]
[hooks.hook_schemas.ingest.output]
type = "object"
required = ["memories"]
properties = { memories = { type = "array", items = { type = "object", required = ["content"] } } }
"""


def test_hook_schemas_warn_on_input_and_output_and_strict_output_fails(engine, ehome, sinks):
    make_plugin(ehome.plugins_dir, "schemed", {"ingest": recorder("ingest", '{"memories": [{"text": "no content"}]}')})
    toml = ehome.plugins_dir / "schemed" / "plugin.toml"
    toml.write_text(toml.read_text() + SCHEMAS)
    write_config(ehome.root, plugin="schemed")
    engine.handle("ingest", {"message": "x"})
    assert sinks["invocations"].items[-1].ok
    assert sinks["invocations"].items[-1].annotations == {"warnings": [
        "input schema: $: missing required field 'session_id'",
        "output schema: $.memories[0]: missing required field 'content'"]}
    toml.write_text(toml.read_text().replace("[hooks.hook_schemas.ingest.input]", "output_schema_strict = true\n\n"
                                             "[hooks.hook_schemas.ingest.input]"))
    reply = engine.handle("ingest", {"message": "x"})
    assert reply.fallback_reason == ("schemed: invalid_output: output schema: $.memories[0]: missing required "
                                     "field 'content'")


def test_bootstrap_overrides_reach_every_worker_process_sharing_the_home(engine, ehome, sinks):
    single(ehome, "boot", {"bootstrap": BOOTSTRAP, "ingest": ENV_INGEST}, toml_extra="hook_timeout_secs = 5",
           top_extra='[env]\nSTATIC = "manifest"')
    engine.handle("bootstrap", {})
    other_worker = ContextEngine(EngineDeps(home=ehome, memory=sinks["memory"], invocations=sinks["invocations"]))
    assert other_worker.handle("ingest", {"agent_id": "a", "message": "magic"}).result["memories"] == [
        {"content": "yes/manifest", "scope": "hook"}]
    assert other_worker.handle("ingest", {"agent_id": "a", "message": "plain"}).result["memories"] == []


def test_reload_takes_effect_on_the_next_call_and_drops_cached_replies(engine, ehome):
    pdir = make_plugin(ehome.plugins_dir, "live", {"ingest": recorder("ingest", '{"memories": [{"content": "v1"}]}')},
                       toml_extra="hook_cache_ttl_secs = 600")
    write_config(ehome.root, plugin="live")
    assert engine.handle("ingest", {"message": "m"}).result["memories"][0]["content"] == "v1"
    (pdir / "hooks" / "ingest2.py").write_text(recorder("ingest", '{"memories": [{"content": "v2"}]}'))
    toml = pdir / "plugin.toml"
    toml.write_text(toml.read_text().replace('ingest = "hooks/ingest.py"', 'ingest = "hooks/ingest2.py"'))
    assert engine.handle("ingest", {"message": "m"}).result["memories"][0]["content"] == "v2"
    toml.write_text(toml.read_text().replace('runtime = "python"', 'runtime = "bash"'))
    reply = engine.handle("ingest", {"message": "m"})  # now run by bash: a python script fails there
    assert reply.source == "default" and "live: script_error" in reply.fallback_reason


def test_the_default_engine_answers_every_hook_when_nothing_is_configured(engine, sinks):
    assert engine.chain() == []
    assert engine.handle("after_turn", {"agent_id": "a", "messages": MSGS}).to_dict() == {
        "type": "ok", "memories_stored": 0, "source": "default"}
    for hook in ("bootstrap", "prepare_subagent", "merge_subagent", "on_event"):
        assert engine.handle(hook, {}).to_dict() == {"type": "ok", "source": "default"}, hook
    assert engine.handle("transform_tool_result", {"content": "c"}).result == {
        "type": "unchanged", "content": "c", "result": "c"}
    assert sinks["invocations"].items == []


def test_transform_agent_filter_skips_the_hook(engine, ehome, sinks):
    single(ehome, "only-ops", {"transform_tool_result": recorder("transform_tool_result", '{"content": "X"}')},
           toml_extra='only_for_agent_ids = ["ops"]')
    assert engine.handle("transform_tool_result", {"agent_id": "dev-1", "content": "c"}).result["content"] == "c"
    assert sinks["invocations"].items == []
    assert engine.handle("transform_tool_result", {"agent_id": "ops-1", "content": "c"}).result["content"] == "X"


def test_allowed_secrets_come_from_the_service_environment_and_missing_ones_warn(engine, ehome, sinks, monkeypatch,
                                                                                approvals):
    monkeypatch.setenv("LIBREFANG_SECRET_API_TOKEN", "s3cret")
    monkeypatch.delenv("LIBREFANG_SECRET_MISSING", raising=False)
    monkeypatch.setenv("LIBREFANG_SECRET_NOT_ALLOWED", "x")
    src = """
    import json, os, sys
    sys.stdin.read()
    print(json.dumps({"memories": [{"content": json.dumps(sorted(k for k in os.environ if "SECRET" in k))},
                                   {"content": os.environ.get("LIBREFANG_SECRET_API_TOKEN", "-")}]}))
    """
    single(ehome, "sec", {"ingest": src}, toml_extra='allowed_secrets = ["api_token", "missing"]')
    reply = engine.handle("ingest", {"message": "x"})  # asked for, not approved: no secret
    assert [m["content"] for m in reply.result["memories"]] == ["[]", "-"]
    assert "permissions.unapproved" in sinks["invocations"].items[-1].annotations["warnings"][0]
    approve(approvals, ehome.plugins_dir / "sec")
    reply = engine.handle("ingest", {"message": "x"})
    assert [m["content"] for m in reply.result["memories"]] == ['["LIBREFANG_SECRET_API_TOKEN"]', "s3cret"]
    assert sinks["invocations"].items[-1].annotations == {
        "warnings": ["allowed_secrets: LIBREFANG_SECRET_MISSING is not set in the service environment"]}
