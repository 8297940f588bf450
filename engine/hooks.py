"""The hook names of the LibreFang context-engine protocol and which of them block an agent's turn."""

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
