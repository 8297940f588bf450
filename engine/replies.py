"""What the engine takes from a plugin's reply: the memories of an ingest reply, the messages of an assemble or
compact reply, and whether an assemble/compact/transform reply is usable at all (`accept_*`: reply -> (result,
problem, warnings); result None means not usable, problem says why when that counts as the layer's failure)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from engine import default_engine as D
from engine.overrides import restore_pinned
from engine.ports import MemoryStore, Summarizer

log = logging.getLogger("librefang.engine")

Accept = Callable[[Any], tuple[dict | None, str | None, list[str]]]


def memories_from(reply: Any, scope: str = "hook") -> list[dict]:
    """`{"memories":[{"content": str, ...}]}`; `type` is never required. Other keys of an entry pass through."""
    if not isinstance(reply, dict) or not isinstance(reply.get("memories"), list):
        return []
    out = []
    for m in reply["memories"]:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            out.append({**m, "scope": scope})
    return out


def messages_from(reply: Any) -> list[dict]:
    if not isinstance(reply, dict):
        return []
    msgs = reply.get("messages")
    if not isinstance(msgs, list):
        return []
    return [m for m in msgs if isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), (str, list))]


def accept_assemble(req: dict, summarizer: Callable[[], Summarizer | None]) -> Accept:
    def accept(reply):
        msgs = messages_from(reply)
        if not msgs:
            return None, "assemble returned no usable messages", []
        restored, warnings = restore_pinned(req["messages"], msgs)
        return {"type": "assemble_result", "messages": restored, "recovery_stage": "none"}, None, warnings
    return accept


def accept_compact(req: dict, summarizer: Callable[[], Summarizer | None]) -> Accept:
    llm = summarizer()

    def accept(reply):
        if not isinstance(reply, dict):
            return None, "compact returned no usable result", []
        via_llm = llm_summary(req, reply, llm)
        if via_llm is not None:
            return via_llm
        msgs = messages_from(reply)
        if not msgs:
            return None, "compact returned no usable messages", []
        restored, warnings = restore_pinned(req["messages"], msgs)
        summary = reply.get("summary") if isinstance(reply.get("summary"), str) and reply.get("summary") \
            else "plugin compaction"
        return ({"type": "compact_result", "messages": restored, "summary": summary,
                 "compacted_count": max(0, len(req["messages"]) - len(msgs)), "used_fallback": False},
                None, warnings)
    return accept


def llm_summary(req: dict, reply: dict, summarizer: Summarizer | None):
    """`request_llm_summary`: the host's LLM summarises `summarize`; `keep` stays verbatim. None: not usable."""
    directive = reply.get("request_llm_summary")
    if not isinstance(directive, dict):
        return None
    summarize = [m for m in (directive.get("summarize") or []) if isinstance(m, dict)]
    keep = messages_from({"messages": directive.get("keep") or []})
    if not summarize or summarizer is None:
        return None
    max_tokens = directive.get("max_tokens") if isinstance(directive.get("max_tokens"), int) else 2048
    prompt = directive.get("prompt") if isinstance(directive.get("prompt"), str) else None
    try:
        summary = summarizer.summarize(D.render_for_summary(summarize), max_tokens, prompt).strip()
    except Exception as exc:
        log.warning("request_llm_summary: the LLM call failed: %s", exc)
        return None
    if not summary:
        return None
    restored, warnings = restore_pinned(req["messages"], keep)
    return ({"type": "compact_result", "messages": restored, "summary": summary,
             "compacted_count": len(summarize), "used_fallback": False}, None, warnings)


def accept_transform(req: dict, summarizer: Callable[[], Summarizer | None]) -> Accept:
    def accept(reply):
        if not isinstance(reply, dict) or reply.get("type") == "skip":
            return None, None, []
        new = reply.get("result") if reply.get("type") == "transformed" and "result" in reply \
            else reply.get("content")
        if new is None:
            return None, None, []  # no change, still a success (LibreFang)
        if not isinstance(new, str):
            new = json.dumps(new, ensure_ascii=False)
        return {"type": "transformed", "content": new, "result": new}, None, []
    return accept


def apply_after_turn_reply(plugin: str, reply: dict, req: dict, memory: MemoryStore,
                           forward: Callable[[dict], None] | None) -> int:
    """after_turn replies may carry memories (stored; their number is returned), log (logged), annotations (on the
    trace, engine/invoke.py) and events (each handed to `forward` as an on_event request, when given)."""
    stored = 0
    memories = reply.get("memories")
    for m in memories if isinstance(memories, list) else []:
        if isinstance(m, dict) and isinstance(m.get("content"), str) and m["content"].strip():
            tags = [str(t) for t in (m.get("tags") or []) if isinstance(t, str | int | float)][:16] \
                if isinstance(m.get("tags"), list) else []
            extra = D.session_of(req)
            if isinstance(m.get("metadata"), dict):
                extra["metadata"] = m["metadata"]
            try:
                memory.remember(str(req.get("agent_id") or ""), req.get("peer_id"), m["content"],
                                scope=",".join(tags) or "hook", tags=tags, source=plugin, **extra)
                stored += 1
            except Exception:
                log.warning("storing a memory from %s failed", plugin, exc_info=True)
    if isinstance(reply.get("log"), str):
        log.info("after_turn log from %s: %s", plugin, reply["log"][:512])
    events = reply.get("events")
    if isinstance(events, list) and forward is not None:
        for ev in events:
            if isinstance(ev, dict) and isinstance(ev.get("name"), str):
                forward({"event": {"name": ev["name"], "payload": ev.get("payload"), "source_plugin": plugin}})
    return stored
