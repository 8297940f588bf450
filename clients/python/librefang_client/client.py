"""`LibreFang` (sync) and `AsyncLibreFang` (async): the hooks and the memory API as typed calls.

Both build the same `Call`s (`_Api`, `Memories`) and differ only in how they send them and wait between tries.
Each call takes `deadline=` (seconds, every retry included; the client's default otherwise).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel

from librefang_client import models as m
from librefang_client._core import Attempts, Call, Deadline, RetryPolicy, outcome, settings

HOOKS = "/api/context-engine/hooks/"
UNSET: Any = None  # a keyword left out is not sent (the service's default applies)


def hook_call(hook: str, fields: dict[str, Any], extra: dict[str, Any]) -> Call:
    """A hook call with its request checked against the hook's model; only what the caller gave is sent."""
    given = {k: v for k, v in fields.items() if v is not None}
    given.update(extra)
    body = m.HOOK_REQUESTS[hook].model_validate(given).model_dump(mode="json", exclude_unset=True)
    # on_event: an event may not be idempotent for a plugin, so it is only re-sent when it never left
    return Call("POST", HOOKS + hook, m.HOOK_REPLIES[hook], json=body, retry_safe=hook != "on_event")


def _messages(messages: Sequence[dict[str, Any] | BaseModel]) -> list[Any]:
    return [x.model_dump(mode="json", exclude_unset=True) if isinstance(x, BaseModel) else x for x in messages]


class Memories:
    """The memory API (`/api/memories`): what an agent remembers, scoped by agent, peer and session."""

    def __init__(self, run):
        self._run = run

    def add(self, agent_id: str, content: str, *, deadline: float | None = None, **fields: Any):
        """A new memory (`peer_id`, `session_id`, `key`, `tags`, `metadata`, `expires_at`); a `key` already used
        in the scope is a Conflict. Not retried once sent (a second POST would make a second memory)."""
        body = m.MemoryIn(agent_id=agent_id, content=content, **fields).model_dump(mode="json", exclude_unset=True)
        return self._run(Call("POST", "/api/memories", m.MemoryOut, json=body, retry_safe=False), deadline)

    def put(self, agent_id: str, key: str, content: str, *, deadline: float | None = None, **fields: Any):
        """The memory with this key in this scope, replaced or made."""
        body = m.MemoryPutIn(agent_id=agent_id, key=key, content=content, **fields).model_dump(
            mode="json", exclude_unset=True)
        return self._run(Call("PUT", "/api/memories", m.MemoryOut, json=body), deadline)

    def get(self, memory_id: int, *, deadline: float | None = None):
        return self._run(Call("GET", f"/api/memories/{int(memory_id)}", m.MemoryOut), deadline)

    def update(self, memory_id: int, *, deadline: float | None = None, **changes: Any):
        """`content`, `tags`, `metadata`, `expires_at`: the fields given replace the memory's."""
        body = m.MemoryPatchIn(**changes).model_dump(mode="json", exclude_unset=True)
        return self._run(Call("PATCH", f"/api/memories/{int(memory_id)}", m.MemoryOut, json=body, retry_safe=False),
                         deadline)

    def list(self, agent_id: str, *, deadline: float | None = None, tags: Sequence[str] = (),
             metadata: dict[str, Any] | None = None, **query: Any):
        """A page of memories, newest first (`order="oldest"`); with `q`, ranked with a `score`. Filters:
        `peer_id`, `session_id`, `include_shared`, `key`, `tags` (every one), `metadata` (top-level values).
        Pages: `limit`, and `cursor=` the previous page's `next_cursor`."""
        params = [("agent_id", agent_id), *(("tags", t) for t in tags)]
        if metadata is not None:
            params.append(("metadata", json.dumps(metadata)))
        for name, value in query.items():
            if value is not None:
                params.append((name, str(value).lower() if isinstance(value, bool) else str(value)))
        return self._run(Call("GET", "/api/memories", m.MemoryListOut, params=params), deadline)

    def delete(self, memory_id: int, *, deadline: float | None = None):
        return self._run(Call("DELETE", f"/api/memories/{int(memory_id)}", m.MemoryDeleteOut), deadline)

    def delete_scope(self, agent_id: str, *, peer_id: str | None = None, session_id: str | None = None,
                     deadline: float | None = None):
        """Forget everything the agent remembers, or only about one peer and/or in one session."""
        params = [(k, v) for k, v in (("agent_id", agent_id), ("peer_id", peer_id), ("session_id", session_id)) if v]
        return self._run(Call("DELETE", "/api/memories", m.MemoryDeleteOut, params=params), deadline)

    def scopes(self, agent_id: str, *, deadline: float | None = None):
        """The peers and sessions the agent has memories for, with how many in each."""
        return self._run(Call("GET", "/api/memories/scopes", m.MemoryScopesOut, params=[("agent_id", agent_id)]),
                         deadline)


class _Api:
    """The calls; `_run(call, deadline)` is the sync or async client's. Extra keywords are sent as they are (the
    service passes unknown fields on to plugins)."""

    def __init__(self, url: str | None, token: str | None, timeout: float | None, deadline: float | None,
                 retry: RetryPolicy | None):
        self.url, self.token = settings(url, token)
        self.timeout = timeout
        self.deadline = deadline
        self.retry = retry or RetryPolicy()
        self.memories = Memories(self._run)

    def _run(self, call: Call, deadline: float | None):
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}

    def _attempts(self, call: Call, deadline: float | None) -> Attempts:
        return Attempts(call, self.retry, Deadline(self.deadline if deadline is None else deadline))

    def ingest(self, agent_id: str, message: str, *, peer_id: str | None = UNSET, session_id: str | None = UNSET,
               deadline: float | None = None, **extra: Any):
        """The memories to recall for the user's message (IngestReply.memories)."""
        return self._run(hook_call("ingest", {"agent_id": agent_id, "message": message, "peer_id": peer_id,
                                              "session_id": session_id}, extra), deadline)

    def assemble(self, messages: Sequence[Any], *, agent_id: str = UNSET, system_prompt: str = UNSET,
                 context_window_tokens: int = UNSET, dialect: str = UNSET, deadline: float | None = None,
                 **extra: Any):
        """The messages to send to the model, fitted to the context window, in the dialect sent."""
        return self._run(hook_call("assemble", {"messages": _messages(messages), "agent_id": agent_id,
                                                "system_prompt": system_prompt, "dialect": dialect,
                                                "context_window_tokens": context_window_tokens}, extra), deadline)

    def compact(self, messages: Sequence[Any], *, agent_id: str = UNSET, context_window_tokens: int = UNSET,
                model: str = UNSET, dialect: str = UNSET, deadline: float | None = None, **extra: Any):
        """A shorter history (a summary in place of older messages), in the dialect sent."""
        return self._run(hook_call("compact", {"messages": _messages(messages), "agent_id": agent_id,
                                               "context_window_tokens": context_window_tokens, "model": model,
                                               "dialect": dialect}, extra), deadline)

    def after_turn(self, agent_id: str, messages: Sequence[Any], *, peer_id: str | None = UNSET,
                   session_id: str | None = UNSET, dialect: str = UNSET, deadline: float | None = None,
                   **extra: Any):
        """Store the turn (the default engine remembers it); accepted once stored, processed at least once.
        Retried through a 503 (the service's job bus down) until stored or the deadline passes."""
        return self._run(hook_call("after_turn", {"agent_id": agent_id, "messages": _messages(messages),
                                                  "peer_id": peer_id, "session_id": session_id,
                                                  "dialect": dialect}, extra), deadline)

    def bootstrap(self, *, deadline: float | None = None, **fields: Any):
        return self._run(hook_call("bootstrap", {}, fields), deadline)

    def prepare_subagent(self, parent_id: str, child_id: str, messages: Sequence[Any] | None = None, *,
                         deadline: float | None = None, **extra: Any):
        return self._run(hook_call("prepare_subagent", {"parent_id": parent_id, "child_id": child_id, "messages":
                                                        None if messages is None else _messages(messages)}, extra),
                         deadline)

    def merge_subagent(self, parent_id: str, child_id: str, messages: Sequence[Any] | None = None, *,
                       deadline: float | None = None, **extra: Any):
        return self._run(hook_call("merge_subagent", {"parent_id": parent_id, "child_id": child_id, "messages":
                                                      None if messages is None else _messages(messages)}, extra),
                         deadline)

    def transform_tool_result(self, tool_name: str, content: str, *, agent_id: str = UNSET,
                              deadline: float | None = None, **extra: Any):
        return self._run(hook_call("transform_tool_result", {"tool_name": tool_name, "content": content,
                                                             "agent_id": agent_id}, extra), deadline)

    def on_event(self, event: dict[str, Any], *, deadline: float | None = None):
        return self._run(hook_call("on_event", {"event": event}, {}), deadline)


class LibreFang(_Api):
    """The synchronous client. `url`/`token` default to LIBREFANG_URL (else http://127.0.0.1:4545) and
    LIBREFANG_TOKEN; `timeout` bounds each attempt, `deadline` each call (retries included)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float | None = 30.0,
                 deadline: float | None = 60.0, retry: RetryPolicy | None = None,
                 http: httpx.Client | None = None):
        super().__init__(url, token, timeout, deadline, retry)
        self._http = http or httpx.Client()
        self._owns_http = http is None

    def _run(self, call: Call, deadline: float | None):
        attempts = self._attempts(call, deadline)
        while True:
            try:
                response = self._http.request(call.method, self.url + call.path, json=call.json,
                                              params=call.params or None, headers=self._headers(),
                                              timeout=attempts.timeout(self.timeout))
                return outcome(call, response)
            except Exception as failure:  # noqa: BLE001 (Attempts.after re-raises what is not retried)
                wait = attempts.after(failure)
            time.sleep(wait)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> LibreFang:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLibreFang(_Api):
    """The asyncio client: the same calls as `LibreFang`, awaited."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float | None = 30.0,
                 deadline: float | None = 60.0, retry: RetryPolicy | None = None,
                 http: httpx.AsyncClient | None = None):
        super().__init__(url, token, timeout, deadline, retry)
        self._http = http or httpx.AsyncClient()
        self._owns_http = http is None

    async def _run(self, call: Call, deadline: float | None):
        attempts = self._attempts(call, deadline)
        while True:
            try:
                response = await self._http.request(call.method, self.url + call.path, json=call.json,
                                                    params=call.params or None, headers=self._headers(),
                                                    timeout=attempts.timeout(self.timeout))
                return outcome(call, response)
            except Exception as failure:  # noqa: BLE001 (Attempts.after re-raises what is not retried)
                wait = attempts.after(failure)
            await asyncio.sleep(wait)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncLibreFang:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
