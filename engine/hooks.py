"""The hook names of the LibreFang context-engine protocol, which of them block an agent's turn, and how long one
layer may take (`timeout_for`)."""

from __future__ import annotations

from typing import Any

INGEST = "ingest"
ASSEMBLE = "assemble"
COMPACT = "compact"
AFTER_TURN = "after_turn"
BOOTSTRAP = "bootstrap"
PREPARE_SUBAGENT = "prepare_subagent"
MERGE_SUBAGENT = "merge_subagent"
TRANSFORM_TOOL_RESULT = "transform_tool_result"
ON_EVENT = "on_event"

ALL_HOOKS: tuple[str, ...] = (
    INGEST,
    AFTER_TURN,
    ASSEMBLE,
    COMPACT,
    BOOTSTRAP,
    PREPARE_SUBAGENT,
    MERGE_SUBAGENT,
    TRANSFORM_TOOL_RESULT,
    ON_EVENT,
)

# Hooks an agent waits on; after_turn and on_event are fire-and-forget.
BLOCKING_HOOKS = frozenset(ALL_HOOKS) - {AFTER_TURN, ON_EVENT}
FIRE_AND_FORGET_HOOKS = frozenset({AFTER_TURN, ON_EVENT})


def is_hook(name: str) -> bool:
    return name in ALL_HOOKS


DEFAULT_TIMEOUT_SECS = 30.0  # a plugin's hook_timeout_secs when it sets none
# bootstrap gets twice the plugin's hook timeout (what the scaffold tells plugin authors, engine/plugins/scaffold.py).
TIMEOUT_FACTOR = {BOOTSTRAP: 2}


def timeout_for(hook: str, settings: Any = None) -> float:
    """The time one attempt of `hook` may take: the plugin's `hook_timeout_secs` (its [hooks] settings; None: the
    default), doubled for bootstrap. The one place this rule is written."""
    base = settings.hook_timeout_secs if settings is not None else DEFAULT_TIMEOUT_SECS
    return base * TIMEOUT_FACTOR.get(hook, 1)


def retry_delay_ms(base_ms: int, attempt: int, cap_ms: int = 30_000) -> float:
    """Delay before retry number `attempt` (1-based): base, 2x base, 4x base ... capped (exponential backoff)."""
    return min(base_ms * (2 ** (attempt - 1)), cap_ms)
