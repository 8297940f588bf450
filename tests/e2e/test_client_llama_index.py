"""librefang_client.adapters.llama_index with the real llama-index-core (pinned in the dev extra): a FunctionAgent
and a SimpleChatEngine run real turns with LlamaIndex's own mock LLMs (no network) on a `Memory` holding the block.
What the first session's Memory flushes to its blocks is stored by the service; a new session's Memory recalls it
into the prompt LlamaIndex assembles."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from librefang_client import LibreFang, RetryPolicy
from librefang_client.adapters.llama_index import LibreFangMemoryBlock
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import ChatMessage, MockLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory import Memory
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.storage.chat_store.sql import MessageStatus

from tests.e2e.live import free_port, running_service
from tests.waiting import wait_until

# llama-index's workflows inspect its pydantic models' deprecated attributes on every run: noise, not ours
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("llama-index")) as live:
        yield live


@pytest.fixture
def agent_id():
    return f"li-{uuid.uuid4().hex[:8]}"


class ScriptedLLM:
    """The mock LLM's answers: what the block recalled into a system message, if anything, else an acknowledgement;
    keeps every prompt it was given."""

    def __init__(self):
        self.prompts: list[list[ChatMessage]] = []

    def __call__(self, messages, **kwargs) -> ChatMessage:
        self.prompts.append(list(messages))
        recalled = [m.content.split("<librefang>")[1].split("</librefang>")[0].strip()
                    for m in messages if m.role == "system" and "<librefang>" in (m.content or "")]
        return ChatMessage(role="assistant", content=f"From memory: {recalled[0]}" if recalled else "Noted.")


def small_memory(session_id: str, block: LibreFangMemoryBlock) -> Memory:
    """A Memory whose short-term window holds about one turn, so the previous turn flushes to its blocks."""
    return Memory.from_defaults(session_id=session_id, token_limit=20, chat_history_token_ratio=0.5,
                                memory_blocks=[block])


def stored(lf: LibreFang, agent_id: str, **scope) -> list:
    # after_turn: stored by a worker a moment after its 202
    return wait_until(lambda: lf.memories.list(agent_id, **scope).items, 30, f"{agent_id}'s turn stored")


async def test_an_agent_remembers_a_session_and_recalls_it_in_a_new_one(service, agent_id):
    scripted = ScriptedLLM()
    agent = FunctionAgent(llm=MockFunctionCallingLLM(response_generator=scripted), tools=[], system_prompt="You cook.")
    block = LibreFangMemoryBlock(agent_id=agent_id, peer_id="alex", url=service.url, token=service.token)
    assert isinstance(block, BaseMemoryBlock) and block.name == "librefang"

    monday = small_memory("monday", block)
    assert str(await agent.run("I'm allergic to hazelnuts", memory=monday)) == "Noted."
    assert str(await agent.run("Thanks, that is all for today", memory=monday)) == "Noted."  # the first flushes

    lf = LibreFang(service.url, service.token)
    (memory,) = stored(lf, agent_id)
    assert memory.content == "User: I'm allergic to hazelnuts\nAssistant: Noted."
    assert (memory.session_id, memory.peer_id) == ("monday", "alex")

    tuesday = small_memory("tuesday", block)
    answer = await agent.run("Which nuts am I allergic to?", memory=tuesday)
    prompt = scripted.prompts[-1]
    assert [m.role for m in prompt] == ["system", "system", "user"]  # the agent's, then Memory's with the block
    assert prompt[1].content == ("<memory>\n<librefang>\n- User: I'm allergic to hazelnuts\nAssistant: Noted.\n"
                                 "</librefang>\n</memory>")
    assert str(answer) == "From memory: - User: I'm allergic to hazelnuts\nAssistant: Noted."
    assert [m.content for m in await tuesday.aget_all()] == ["Which nuts am I allergic to?", str(answer)]

    sam = LibreFangMemoryBlock(agent_id=agent_id, peer_id="sam", url=service.url, token=service.token)
    assert str(await agent.run("Which nuts am I allergic to?", memory=small_memory("x", sam))) == "Noted."


def test_a_chat_engine_stores_a_short_session_at_its_end_and_recalls_it_synchronously(service, agent_id):
    block = LibreFangMemoryBlock(agent_id=agent_id, peer_id="kim", url=service.url, token=service.token)
    wednesday = Memory.from_defaults(session_id="wednesday", memory_blocks=[block])  # nothing overflows
    SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=2), memory=wednesday).chat("I live in Lisbon")
    lf = LibreFang(service.url, service.token)
    assert lf.memories.list(agent_id).items == []

    asyncio.run(block.aput(wednesday.get_all(status=MessageStatus.ACTIVE), session_id=wednesday.session_id))
    (memory,) = stored(lf, agent_id)
    assert (memory.content, memory.session_id) == ("User: I live in Lisbon\nAssistant: text text", "wednesday")

    thursday = Memory.from_defaults(session_id="thursday", memory_blocks=[block])
    echoed = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=thursday).chat("Where do I live?")
    # MockLLM answers with the prompt LlamaIndex rendered from the chat messages: Memory's system message first
    assert "<librefang>\n- User: I live in Lisbon\nAssistant: text text\n</librefang>" in str(echoed)
    assert str(echoed).rstrip().endswith("Where do I live?\nassistant:")


async def test_the_turn_goes_on_when_the_service_is_unreachable(caplog, agent_id):
    down = LibreFang(f"http://127.0.0.1:{free_port()}", "t", retry=RetryPolicy(max_retries=1, backoff=0.01))
    block = LibreFangMemoryBlock(agent_id=agent_id, client=down)
    agent = FunctionAgent(llm=MockFunctionCallingLLM(response_generator=ScriptedLLM()), tools=[])
    memory = small_memory("s", block)
    assert str(await agent.run("I'm allergic to hazelnuts", memory=memory)) == "Noted."
    assert str(await agent.run("Thanks", memory=memory)) == "Noted."
    assert "recalled nothing" in caplog.text and "did not store a turn" in caplog.text
