"""Hermes Agent's `MemoryProvider` on this service: what Hermes learns in one session it recalls in the next.

- `prefetch` (before each turn) is `ingest`: the memories the service recalls for the user's message, as lines
  Hermes fences into the turn's user message (`<memory-context>`).
- `sync_turn` (after each turn, on Hermes's background worker) is `after_turn`: the user's message and the final
  answer, as OpenAI chat messages, for the agent, the peer (the gateway's user) and the session.
- Two tools: `librefang_recall` (the memory API's search) and `librefang_remember` (a memory the model chooses to
  keep; with a `key`, put by key).
Writes are skipped for Hermes's non-primary agents (subagents, cron, flush), as its interface asks. The service
unreachable (after the client's retries) costs a turn its recall or its remembering, logged as a warning, never
the turn.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agent.memory_provider import MemoryProvider

from librefang_client import LibreFang, LibreFangError
from librefang_client.adapters.hermes import settings as config

log = logging.getLogger("librefang_client.hermes")

PREFETCH_DEADLINE = 5.0  # Hermes waits 8 s for a provider's prefetch, then goes on without it
TOOL_DEADLINE = 10.0
MAX_RESULTS = 50
TAG = "hermes"

RECALL_SCHEMA = {
    "name": "librefang_recall",
    "description": ("Search what you remember about this user from earlier conversations (by meaning and words, "
                    "best first). Use it before answering anything that may depend on the user's preferences, "
                    "facts or past decisions."),
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "What to look for."},
        "limit": {"type": "integer", "description": f"Most results (default 5, at most {MAX_RESULTS})."},
    }, "required": ["query"]},
}
REMEMBER_SCHEMA = {
    "name": "librefang_remember",
    "description": ("Keep a lasting fact about the user (a preference, a correction, a decision) for future "
                    "conversations, as written. With a key, it replaces what was kept under that key."),
    "parameters": {"type": "object", "properties": {
        "content": {"type": "string", "description": "The fact, in one or two sentences."},
        "key": {"type": "string", "description": "Optional stable name (e.g. 'diet'): replaces the earlier fact."},
    }, "required": ["content"]},
}


def recalled_lines(memories: list[Any], limit: int) -> str:
    return "\n".join(f"- {m.content}" for m in memories[:limit])


class LibreFangMemoryProvider(MemoryProvider):
    """`memory.provider: librefang` in Hermes's config.yaml. Settings: arguments, `$HERMES_HOME/librefang.json`,
    then LIBREFANG_URL / LIBREFANG_TOKEN / LIBREFANG_AGENT_ID / LIBREFANG_PEER_ID (settings.py)."""

    def __init__(self, *, url: str | None = None, token: str | None = None, agent_id: str | None = None,
                 peer_id: str | None = None, client: LibreFang | None = None):
        self._given = {"url": url, "token": token, "agent_id": agent_id, "peer_id": peer_id}
        self._client = client
        self._settings = config.Settings()
        self.agent_id = agent_id or "hermes"
        self.peer_id = peer_id
        self.session_id = ""
        self._writes = True

    @property
    def name(self) -> str:
        return "librefang"

    # ---- lifecycle ----

    def is_available(self) -> bool:
        """A token is configured (no network call, as Hermes asks). Hermes skips an unavailable provider with a
        debug line only, so the missing token is said here."""
        if self._client is not None or config.load(**self._given).token:
            return True
        log.warning("the LibreFang memory provider is off: no token (set LIBREFANG_TOKEN in the environment or "
                    "$HERMES_HOME/.env)")
        return False

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        self._settings = config.load(kwargs.get("hermes_home"), **self._given)
        self.agent_id = self._settings.agent_id
        self.peer_id = self._settings.peer_id or kwargs.get("user_id") or None
        self.session_id = session_id
        self._writes = kwargs.get("agent_context", "primary") == "primary"
        if self._client is None:
            self._client = LibreFang(self._settings.url, self._settings.token)

    def on_session_switch(self, new_session_id: str, **kwargs: Any) -> None:
        self.session_id = new_session_id

    def shutdown(self) -> None:
        if self._client is not None:
            self._client.close()

    def system_prompt_block(self) -> str:
        return ("# LibreFang memory\n"
                f"Active (agent {self.agent_id}). What you remember about the user from earlier conversations is "
                "recalled into each turn as memory context. Search it with librefang_recall; keep a lasting fact "
                "with librefang_remember.")

    # ---- recall and remembering ----

    def prefetch(self, query: str, *, session_id: str = "") -> str:
        """The service's recall for the user's message (ingest), from every session of this agent and peer."""
        if not query.strip() or self._client is None:
            return ""
        try:
            reply = self._client.ingest(self.agent_id, query, peer_id=self.peer_id, deadline=PREFETCH_DEADLINE)
        except LibreFangError as exc:
            log.warning("the service recalled nothing for this turn: %s", exc)
            return ""
        return recalled_lines(reply.memories, self._settings.recall_limit)

    def sync_turn(self, user_content: str, assistant_content: str, *, session_id: str = "",
                  messages: list[dict[str, Any]] | None = None) -> None:
        """The finished turn to after_turn (Hermes runs this on its background worker)."""
        if not self._writes or self._client is None:
            return
        turn = [{"role": "user", "content": user_content}, {"role": "assistant", "content": assistant_content}]
        try:
            self._client.after_turn(self.agent_id, turn, peer_id=self.peer_id,
                                    session_id=session_id or self.session_id or None, dialect="openai")
        except LibreFangError as exc:  # the turn itself went well: not remembering it must not fail it
            log.warning("the service did not store the turn of session %r: %s", session_id or self.session_id, exc)

    # ---- tools ----

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [RECALL_SCHEMA, REMEMBER_SCHEMA]

    def handle_tool_call(self, tool_name: str, args: dict[str, Any], **kwargs: Any) -> str:
        try:
            if tool_name == RECALL_SCHEMA["name"]:
                return json.dumps(self._recall(args), ensure_ascii=False)
            if tool_name == REMEMBER_SCHEMA["name"]:
                return json.dumps(self._remember(args), ensure_ascii=False)
            return json.dumps({"error": f"unknown tool {tool_name!r}"})
        except (LibreFangError, ValueError) as exc:
            return json.dumps({"error": str(exc)}, ensure_ascii=False)

    def _recall(self, args: dict[str, Any]) -> dict[str, Any]:
        query = str(args.get("query") or "").strip()
        if not query:
            raise ValueError("query is required")
        limit = max(1, min(int(args.get("limit") or 5), MAX_RESULTS))
        page = self._require_client().memories.list(self.agent_id, q=query, peer_id=self.peer_id, limit=limit,
                                                    deadline=TOOL_DEADLINE)
        return {"results": [{"id": m.id, "content": m.content, "score": m.score, "key": m.key,
                             "created_at": m.created_at} for m in page.items]}

    def _remember(self, args: dict[str, Any]) -> dict[str, Any]:
        content = str(args.get("content") or "").strip()
        if not content:
            raise ValueError("content is required")
        if not self._writes:
            raise ValueError("this agent does not write memories (a subagent, cron or flush run)")
        client, key = self._require_client(), (args.get("key") or "").strip()
        scope = {"peer_id": self.peer_id} if self.peer_id else {}
        if key:
            made = client.memories.put(self.agent_id, key, content, tags=[TAG], deadline=TOOL_DEADLINE, **scope)
        else:
            made = client.memories.add(self.agent_id, content, tags=[TAG], deadline=TOOL_DEADLINE, **scope)
        return {"stored": {"id": made.id, "content": made.content, "key": made.key}}

    def _require_client(self) -> LibreFang:
        if self._client is None:
            raise ValueError("the LibreFang memory provider was not initialised")
        return self._client

    # ---- `hermes memory setup` ----

    def get_config_schema(self) -> list[dict[str, Any]]:
        return [
            {"key": "url", "description": "The LibreFang service's URL", "default": "http://127.0.0.1:4545",
             "env_var": "LIBREFANG_URL"},
            {"key": "token", "description": "An agent token (librefang token create --role agent ...)",
             "secret": True, "required": True, "env_var": "LIBREFANG_TOKEN"},
            {"key": "agent_id", "description": "The agent id memories belong to", "default": "hermes"},
            {"key": "peer_id", "description": "The user memories are about (default: the gateway's user id)"},
        ]

    def save_config(self, values: dict[str, Any], hermes_home: str) -> None:
        config.save(values, hermes_home)
