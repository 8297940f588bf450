"""Hermes Agent's `ContextEngine` on this service: when the conversation nears the model's context window, the
service's `compact` shortens it.

- `should_compress(tokens)`: the prompt's tokens (Hermes's count) reached `threshold_percent` of the model's
  context window (0.75, Hermes's default).
- `compress(messages)`: the history Hermes holds (OpenAI chat messages: tool calls, tool results, Hermes's own
  keys) goes to `compact` with the model's window; the messages the service keeps come back exactly as they were,
  and its summary of the rest goes before them as a user message marked the way Hermes marks its own summaries.
  Leading system messages are kept out of the call and stay first. `focus_topic` (from `/compress <focus>`) and
  the memory provider's `memory_context` are passed on to the service's plugins.
- The service unreachable or refusing the history: the messages come back unchanged (Hermes then goes on without
  compaction), with a warning; compress never raises into Hermes's turn.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from agent.context_engine import ContextEngine

from librefang_client import LibreFang, LibreFangError
from librefang_client.adapters.hermes import settings as config

log = logging.getLogger("librefang_client.hermes")

SUMMARY_PREFIX = ("[Context compaction summary] Earlier turns of this conversation were summarised to fit the "
                  "context window; treat this as background, not as a new request. Summary of removed messages:\n")
SUMMARY_MARK = "_compressed_summary"  # Hermes's COMPRESSED_SUMMARY_METADATA_KEY; "_" keys never reach the model
DEFAULT_WINDOW = 200_000  # the compact hook's own default when Hermes has not said the model's window yet


class LibreFangContextEngine(ContextEngine):
    """`context.engine: librefang` in Hermes's config.yaml (registered by the `librefang` plugin)."""

    protect_first_n = 0  # the service decides what it keeps (pinned messages and the most recent ones)
    protect_last_n = 10  # the default engine keeps the last 10 messages

    def __init__(self, *, url: str | None = None, token: str | None = None, agent_id: str | None = None,
                 threshold_percent: float | None = None, client: LibreFang | None = None):
        self._settings = config.load(url=url, token=token, agent_id=agent_id, threshold_percent=threshold_percent)
        self._client = client
        self.agent_id = self._settings.agent_id
        self.threshold_percent = self._settings.threshold_percent
        self.model = ""

    @property
    def name(self) -> str:
        return "librefang"

    def __deepcopy__(self, memo: dict) -> LibreFangContextEngine:
        """Hermes deep-copies a plugin's engine for each agent: the copy keeps its own token counts and shares the
        (thread-safe) HTTP client."""
        return copy.copy(self)

    # ---- Hermes's token bookkeeping ----

    def update_from_response(self, usage: dict[str, Any]) -> None:
        self.last_prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.last_completion_tokens = int(usage.get("completion_tokens") or 0)
        self.last_total_tokens = int(usage.get("total_tokens") or self.last_prompt_tokens + self.last_completion_tokens)

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: str = "",
                     provider: str = "", api_mode: str = "") -> None:
        self.model = model
        super().update_model(model, context_length, base_url, api_key, provider, api_mode)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return self.threshold_tokens > 0 and tokens >= self.threshold_tokens

    # ---- compaction ----

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False,
                 memory_context: str = "") -> list[dict[str, Any]]:
        head = 0
        while head < len(messages) and messages[head].get("role") == "system":
            head += 1
        body = messages[head:]
        if not body:
            return messages
        extra = {k: v for k, v in (("focus_topic", focus_topic), ("memory_context", memory_context)) if v}
        try:
            client = self._require_client()
            reply = client.compact(body, agent_id=self.agent_id, model=self.model or None, dialect="openai",
                                   context_window_tokens=self.context_length or DEFAULT_WINDOW, **extra)
        except (LibreFangError, ValueError) as exc:  # Hermes goes on uncompacted; raising would fail its turn
            log.warning("the service did not compact the conversation: %s", exc)
            return messages
        kept = [m.model_dump(mode="json", exclude_unset=True) for m in reply.messages]
        if not reply.compacted_count or not kept:
            return messages  # nothing removed (or nothing left): Hermes sees no progress and carries on
        summary = [{"role": "user", "content": SUMMARY_PREFIX + reply.summary, SUMMARY_MARK: True}] \
            if reply.summary else []
        self.compression_count += 1
        return [*messages[:head], *summary, *kept]

    def _require_client(self) -> LibreFang:
        if self._client is None:  # made at the first compaction: without a token, that compaction says so
            self._client = LibreFang(self._settings.url, self._settings.token)
        return self._client
