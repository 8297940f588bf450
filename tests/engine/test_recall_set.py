"""The recall benchmark's set (bench/recall/set.json, written by bench/recall/make_set.py) is what bench/README.md
says: at least 200 memories across 20 agents, 100 queries each naming one of its agent's memories, and no query
sharing a content word with the memory it expects (so full text alone cannot find it: only meaning can)."""

import json
import re
from pathlib import Path

SET = Path(__file__).resolve().parents[2] / "bench" / "recall" / "set.json"
_FUNCTION_WORDS = (
    "a an the i me my we our us you your he she her his it its they them their is am are was were be been being "
    "do does did done have has had can can't cannot must will would should could may might what which who whom "
    "whose when where why how this that these those of in on at by for with from to into over after before about "
    "and or but not no so if than then there any anyone some each every most more much many get got go going "
    "one two")
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())


def stem(word: str) -> str:
    """Crude suffix stripping: enough to call "allergy" and "allergic", or "runs" and "run", the same word."""
    for suffix in ("ies", "ing", "ed", "es", "ic", "y", "s", "e"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[:-len(suffix)]
    return word


def content_words(text: str) -> set[str]:
    return {stem(w) for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in FUNCTION_WORDS}


def load():
    return json.loads(SET.read_text())


def test_it_has_200_memories_across_20_agents_and_100_queries():
    data = load()
    assert len(data["memories"]) >= 200
    assert len({m["agent_id"] for m in data["memories"]}) >= 20
    assert len(data["queries"]) >= 100


def test_it_expects_a_memory_of_the_querys_own_agent():
    data = load()
    held = {(m["agent_id"], m["content"]) for m in data["memories"]}
    assert all((q["agent_id"], q["expected"]) in held for q in data["queries"])


def test_it_shares_no_content_word_between_a_query_and_its_memory():
    shared = {q["query"]: sorted(content_words(q["query"]) & content_words(q["expected"]))
              for q in load()["queries"]}
    assert {q: words for q, words in shared.items() if words} == {}


def test_the_check_catches_a_shared_word():
    assert content_words("what allergies do I have") & content_words("I have a nut allergy") == {"allerg"}
