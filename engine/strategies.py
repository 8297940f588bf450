"""How a chain of plugins answers each hook, declared in one table (as pluggy declares `firstresult` hooks).

- MERGE: every layer runs at once and their results are merged (ingest: each plugin's memories after the default
  engine's recall, ordered by `plugin_stack_weights`).
- FIRST_USABLE: layers run in chain order and the first usable reply wins (`accept` judges it); none: the default
  engine answers.
- ALL: every layer runs (at once or in order), failures are logged and the chain goes on; `on_reply` says what the
  engine does with each successful reply.

The engine that follows this table is engine/stack.py; per-hook differences from LibreFang are in
docs/compatibility.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine import hooks as H
from engine import replies as R
from engine.ports import Summarizer

MERGE = "merge"
FIRST_USABLE = "first_usable"
ALL = "all"

AFTER_TURN_REPLY = "after_turn"  # store memories, log, forward events to the other layers' on_event
BOOTSTRAP_REPLY = "bootstrap"  # keep env_overrides / ingest_filter / allow_network for later calls


@dataclass(frozen=True)
class Strategy:
    mode: str  # MERGE, FIRST_USABLE or ALL
    concurrent: bool = False  # layers run at the same time (deadline: the slowest), else in order (deadline: the sum)
    abortable: bool = False  # on_hook_failure = "abort" turns a layer's failure into an error for the agent
    agent_filtered: bool = False  # only_for_agent_ids applies
    cache_ttl_field: str | None = None  # the [hooks] setting of the reply cache's time to live
    accept: Callable[[dict, Callable[[], Summarizer | None]], R.Accept] | None = None  # FIRST_USABLE
    unusable_is_failure: bool = True  # FIRST_USABLE: an unusable reply is that layer's failure (else a pass)
    on_reply: str | None = None  # ALL: AFTER_TURN_REPLY or BOOTSTRAP_REPLY


# LibreFang: bootstrap ignores abort (`let _ =`) and after_turn is fire-and-forget; ingest, assemble, compact,
# after_turn and transform_tool_result carry an agent id and honour only_for_agent_ids.
STRATEGIES: dict[str, Strategy] = {
    H.INGEST: Strategy(MERGE, concurrent=True, abortable=True, agent_filtered=True,
                       cache_ttl_field="hook_cache_ttl_secs"),
    H.ASSEMBLE: Strategy(FIRST_USABLE, abortable=True, agent_filtered=True, cache_ttl_field="assemble_cache_ttl_secs",
                         accept=R.accept_assemble),
    H.COMPACT: Strategy(FIRST_USABLE, abortable=True, agent_filtered=True, cache_ttl_field="compact_cache_ttl_secs",
                        accept=R.accept_compact),
    H.TRANSFORM_TOOL_RESULT: Strategy(FIRST_USABLE, abortable=True, agent_filtered=True,
                                      accept=R.accept_transform, unusable_is_failure=False),
    H.AFTER_TURN: Strategy(ALL, concurrent=True, agent_filtered=True, on_reply=AFTER_TURN_REPLY),
    H.BOOTSTRAP: Strategy(ALL, on_reply=BOOTSTRAP_REPLY),
    H.PREPARE_SUBAGENT: Strategy(ALL, abortable=True),
    H.MERGE_SUBAGENT: Strategy(ALL, abortable=True),
    H.ON_EVENT: Strategy(ALL),
}
assert set(STRATEGIES) == set(H.ALL_HOOKS), "every hook needs a strategy"
