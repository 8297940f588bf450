"""librefang_client.adapters.langgraph with the real langgraph package (pinned in the dev extra): the store keeps
the get/put/search/delete/list_namespaces semantics LangGraph's BaseStore documents, on a live service, and a real
graph remembers in one thread what it recalls in a new one, through a prompt of langchain-core's own and a chat
model of the test's (no network)."""

from __future__ import annotations

import uuid

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.store.base import BaseStore
from librefang_client import LibreFang, LibreFangError
from librefang_client.adapters.langgraph import LibreFangStore

from tests.e2e.live import running_service


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("langgraph")) as live:
        yield live


@pytest.fixture
def store(service):
    return LibreFangStore(service.url, service.token, agent_id=f"lg-{uuid.uuid4().hex[:8]}")


def test_it_gets_puts_replaces_and_deletes_items(store):
    assert isinstance(store, BaseStore)
    assert store.get(("users", "alex"), "diet") is None
    store.put(("users", "alex"), "diet", {"text": "vegetarian", "since": 2019})
    item = store.get(("users", "alex"), "diet")
    assert (item.namespace, item.key, item.value) == (("users", "alex"), "diet", {"text": "vegetarian", "since": 2019})
    assert store.get(("users", "sam"), "diet") is None  # another namespace, the same key

    store.put(("users", "alex"), "diet", {"text": "vegan"})
    again = store.get(("users", "alex"), "diet")
    assert again.value == {"text": "vegan"} and again.created_at == item.created_at
    assert again.updated_at >= item.updated_at

    store.delete(("users", "alex"), "diet")
    assert store.get(("users", "alex"), "diet") is None
    store.delete(("users", "alex"), "diet")  # deleting what is not there is no error


def test_it_searches_by_namespace_prefix_filter_query_and_pages(store):
    store.put(("docs", "acme", "a"), "1", {"text": "kafka consumer groups", "stars": 5, "lang": "en"})
    store.put(("docs", "acme", "b"), "2", {"text": "rabbitmq exchanges", "stars": 3, "lang": "en"})
    store.put(("docs", "acme", "b"), "3", {"text": "kafka partitions", "stars": 4, "lang": "de"})
    store.put(("docs", "other"), "4", {"text": "kafka elsewhere", "stars": 5, "lang": "en"})

    assert {i.key for i in store.search(("docs", "acme"))} == {"1", "2", "3"}
    assert {i.key for i in store.search(("docs", "acme", "b"))} == {"2", "3"}
    assert {i.key for i in store.search(("docs",))} == {"1", "2", "3", "4"}
    assert {i.key for i in store.search(("docs", "acme"), filter={"lang": "en"})} == {"1", "2"}
    assert {i.key for i in store.search(("docs",), filter={"stars": {"$gte": 4}, "lang": {"$ne": "de"}})} == \
        {"1", "4"}

    found = store.search(("docs", "acme"), query="kafka")
    # ranked by meaning and words (the service's hybrid recall): both kafka items first, every item scored
    assert {i.key for i in found[:2]} == {"1", "3"} and all(i.score is not None for i in found)
    keys = [i.key for i in store.search(("docs",), limit=2)]
    assert len(keys) == 2 and keys + [i.key for i in store.search(("docs",), limit=2, offset=2)] == \
        [i.key for i in store.search(("docs",), limit=10)]
    assert store.search(("nothing",)) == []


def test_it_lists_namespaces_by_prefix_suffix_and_depth(store):
    for namespace in [("a", "b", "c"), ("a", "b", "d"), ("a", "x"), ("z", "b", "c")]:
        store.put(namespace, "k", {"v": 1})
    assert store.list_namespaces() == [("a", "b", "c"), ("a", "b", "d"), ("a", "x"), ("z", "b", "c")]
    assert store.list_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d")]
    assert store.list_namespaces(suffix=("c",)) == [("a", "b", "c"), ("z", "b", "c")]
    assert store.list_namespaces(prefix=("*", "b")) == [("a", "b", "c"), ("a", "b", "d"), ("z", "b", "c")]
    assert store.list_namespaces(max_depth=2) == [("a", "b"), ("a", "x"), ("z", "b")]
    assert store.list_namespaces(limit=1, offset=1) == [("a", "b", "d")]


async def test_it_does_the_same_asynchronously(store):
    await store.aput(("users", "alex"), "tz", {"text": "Europe/Berlin"})
    assert (await store.aget(("users", "alex"), "tz")).value == {"text": "Europe/Berlin"}
    assert [i.key for i in await store.asearch(("users",))] == ["tz"]
    assert await store.alist_namespaces() == [("users", "alex")]
    await store.adelete(("users", "alex"), "tz")
    assert await store.aget(("users", "alex"), "tz") is None


def test_it_keeps_items_as_the_agents_memories(service, store):
    store.put(("users", "alex"), "diet", {"text": "vegetarian"})
    (memory,) = LibreFang(service.url, service.token).memories.list(store.agent_id).items
    assert memory.key == '["users","alex","diet"]' and memory.tags == ["langgraph"]
    assert memory.metadata["lg_namespace"] == '["users","alex"]'


def test_it_refuses_a_bad_token_and_a_key_too_long(service, store):
    with pytest.raises(LibreFangError) as denied:
        LibreFangStore(service.url, "not-a-token", agent_id=store.agent_id).get(("users",), "x")
    assert denied.value.status == 401
    with pytest.raises(ValueError):
        store.put(("users",), "k" * 300, {"v": 1})
    assert store.search(("users",)) == []


class RecallingModel(BaseChatModel):
    """Answers from the prompt it is given: it repeats what the system message remembers, if anything."""

    prompts: list = []

    @property
    def _llm_type(self) -> str:
        return "recalling"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.prompts.append(messages)
        remembered = messages[0].content.partition("You remember:")[2].strip()
        text = f"From memory: {remembered}" if remembered and remembered != "nothing" else "Noted."
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])


def chef_graph(store: BaseStore, model: BaseChatModel):
    prompt = ChatPromptTemplate.from_messages([("system", "You cook. You remember: {memories}"),
                                               MessagesPlaceholder("messages")])

    def remember(state: MessagesState, config, *, store: BaseStore):  # after the answer, like a turn's end
        said = state["messages"][-2].content
        if said.startswith("Remember:"):
            user = config["configurable"]["user_id"]
            store.put(("memories", user), uuid.uuid4().hex, {"text": said.removeprefix("Remember:").strip()})
        return {}

    def chat(state: MessagesState, config, *, store: BaseStore):
        found = store.search(("memories", config["configurable"]["user_id"]), limit=5)
        memories = "; ".join(i.value["text"] for i in found) or "nothing"
        return {"messages": [(prompt | model).invoke({"memories": memories, "messages": state["messages"]})]}

    builder = StateGraph(MessagesState)
    builder.add_node(remember)
    builder.add_node(chat)
    builder.add_edge(START, "chat")
    builder.add_edge("chat", "remember")
    return builder.compile(checkpointer=InMemorySaver(), store=store)


def test_it_remembers_in_one_thread_what_a_new_thread_recalls(store):
    model = RecallingModel(prompts=[])
    graph = chef_graph(store, model)
    first = {"configurable": {"thread_id": "monday", "user_id": "alex"}}
    said = graph.invoke({"messages": [HumanMessage("Remember: I'm allergic to hazelnuts")]}, first)
    assert said["messages"][-1].content == "Noted."

    second = {"configurable": {"thread_id": "tuesday", "user_id": "alex"}}
    said = graph.invoke({"messages": [HumanMessage("Which nuts am I allergic to?")]}, second)
    assert [type(x).__name__ for x in said["messages"]] == ["HumanMessage", "AIMessage"]  # a new thread
    assert "I'm allergic to hazelnuts" in model.prompts[-1][0].content
    assert said["messages"][-1].content == "From memory: I'm allergic to hazelnuts"

    other = {"configurable": {"thread_id": "x", "user_id": "sam"}}
    said = graph.invoke({"messages": [HumanMessage("Which nuts am I allergic to?")]}, other)
    assert said["messages"][-1].content == "Noted."  # another user's namespace recalls nothing of alex's
