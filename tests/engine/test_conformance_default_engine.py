"""The default context engine (engine/default_engine.py): recall, overflow cascade, compaction, thresholds."""

from __future__ import annotations

from engine import default_engine as D


def msg(role, text, pinned=False):
    m = {"role": role, "content": text}
    if pinned:
        m["pinned"] = True
    return m


def tool_pair(i, result_chars=10):
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "grep", "input": {"q": i}}]}
    res = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "tool_name": "grep",
                                        "content": "r" * result_chars, "is_error": False, "status": "success"}]}
    return [use, res]


def test_should_compress_at_80_percent():
    assert not D.should_compress(159_999, 200_000)
    assert D.should_compress(160_000, 200_000)
    assert D.should_compress(26_000, 32_000) and not D.should_compress(25_000, 32_000)
    assert not D.should_compress(10, 0)


def test_token_pressure_recommendations():
    assert D.token_pressure([], 0)["max_tokens"] == 100_000
    levels = {}
    for chars in (100, 2500, 3300, 3700):
        levels[chars] = D.token_pressure([msg("user", "x" * chars)], 1000)["recommendation"]
    assert levels == {100: "light", 2500: "moderate", 3300: "aggressive", 3700: "critical"}


def test_assemble_leaves_a_window_under_70_percent_alone():
    msgs = [msg("user", "hi"), msg("assistant", "hello")]
    assert D.assemble({"messages": msgs, "context_window_tokens": 1000}) == {
        "type": "assemble_result", "messages": msgs, "recovery_stage": "none"}


def test_assemble_keeps_pinned_and_the_last_ten_unpinned_on_overflow():
    msgs = [msg("system", "rules", pinned=True)] + [msg("user", f"m{i} " + "x" * 400) for i in range(30)]
    out = D.assemble({"messages": msgs, "context_window_tokens": 2000})
    assert out["recovery_stage"] == "auto_compaction"
    assert out["messages"][0] == msgs[0] and out["messages"][1:] == msgs[-10:]


def test_assemble_goes_down_to_four_then_truncates_old_tool_results():
    msgs = [msg("user", "y" * 600) for _ in range(12)]
    out = D.assemble({"messages": msgs, "context_window_tokens": 1000})
    assert out["recovery_stage"] == "overflow_compaction" and out["messages"] == msgs[-4:]
    big = tool_pair(1, 5000) + tool_pair(2, 5000)
    out = D.assemble({"messages": big, "context_window_tokens": 3000})
    assert out["recovery_stage"] == "tool_result_truncation"
    first_result = out["messages"][1]["content"][0]["content"]
    assert first_result.startswith("r" * 2000) and "[truncated 3000 chars]" in first_result
    assert out["messages"][3]["content"][0]["content"] == "r" * 5000  # the latest result stays whole


def test_assemble_never_splits_a_tool_use_from_its_result():
    msgs = [msg("user", "z" * 800) for _ in range(8)] + tool_pair(1) + [msg("user", "q" * 800) for _ in range(3)]
    out = D.assemble({"messages": msgs, "context_window_tokens": 900})
    kept = out["messages"]
    uses = {b["id"] for m in kept if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_use"}
    results = {b["tool_use_id"] for m in kept if isinstance(m["content"], list) for b in m["content"]
               if b["type"] == "tool_result"}
    assert results <= uses
    assert out["recovery_stage"] in ("overflow_compaction", "tool_result_truncation", "final_error")


class Llm:
    def __init__(self, answer="", fail=False):
        self.answer, self.fail, self.seen = answer, fail, []

    def summarize(self, text, max_tokens, prompt=None):
        self.seen.append(text)
        if self.fail:
            raise OSError("connection refused")
        return self.answer


def test_compact_without_an_llm_is_extractive_and_marked_used_fallback():
    msgs = [msg("system", "rules", pinned=True)] + [msg("user", f"Point {i}. More detail here.") for i in range(14)]
    out = D.compact({"messages": msgs})
    assert out["used_fallback"] is True and out["compacted_count"] == 4
    assert out["messages"] == [msgs[0], *msgs[-10:]]
    assert out["summary"] == "user: Point 0 | user: Point 1 | user: Point 2 | user: Point 3"
    assert D.compact({"messages": msgs}) == out  # deterministic


def test_compact_uses_the_llm_when_configured_and_falls_back_when_it_fails():
    msgs = [msg("user", f"turn {i}") for i in range(12)]
    llm = Llm("summary from llm")
    out = D.compact({"messages": msgs}, llm)
    assert out["summary"] == "summary from llm" and out["used_fallback"] is False
    assert llm.seen == ["user: turn 0\nuser: turn 1"]
    out = D.compact({"messages": msgs}, Llm(fail=True))
    assert out["used_fallback"] is True and out["summary"] == "user: turn 0 | user: turn 1"


def test_default_ingest_recalls_scoped_memories(sinks):
    sinks["memory"].remember("a1", None, "rust is the user's favourite language")
    sinks["memory"].remember("a2", None, "rust belongs to another agent")
    out = D.ingest({"agent_id": "a1", "message": "which language? rust", "peer_id": None}, sinks["memory"], 5)
    assert out == {"type": "ingest_result",
                   "memories": [{"content": "rust is the user's favourite language", "scope": "default_recall"}]}


def test_default_ingest_survives_a_broken_store():
    class Broken:
        def recall(self, *a):
            raise RuntimeError("db down")

    assert D.ingest({"agent_id": "a", "message": "x"}, Broken()) == {"type": "ingest_result", "memories": []}


def test_compact_summarises_long_histories_in_chunks_then_merges():
    from engine.default_engine import llm_summary

    class Counting:
        def __init__(self):
            self.calls = []

        def summarize(self, text, max_tokens, prompt=None):
            self.calls.append((len(text), prompt))
            return "merged" if prompt else f"p{len(text)}"

    msgs = [msg("user", "w" * 30) for _ in range(10)]  # each renders as 36 chars
    llm = Counting()
    assert llm_summary(msgs, llm, max_chunk_chars=100) == "merged"
    chunk_calls = [c for c in llm.calls if c[1] is None]
    assert len(chunk_calls) == 5 and all(n <= 100 for n, _ in chunk_calls)
    assert llm.calls[-1][1].startswith("Merge these partial summaries")
    llm = Counting()
    assert llm_summary(msgs[:2], llm, max_chunk_chars=100) == "p73" and len(llm.calls) == 1
