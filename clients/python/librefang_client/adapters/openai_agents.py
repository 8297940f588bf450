"""openai-agents' `Session` with this service's memory: what an agent learns in one session, it recalls in the
next.

    from librefang_client.adapters.openai_agents import LibreFangSession

    session = LibreFangSession("chat-42", agent_id="chef-bot", peer_id="alex")
    result = await Runner.run(agent, "What am I allergic to?", session=session, run_config=session.run_config())

- The session's own items (get_items, add_items, pop_item, clear_session) are kept by an inner openai-agents
  session: `SQLiteSession(session_id)` in memory unless `history=` gives another (a file-backed SQLiteSession, a
  Redis one, ...). The service is a context engine, not a conversation store.
- When a turn ends (items with the assistant's answer are added), the turn — the items from the last user message
  on, in OpenAI Responses format as openai-agents keeps them — goes to the service's `after_turn`, which remembers
  it for the agent, the peer and the session.
- `run_config()` (or `session_input_callback=session.recall` in a RunConfig of yours) makes openai-agents ask
  the service, before each turn, what it recalls for the new input (`ingest`), and puts it in the model's input as a
  developer message ahead of the history. The recall is fresh each turn: it is not kept with the session's items.
- The service unreachable (after the client's retries) costs the recall or the remembering, never the turn: it is
  logged as a warning.
"""

from __future__ import annotations

import logging
from typing import Any

from agents import RunConfig, SQLiteSession
from agents.memory import Session

from librefang_client import AsyncLibreFang, LibreFangError

log = logging.getLogger("librefang_client.openai_agents")

RECALL_HEADER = "What you remember about this user from earlier conversations (most relevant first):"


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("text")).strip()
    return ""


def _role(item: dict[str, Any]) -> str | None:
    return item.get("role") if item.get("type", "message") == "message" else None


def _is_recall(item: dict[str, Any]) -> bool:
    return _role(item) == "developer" and _text(item).startswith(RECALL_HEADER)


class LibreFangSession:
    """An openai-agents `Session` (the protocol) whose turns this service remembers and recalls."""

    def __init__(self, session_id: str, *, agent_id: str, peer_id: str | None = None, url: str | None = None,
                 token: str | None = None, history: Session | None = None, recall_limit: int = 5,
                 client: AsyncLibreFang | None = None):
        self.session_id = session_id
        self.session_settings = None
        self.agent_id = agent_id
        self.peer_id = peer_id
        self.recall_limit = recall_limit
        self.history = history or SQLiteSession(session_id)
        self.client = client or AsyncLibreFang(url, token)

    # ---- the Session protocol ----

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return await self.history.get_items(limit)

    async def add_items(self, items: list[Any]) -> None:
        items = [i for i in items if not _is_recall(dict(i))]  # openai-agents saves what the callback added
        if items:
            await self.history.add_items(items)
        if any(_role(dict(i)) == "assistant" for i in items):
            await self._remember_turn()

    async def pop_item(self) -> Any | None:
        return await self.history.pop_item()

    async def clear_session(self) -> None:
        await self.history.clear_session()

    # ---- the service ----

    async def _remember_turn(self) -> None:
        items = [dict(i) for i in await self.history.get_items()]
        users = [n for n, item in enumerate(items) if _role(item) == "user"]
        if not users:
            return
        try:
            await self.client.after_turn(self.agent_id, items[users[-1]:], peer_id=self.peer_id,
                                         session_id=self.session_id, dialect="openai_responses")
        except LibreFangError as exc:  # the turn itself went well: not remembering it must not fail it
            log.warning("the service did not store the turn of session %r: %s", self.session_id, exc)

    async def recall(self, history: list[Any], new_input: list[Any]) -> list[Any]:
        """openai-agents' session_input_callback: the history and the new input, with what the service recalls for
        the new input ahead of them."""
        query = " ".join(_text(dict(i)) for i in new_input if _role(dict(i)) == "user").strip()
        memories = await self._recalled(query) if query else []
        if not memories:
            return [*history, *new_input]
        lines = "\n".join(f"- {m.content}" for m in memories[: self.recall_limit])
        recalled = {"role": "developer", "content": f"{RECALL_HEADER}\n{lines}"}
        return [recalled, *history, *new_input]

    async def _recalled(self, query: str) -> list[Any]:
        try:
            return (await self.client.ingest(self.agent_id, query, peer_id=self.peer_id)).memories
        except LibreFangError as exc:  # the turn goes on without recall
            log.warning("the service recalled nothing for session %r: %s", self.session_id, exc)
            return []

    def run_config(self, **settings: Any) -> RunConfig:
        """A RunConfig (with `settings`) whose session input carries the service's recall."""
        return RunConfig(session_input_callback=self.recall, **settings)
