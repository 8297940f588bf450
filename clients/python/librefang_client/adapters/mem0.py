"""mem0's calls on this service's memory API, so code written against mem0 moves over by changing one import:

    from librefang_client.adapters.mem0 import Memory   # was: from mem0 import Memory
    memory = Memory()                                   # or Memory(url=..., token=..., agent_id=...)
    memory.add([{"role": "user", "content": "I am vegetarian"}], user_id="alex")
    memory.search("what do I eat?", user_id="alex")["results"]

mem0's scopes map onto the service's: `user_id` is the peer, `agent_id` the agent (the facade's `agent_id` when
a call names none: every memory here belongs to an agent) and `run_id` the session. Answers have mem0's shapes
(`{"results": [{"id", "memory", "score", "metadata", "user_id", "agent_id", "run_id", ...}]}`); ids are the
service's, as strings.

What differs: `add` stores each user and assistant message as it is (mem0's `infer=False`); the service extracts
no facts with an LLM, so `infer` is accepted and ignored. `metadata` filters (`filters=`) match top-level values.
"""

from __future__ import annotations

from typing import Any

from librefang_client import LibreFang, NotFound
from librefang_client import models as m

MAX_PAGE = 200  # the memory API's largest page


def as_item(memory: m.MemoryOut | m.RecalledMemory) -> dict[str, Any]:
    """A memory in mem0's shape."""
    data = memory.model_dump()
    return {"id": str(data["id"]), "memory": data["content"], "hash": None, "metadata": data.get("metadata") or {},
            "score": data.get("score"), "created_at": data.get("created_at"), "updated_at": data.get("updated_at"),
            "user_id": data.get("peer_id"), "agent_id": data.get("agent_id"), "run_id": data.get("session_id"),
            "key": data.get("key"), "tags": data.get("tags") or []}


def _texts(messages: str | dict[str, Any] | list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of each user or assistant message worth remembering."""
    if isinstance(messages, str):
        return [("user", messages)]
    if isinstance(messages, dict):
        messages = [messages]
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict)).strip()
        if message.get("role") in ("user", "assistant") and isinstance(content, str) and content.strip():
            out.append((message["role"], content))
    return out


class Memory:
    """mem0's `Memory` calls (add, search, get, get_all, update, delete, delete_all) on this service."""

    def __init__(self, url: str | None = None, token: str | None = None, *, agent_id: str = "default",
                 client: LibreFang | None = None):
        self.client = client or LibreFang(url, token)
        self.agent_id = agent_id

    def _scope(self, user_id: str | None, agent_id: str | None, run_id: str | None) -> dict[str, Any]:
        return {"agent_id": agent_id or self.agent_id, "peer_id": user_id, "session_id": run_id}

    def add(self, messages: str | dict[str, Any] | list[dict[str, Any]], *, user_id: str | None = None,
            agent_id: str | None = None, run_id: str | None = None, metadata: dict[str, Any] | None = None,
            infer: bool = True, **_: Any) -> dict[str, Any]:
        scope = {k: v for k, v in self._scope(user_id, agent_id, run_id).items() if v is not None}
        results = []
        for role, text in _texts(messages):
            made = self.client.memories.add(content=text, metadata={**(metadata or {}), "role": role}, **scope)
            results.append({"id": str(made.id), "memory": made.content, "event": "ADD"})
        return {"results": results}

    def search(self, query: str, *, user_id: str | None = None, agent_id: str | None = None,
               run_id: str | None = None, limit: int = 100, filters: dict[str, Any] | None = None,
               threshold: float | None = None, **_: Any) -> dict[str, Any]:
        page = self.client.memories.list(q=query, limit=min(limit, MAX_PAGE), metadata=filters or None,
                                         **self._scope(user_id, agent_id, run_id))
        items = [as_item(x) for x in page.items]
        return {"results": [x for x in items if threshold is None or (x["score"] or 0) >= threshold]}

    def get(self, memory_id: str | int) -> dict[str, Any] | None:
        try:
            return as_item(self.client.memories.get(int(memory_id)))
        except NotFound:
            return None

    def get_all(self, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None,
                filters: dict[str, Any] | None = None, limit: int = 100, **_: Any) -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        cursor = None
        while len(results) < limit:
            page = self.client.memories.list(limit=min(limit - len(results), MAX_PAGE), cursor=cursor,
                                             metadata=filters or None, **self._scope(user_id, agent_id, run_id))
            results += [as_item(x) for x in page.items]
            cursor = page.next_cursor
            if not cursor:
                break
        return {"results": results}

    def update(self, memory_id: str | int, data: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        changes: dict[str, Any] = {"content": data}
        if metadata is not None:
            changes["metadata"] = metadata
        self.client.memories.update(int(memory_id), **changes)
        return {"message": "Memory updated successfully!"}

    def delete(self, memory_id: str | int) -> dict[str, Any]:
        self.client.memories.delete(int(memory_id))
        return {"message": "Memory deleted successfully!"}

    def delete_all(self, *, user_id: str | None = None, agent_id: str | None = None,
                   run_id: str | None = None) -> dict[str, Any]:
        if not (user_id or agent_id or run_id):
            raise ValueError("At least one filter is required to delete all memories (user_id, agent_id, run_id)")
        self.client.memories.delete_scope(**self._scope(user_id, agent_id, run_id))
        return {"message": "Memories deleted successfully!"}
