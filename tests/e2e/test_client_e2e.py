"""librefang-client (clients/python) against a real service (daphne + worker + Redis, default engine): typed round
trips of the hooks with an OpenAI-format history and of the memory API, the service's errors as exceptions, and a
bound agent token refused for another agent."""

from __future__ import annotations

import pytest
from librefang_client import (
    AsyncLibreFang,
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    LibreFang,
    NotFound,
    RetryPolicy,
    Unauthorized,
)
from librefang_client import models as m

from tests.e2e.live import free_port, running_service
from tests.waiting import wait_until

HISTORY = [  # OpenAI Chat Completions, as an agent framework holds it
    {"role": "system", "content": "You are a travel agent."},
    {"role": "user", "content": "Book the usual hotel in Lisbon; I always want a quiet room facing the garden."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "book", "arguments": '{"city": "Lisbon"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "booked: Hotel Jardim, room 12 (garden side)"},
    {"role": "assistant", "content": "Done: Hotel Jardim, a quiet garden-side room."},
]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("client")) as live:
        yield live


@pytest.fixture
def lf(service):
    with LibreFang(service.url, service.token) as client:
        yield client


def recalled(lf: LibreFang, agent_id: str, message: str, **scope) -> m.IngestReply:
    """ingest until the worker has stored the turn (after_turn is fire-and-forget)."""
    return wait_until(lambda: lf.ingest(agent_id, message, **scope), 30, f"{agent_id}'s turn recalled",
                      until=lambda reply: reply.memories)


def test_it_stores_a_turn_and_recalls_it_typed(lf):
    accepted = lf.after_turn("travel-bot", HISTORY, peer_id="ana", session_id="s1")
    assert isinstance(accepted, m.AfterTurnAccepted) and accepted.accepted and accepted.hook == "after_turn"

    reply = recalled(lf, "travel-bot", "which room does Ana want in Lisbon?", peer_id="ana")
    assert isinstance(reply, m.IngestReply) and reply.source == "default"
    assert len(reply.memories) == 1 and isinstance(reply.memories[0], m.RecalledMemory)
    memory = reply.memories[0]
    assert "quiet room facing the garden" in memory.content and 0 < memory.score <= 1
    assert lf.memories.get(memory.id).session_id == "s1"
    assert lf.ingest("travel-bot", "which room does Ana want in Lisbon?", peer_id="bob").memories == []


def test_it_assembles_an_openai_history_and_gives_it_back_in_openai_format(lf):
    reply = lf.assemble(HISTORY, agent_id="travel-bot", context_window_tokens=8000)
    assert isinstance(reply, m.AssembleReply) and reply.dialect == "openai"
    assert [x.model_dump(exclude_unset=True) for x in reply.messages] == HISTORY
    compacted = lf.compact(HISTORY, agent_id="travel-bot", context_window_tokens=8000)
    assert isinstance(compacted, m.CompactReply) and compacted.dialect == "openai"


def test_it_puts_gets_updates_lists_and_deletes_memories(lf):
    made = lf.memories.put("crm-bot", "drink", "Ana drinks green tea", peer_id="ana", tags=["pref"],
                           metadata={"kind": "preference"})
    again = lf.memories.put("crm-bot", "drink", "Ana drinks jasmine tea", peer_id="ana", tags=["pref"],
                            metadata={"kind": "preference"})
    assert isinstance(made, m.MemoryOut) and again.id == made.id and again.content == "Ana drinks jasmine tea"
    other = lf.memories.add("crm-bot", "Ana lives in Porto", peer_id="ana", key="home")
    with pytest.raises(Conflict) as conflict:
        lf.memories.add("crm-bot", "Ana lives in Faro", peer_id="ana", key="home")
    assert conflict.value.status == 409 and conflict.value.code == "conflict"

    updated = lf.memories.update(made.id, tags=["pref", "drinks"])
    assert updated.tags == ["pref", "drinks"] and lf.memories.get(made.id).tags == ["pref", "drinks"]
    page = lf.memories.list("crm-bot", peer_id="ana", tags=["drinks"], metadata={"kind": "preference"})
    assert isinstance(page, m.MemoryListOut) and [x.id for x in page.items] == [made.id]
    found = lf.memories.list("crm-bot", q="jasmine tea")
    # recall is by meaning and words (hybrid): every memory of the scope comes back ranked, the match first
    assert found.items[0].id == made.id and found.items[0].score > 0 and found.recall["mode"] == "hybrid"
    first = lf.memories.list("crm-bot", limit=1, order="oldest")
    second = lf.memories.list("crm-bot", limit=1, order="oldest", cursor=first.next_cursor)
    assert [x.id for x in first.items + second.items] == [made.id, other.id]
    scopes = lf.memories.scopes("crm-bot")
    assert isinstance(scopes, m.MemoryScopesOut) and scopes.scopes[0].count == 2

    assert lf.memories.delete(made.id).deleted == 1
    with pytest.raises(NotFound) as gone:
        lf.memories.get(made.id)
    assert gone.value.code == "not_found"
    assert lf.memories.delete_scope("crm-bot", peer_id="ana").deleted == 1
    assert lf.memories.list("crm-bot").items == []


def test_it_raises_the_services_errors_with_code_message_and_details(service, lf):
    with pytest.raises(BadRequest) as bad:
        lf.memories.list("crm-bot", limit=0)
    assert bad.value.code == "validation_error" and bad.value.details and bad.value.message
    with pytest.raises(Unauthorized) as unknown:
        LibreFang(service.url, "not-a-token").ingest("travel-bot", "hello")
    assert unknown.value.status == 401 and unknown.value.code == "unauthorized"

    bound = service.manage("token", "create", "--role", "agent", "--name", "client-bound", "--agent", "crm-*")
    with LibreFang(service.url, bound.stdout.strip().splitlines()[-1]) as crm:
        assert crm.memories.list("crm-other").items == []
        with pytest.raises(Forbidden) as refused:
            crm.after_turn("travel-bot", HISTORY)
        assert refused.value.status == 403 and refused.value.code == "agent_forbidden"


def test_it_reads_url_and_token_from_the_environment(service, monkeypatch):
    monkeypatch.setenv("LIBREFANG_URL", service.url)
    monkeypatch.setenv("LIBREFANG_TOKEN", service.token)
    with LibreFang() as lf:
        assert lf.ingest("nobody", "hello").source == "default"
    monkeypatch.delenv("LIBREFANG_TOKEN")
    with pytest.raises(ValueError, match="LIBREFANG_TOKEN"):
        LibreFang()


def test_it_gives_up_on_a_service_that_never_answers_with_connection_failed():
    lf = LibreFang(f"http://127.0.0.1:{free_port()}", "t", retry=RetryPolicy(max_retries=2, backoff=0.01))
    with pytest.raises(ConnectionFailed) as failed:
        lf.ingest("a", "hello")
    assert failed.value.code == "connection_error" and failed.value.status is None


async def test_it_makes_the_same_calls_asynchronously(service):
    async with AsyncLibreFang(service.url, service.token) as lf:
        made = await lf.memories.put("async-bot", "city", "Ana lives in Porto")
        assert isinstance(made, m.MemoryOut) and (await lf.memories.get(made.id)).content == "Ana lives in Porto"
        reply = await lf.ingest("async-bot", "where does Ana live?")
        assert [x.id for x in reply.memories] == [made.id]
        with pytest.raises(NotFound):
            await lf.memories.get(made.id + 1000)


def test_it_answers_mem0s_calls_in_mem0s_shapes(service):
    from librefang_client.adapters.mem0 import Memory

    memory = Memory(service.url, service.token, agent_id="chef-bot")
    added = memory.add([{"role": "system", "content": "be brief"},
                        {"role": "user", "content": "I'm Alex, a vegetarian allergic to nuts"},
                        {"role": "assistant", "content": [{"type": "text", "text": "Noted: vegetarian, no nuts."}]}],
                       user_id="alex", metadata={"topic": "diet"})
    assert [r["event"] for r in added["results"]] == ["ADD", "ADD"]
    memory.add("I'm Sam and I love steak", user_id="sam")

    later = Memory(service.url, service.token, agent_id="chef-bot")  # a new process, as it were
    found = later.search("allergic", user_id="alex")["results"]
    assert found[0]["memory"] == "I'm Alex, a vegetarian allergic to nuts" and found[0]["score"] > 0  # ranked first
    assert {r["user_id"] for r in found} == {"alex"}  # Sam's memory is another user's: never recalled for Alex
    assert found[0]["user_id"] == "alex" and found[0]["metadata"] == {"topic": "diet", "role": "user"}
    assert len(later.search("vegetarian", user_id="alex")["results"]) == 2
    steak = later.search("steak", user_id="alex")["results"]  # Sam's steak is not Alex's, however close the words
    assert steak and all(r["user_id"] == "alex" and "steak" not in r["memory"] for r in steak)
    assert later.search("vegetarian", user_id="alex", filters={"role": "assistant"})["results"][0]["memory"] == \
        "Noted: vegetarian, no nuts."

    first = added["results"][0]["id"]
    assert later.get(first)["memory"] == "I'm Alex, a vegetarian allergic to nuts"
    assert later.update(first, "Alex is vegan")["message"]
    assert later.get(first)["memory"] == "Alex is vegan"
    assert len(later.get_all(user_id="alex")["results"]) == 2 and len(later.get_all()["results"]) == 3
    assert len(later.get_all(limit=1)["results"]) == 1
    later.delete(first)
    assert later.get(first) is None
    with pytest.raises(ValueError):
        later.delete_all()
    later.delete_all(user_id="alex")
    assert later.get_all(user_id="alex")["results"] == [] and len(later.get_all()["results"]) == 1


def test_it_calls_the_other_hooks_typed(lf):
    assert isinstance(lf.bootstrap(), m.BootstrapReply)
    handed = lf.prepare_subagent("travel-bot", "travel-bot-child", HISTORY[:2])
    assert isinstance(handed, m.PrepareSubagentReply) and handed.source == "default"
    assert isinstance(lf.merge_subagent("travel-bot", "travel-bot-child"), m.MergeSubagentReply)
    transformed = lf.transform_tool_result("book", "booked: Hotel Jardim", agent_id="travel-bot")
    assert isinstance(transformed, m.TransformToolResultReply) and transformed.content == "booked: Hotel Jardim"
    event = lf.on_event({"kind": "session_end", "agent_id": "travel-bot"})
    assert isinstance(event, m.OnEventAccepted) and event.accepted
