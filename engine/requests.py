"""What a plugin receives for each hook: the agent's request normalised by its hook's model
(engine/hook_requests.py, where each hook's shape and its normalisation are defined once)."""

from __future__ import annotations

from typing import Any

from engine.hook_requests import DEFAULT_AFTER_TURN_MAX_CHARS, Normalising, for_plugin, truncate_message

__all__ = ["DEFAULT_AFTER_TURN_MAX_CHARS", "normalise", "truncate_message"]


def normalise(hook: str, request: dict[str, Any], *, after_turn_max_chars: int | None = None,
              context_window_tokens: int = 200_000) -> dict[str, Any]:
    """The request exactly as a plugin receives it. Unknown extra fields from the agent are passed through."""
    return for_plugin(hook, request, Normalising(context_window_tokens, after_turn_max_chars))
