"""LangGraph's long-term memory store on this service's memory API: what a graph puts in one thread, it finds in
the next, and the dashboard shows it among the agent's memories.

    from librefang_client.adapters.langgraph import LibreFangStore

    store = LibreFangStore(agent_id="chef-bot")          # url/token: arguments or LIBREFANG_URL / LIBREFANG_TOKEN
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)
    # in a node: store.put(("memories", user_id), "diet", {"text": "vegetarian"}); store.search(("memories", user_id))

How LangGraph's items map onto memories (one memory per item, all of them the store's `agent_id`'s):
- the memory's `key` is the item's namespace and key as a JSON array (`["memories","alex","diet"]`, at most 200
  characters), so a put replaces the item in place (the memory API's put-by-key);
- its `content` is the item's value as JSON, which is what the service's full-text search (`query=`) ranks;
- its `metadata` holds the namespace (`lg_namespace`, a JSON array, and `lg_ns0`, `lg_ns1`, ... one per label),
  so a namespace prefix is an equality filter the service applies; it carries the tag `langgraph`.
Namespaces are not mapped onto the service's peers and sessions: a LangGraph namespace has any depth and meaning
(`("memories", user_id)`, `("docs", org, project)`), so the store keeps them whole and agent-wide.

Search: `query` is the service's full-text search (only items whose value has the words, best first, with a
`score`); without it, newest first. `filter` is applied here to each item's value, LangGraph's way (equality on
top-level and nested values, `$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`), and then `offset`/`limit`.
`index` (LangGraph's embedding fields) is accepted and ignored: the service indexes the whole value. TTLs are not
supported (`supports_ttl` is False, as in LangGraph's base class). `abatch` runs `batch` in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from librefang_client import LibreFang
from librefang_client import models as m

TAG = "langgraph"
PAGE = 200  # the memory API's largest page
OPERATORS = {
    "$eq": lambda a, b: a == b, "$ne": lambda a, b: a != b,
    "$gt": lambda a, b: float(a) > float(b), "$gte": lambda a, b: float(a) >= float(b),
    "$lt": lambda a, b: float(a) < float(b), "$lte": lambda a, b: float(a) <= float(b),
}


def as_json(labels: list[str]) -> str:
    return json.dumps(labels, ensure_ascii=False, separators=(",", ":"))


def memory_key(namespace: tuple[str, ...], key: str) -> str:
    return as_json([*namespace, key])


def namespace_metadata(namespace: tuple[str, ...]) -> dict[str, Any]:
    labels = {f"lg_ns{n}": label for n, label in enumerate(namespace)}
    return {"lg_namespace": as_json(list(namespace)), **labels}


def matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: operators, nested objects, lists element by element, else equality."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            try:
                return all(OPERATORS[op](value, operand) for op, operand in wanted.items())
            except KeyError as exc:
                raise ValueError(f"unsupported filter operator: {exc.args[0]}") from None
            except (TypeError, ValueError):  # a comparison with a value that is not a number
                return False
        return isinstance(value, dict) and all(matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return isinstance(value, (list, tuple)) and len(value) == len(wanted) and all(
            matches(a, b) for a, b in zip(value, wanted, strict=True))
    return value == wanted


def namespace_matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = condition.path
    if len(namespace) < len(path):
        return False
    if condition.match_type == "suffix":
        namespace, path = namespace[::-1], path[::-1]
    return all(p == "*" or label == p for label, p in zip(namespace, path, strict=False))


def as_item(memory: m.MemoryOut, *, search: bool = False) -> Item:
    *namespace, key = json.loads(memory.key or "[]")
    fields = {"namespace": tuple(namespace), "key": key, "value": json.loads(memory.content),
              "created_at": datetime.fromisoformat(memory.created_at),
              "updated_at": datetime.fromisoformat(memory.updated_at)}
    return SearchItem(**fields, score=memory.score) if search else Item(**fields)


class LibreFangStore(BaseStore):
    """A LangGraph `BaseStore` whose items are this service's memories of one agent."""

    def __init__(self, url: str | None = None, token: str | None = None, *, agent_id: str = "langgraph",
                 client: LibreFang | None = None):
        self.client = client or LibreFang(url, token)
        self.agent_id = agent_id

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [self._one(op) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    def _one(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            found = self._find(op.namespace, op.key)
            return as_item(found) if found else None
        if isinstance(op, PutOp):
            return self._put(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._namespaces(op)
        raise ValueError(f"unknown store operation: {type(op).__name__}")

    def _find(self, namespace: tuple[str, ...], key: str) -> m.MemoryOut | None:
        page = self.client.memories.list(self.agent_id, key=memory_key(namespace, key), tags=[TAG], limit=1)
        return page.items[0] if page.items else None

    def _put(self, op: PutOp) -> None:
        if op.value is None:  # LangGraph's delete
            found = self._find(op.namespace, op.key)
            if found:
                self.client.memories.delete(found.id)
            return
        self.client.memories.put(self.agent_id, memory_key(op.namespace, op.key),
                                 json.dumps(dict(op.value), ensure_ascii=False, default=str), tags=[TAG],
                                 metadata=namespace_metadata(op.namespace))

    def _memories(self, metadata: dict[str, Any] | None = None, q: str | None = None):
        """Every memory of the store (with these namespace labels, matching `q`), a page at a time."""
        cursor = None
        while True:
            page = self.client.memories.list(self.agent_id, tags=[TAG], metadata=metadata or None, q=q,
                                             limit=PAGE, cursor=cursor)
            yield from page.items
            cursor = page.next_cursor
            if not cursor:
                return

    def _search(self, op: SearchOp) -> list[SearchItem]:
        labels = {f"lg_ns{n}": label for n, label in enumerate(op.namespace_prefix)}
        found: list[SearchItem] = []
        for memory in self._memories(labels, op.query or None):
            item = as_item(memory, search=True)
            if matches(item.value, op.filter or {}):
                found.append(item)
            if len(found) >= op.offset + op.limit:
                break
        return found[op.offset:op.offset + op.limit]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        seen: set[tuple[str, ...]] = set()
        for memory in self._memories():
            namespace = tuple(json.loads(memory.metadata.get("lg_namespace", "[]")))
            if all(namespace_matches(namespace, c) for c in op.match_conditions or ()):
                seen.add(namespace[:op.max_depth] if op.max_depth is not None else namespace)
        return sorted(seen)[op.offset:op.offset + op.limit]
