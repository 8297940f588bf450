"""Valid sample requests per hook: the dashboard's pre-filled test console and the CLI's test-hook default."""

from __future__ import annotations

import copy

from engine import hooks as H

_MESSAGES = [
    {"role": "system", "content": "You are a helpful agent.", "pinned": True},
    {"role": "user", "content": "What did we decide about the release date?"},
    {"role": "assistant", "content": "We agreed to ship on Friday after the final review."},
    {"role": "user", "content": "Remember that the review moved to Thursday."},
]

EXAMPLES: dict[str, dict] = {
    H.INGEST: {"agent_id": "agent-1", "peer_id": "user-42", "message": "Remember that the review moved to Thursday."},
    H.ASSEMBLE: {"agent_id": "agent-1", "system_prompt": "You are a helpful agent.", "messages": _MESSAGES,
                 "context_window_tokens": 8000},
    H.COMPACT: {"agent_id": "agent-1", "messages": _MESSAGES, "model": "gpt-4o-mini", "context_window_tokens": 8000},
    H.AFTER_TURN: {"agent_id": "agent-1", "peer_id": "user-42", "messages": _MESSAGES},
    H.BOOTSTRAP: {"context_window_tokens": 200000, "stable_prefix_mode": False, "max_recall_results": 5},
    H.PREPARE_SUBAGENT: {"parent_id": "agent-1", "child_id": "agent-1-sub-1"},
    H.MERGE_SUBAGENT: {"parent_id": "agent-1", "child_id": "agent-1-sub-1"},
    H.TRANSFORM_TOOL_RESULT: {"agent_id": "agent-1", "tool_name": "web_fetch", "tool_use_id": "toolu_01",
                              "input": {"url": "https://example.com"}, "content": "<html>Example Domain</html>",
                              "is_error": False},
    H.ON_EVENT: {"event": {"name": "memory.saved", "payload": {"id": 1}, "source_plugin": "other-plugin"}},
}


def example_request(hook: str) -> dict:
    """A request that validates against the hook's schema. Raises KeyError for an unknown hook."""
    return copy.deepcopy(EXAMPLES[hook])
