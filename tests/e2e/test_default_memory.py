"""The default engine remembers, through a real service: after_turn (202, processed by the worker) is stored, ingest
recalls it with a relevance score, and the memory API lists and deletes it. Its own service: no plugin configured."""

from tests.e2e.live import running_service
from tests.waiting import wait_until


def _ingest(live, agent: str, message: str, **scope) -> dict:
    status, reply = live.hook("ingest", {"agent_id": agent, "message": message, **scope})
    assert status == 200, reply
    return reply


def _top(reply: dict) -> str | None:
    return reply["memories"][0]["content"] if reply["memories"] else None


def test_it_recalls_a_turn_in_default_mode_and_the_memory_api_deletes_it(tmp_path):
    with running_service(tmp_path) as live:
        turn = {"agent_id": "e2e-agent", "peer_id": "u9", "messages": [
            {"role": "user", "content": "The release train leaves every second Thursday"},
            {"role": "assistant", "content": "Got it: releases every second Thursday."}]}
        status, body = live.hook("after_turn", turn)
        assert status == 202, body
        # after_turn is fire-and-forget: wait for the worker
        reply = wait_until(lambda: _ingest(live, "e2e-agent", "when does the release train leave?", peer_id="u9"),
                           30, "the turn recalled", until=lambda reply: reply["memories"])
        memories = reply["memories"]
        assert reply["source"] == "default" and len(memories) == 1
        assert memories[0]["content"].startswith("User: The release train leaves every second Thursday")
        assert 0 < memories[0]["score"] <= 1
        status, listed = live.request("GET", "/api/v1/memories?agent_id=e2e-agent&q=release+thursday")
        assert status == 200 and listed["total"] == 1 and listed["items"][0]["score"] > 0
        status, deleted = live.request("DELETE", f"/api/memories/{listed['items'][0]['id']}")
        assert status == 200 and deleted["deleted"] == 1
        status, reply = live.hook("ingest", {"agent_id": "e2e-agent", "peer_id": "u9", "message": "release train?"})
        assert status == 200 and reply["memories"] == []


def test_it_recalls_by_meaning_with_no_configuration(tmp_path):
    """`make run` as shipped: the offline embedder, no [embeddings] section, questions sharing no word with the turn."""
    facts = {"I have a nut allergy": "what can't I eat", "I drive a red Tesla": "what vehicle do I own",
             "my favourite colour is teal": "what color do I like"}
    with running_service(tmp_path) as live:
        for fact in facts:
            status, body = live.hook("after_turn", {"agent_id": "meaning", "messages": [
                {"role": "user", "content": fact}, {"role": "assistant", "content": "Noted."}]})
            assert status == 202, body
        for fact, question in facts.items():
            turn = f"User: {fact}\nAssistant: Noted."
            reply = wait_until(lambda question=question: _ingest(live, "meaning", question), 30,
                               f"{fact!r} recalled first for {question!r}",
                               until=lambda reply, turn=turn: _top(reply) == turn)
            assert _top(reply) == turn, (question, reply)
