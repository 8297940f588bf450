"""Side effects the engine needs, as protocols. The Django side (plugins_app) implements them."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

# Who asked for the run under way in this thread (a worker sets "mcp" for a job queued over /mcp): new invocations
# take it as their origin.
CURRENT_ORIGIN: ContextVar[str] = ContextVar("invocation_origin", default="agent")


@dataclass
class Invocation:
    """One hook run (or fallback), as recorded for metrics and traces."""

    trace_id: str
    plugin: str
    hook: str
    agent_id: str
    started_at: float  # unix time
    elapsed_ms: float
    ok: bool
    error_kind: str | None = None
    error: str | None = None
    input_preview: str = ""
    output_preview: str = ""
    stderr_tail: str = ""
    job_id: str | None = None
    annotations: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    # "agent" or "mcp" (real traffic, counted alike) or "test_console" (counted apart on dashboards)
    origin: str = field(default_factory=CURRENT_ORIGIN.get)


AGENT = "agent"
MCP = "mcp"
TEST_CONSOLE = "test_console"


class Recalled(list):
    """What MemoryStore.recall may answer: the memories, and `fallback`, why recall was by text alone (the embedder
    failed or is off; None when vectors were used). Ingest passes it on as a warning (engine/default_engine.py)."""

    def __init__(self, memories=(), fallback: str | None = None):
        super().__init__(memories)
        self.fallback = fallback


class MemoryStore(Protocol):
    """The default engine's memories. `session_id` (and `metadata`) are passed only when the agent gave them."""

    def remember(self, agent_id: str, peer_id: str | None, content: str, scope: str = "hook",
                 tags: list[str] | None = None, source: str = "", *, session_id: str | None = None,
                 metadata: dict[str, Any] | None = None) -> None: ...

    def recall(self, agent_id: str, peer_id: str | None, query: str, limit: int,
               session_id: str | None = None) -> list[dict[str, Any]]: ...


class InvocationSink(Protocol):
    """Receives every invocation: metrics and traces."""

    def record(self, invocation: Invocation) -> None: ...


class OriginSink:
    """Wraps a sink and stamps every invocation with an origin (e.g. test-console runs, kept out of agent stats)."""

    def __init__(self, sink: InvocationSink, origin: str) -> None:
        self.sink = sink
        self.origin = origin

    def record(self, invocation: Invocation) -> None:
        invocation.origin = self.origin
        self.sink.record(invocation)


class StderrSink(Protocol):
    """Receives each stderr line of a running hook, as it arrives."""

    def line(self, plugin: str, hook: str, line: str, trace_id: str) -> None: ...


class Summarizer(Protocol):
    """An LLM endpoint that turns role-labelled text into a summary; None when none is configured."""

    def summarize(self, text: str, max_tokens: int, prompt: str | None = None) -> str: ...


Clock = Callable[[], float]


class NullMemory:
    def remember(self, *args: Any, **kwargs: Any) -> None:
        return None

    def recall(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return []


class NullInvocationSink:
    def record(self, invocation: Invocation) -> None:
        return None


class NullStderrSink:
    def line(self, plugin: str, hook: str, line: str, trace_id: str) -> None:
        return None
