"""LlamaIndex's long-term memory on this service: a memory block of llama-index-core's `Memory`, so what an agent
learns in one session it recalls in the next.

    from llama_index.core.memory import Memory
    from librefang_client.adapters.llama_index import LibreFangMemoryBlock

    block = LibreFangMemoryBlock(agent_id="chef-bot", peer_id="alex")   # url/token: arguments or LIBREFANG_URL/_TOKEN
    memory = Memory.from_defaults(session_id="monday", token_limit=4000, memory_blocks=[block])
    answer = await agent.run("What am I allergic to?", memory=memory)    # any agent or chat engine taking a Memory

How it fits LlamaIndex's `Memory` (llama_index/core/memory/memory.py):
- Stored (`_aput`): what Memory hands its blocks, i.e. the messages it flushes out of its short-term window once the
  chat history passes `token_limit` x `chat_history_token_ratio` (LlamaIndex's waterfall). Each user turn in them
  (the user's message and the assistant's answers after it, as text; tool calls and results are left out) goes to
  `after_turn` for the agent, the peer and Memory's session. A session too short to overflow stores its turns at
  its end the same way: `await block.aput(await memory.aget_all(status=MessageStatus.ACTIVE),
  session_id=memory.session_id)` (the messages Memory still holds; the flushed ones are stored already).
- Recalled (`_aget`): each time Memory is read (before every LLM call of an agent or chat engine), `ingest` with the
  latest user message recalls the agent's memories of this peer from every session, best first; Memory puts them in
  the system message as this block's part of `<memory>` (or in the user message with `insert_method="user"`).
- The service unreachable (after the client's retries) costs a turn its recall or its remembering, logged as a
  warning, never the turn.

The calls run the synchronous client in a worker thread: LlamaIndex's synchronous entry points (`chat`, `Memory.get`)
run each coroutine in a new event loop, and an async HTTP client's connections belong to the loop that made them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.memory.memory import BaseMemoryBlock

from librefang_client import LibreFang, LibreFangError

log = logging.getLogger("librefang_client.llama_index")

ANSWERS = {MessageRole.ASSISTANT, MessageRole.CHATBOT, MessageRole.MODEL}


def text_of(message: ChatMessage) -> str:
    return " ".join(b.text for b in message.blocks if isinstance(b, TextBlock) and b.text).strip()


def turns(messages: list[ChatMessage]) -> list[list[dict[str, str]]]:
    """Each user message with the assistant's answers after it, as OpenAI chat messages of text."""
    out: list[list[dict[str, str]]] = []
    for message in messages:
        text = text_of(message)
        if message.role == MessageRole.USER and text:
            out.append([{"role": "user", "content": text}])
        elif message.role in ANSWERS and text and out:
            out[-1].append({"role": "assistant", "content": text})
    return out


class LibreFangMemoryBlock(BaseMemoryBlock[str]):
    """A `BaseMemoryBlock` whose memories the service keeps: `after_turn` stores, `ingest` recalls."""

    name: str = Field(default="librefang", description="The block's name (its tag inside <memory>).")
    agent_id: str = Field(description="The agent the memories belong to.")
    peer_id: str | None = Field(default=None, description="The user they are about (recall sees theirs and the "
                                                          "agent's shared ones); None: every user's.")
    recall_limit: int = Field(default=5, description="The most memories recalled into a prompt.")
    _client: LibreFang = PrivateAttr()

    def __init__(self, *, agent_id: str, url: str | None = None, token: str | None = None,
                 client: LibreFang | None = None, **fields: Any):
        super().__init__(agent_id=agent_id, **fields)
        self._client = client or LibreFang(url, token)

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        query = next((text_of(m) for m in reversed(messages or []) if m.role == MessageRole.USER and text_of(m)), "")
        if not query:
            return ""
        try:
            reply = await asyncio.to_thread(self._client.ingest, self.agent_id, query, peer_id=self.peer_id)
        except LibreFangError as exc:  # the turn goes on without recall
            log.warning("the service recalled nothing for agent %r: %s", self.agent_id, exc)
            return ""
        return "\n".join(f"- {m.content}" for m in reply.memories[: self.recall_limit])

    async def _aput(self, messages: list[ChatMessage]) -> None:
        # Memory's aput wrote its session id into each message's additional_kwargs
        session_id = next((m.additional_kwargs.get("session_id") for m in messages
                           if m.additional_kwargs.get("session_id")), None)
        for turn in turns(messages):
            try:
                await asyncio.to_thread(self._client.after_turn, self.agent_id, turn, peer_id=self.peer_id,
                                        session_id=session_id, dialect="openai")
            except LibreFangError as exc:  # the conversation goes on: not remembering a turn must not fail it
                log.warning("the service did not store a turn of session %r: %s", session_id, exc)
