"""The built-in context engine: used when no plugin is configured and as every fallback."""

from __future__ import annotations

import json
import logging
from typing import Any

from engine.ports import MemoryStore, Summarizer

log = logging.getLogger("librefang.engine")

CHARS_PER_TOKEN = 4
TOOL_RESULT_TRUNCATE_CHARS = 2000


def session_of(request: dict) -> dict:
    """The request's session scope as the memory store's keyword (none when the agent gave none)."""
    session = request.get("session_id")
    return {"session_id": str(session)} if session else {}


def ingest(request: dict, memory: MemoryStore, max_recall_results: int = 5) -> dict:
    try:
        memories = memory.recall(str(request.get("agent_id") or ""), request.get("peer_id"),
                                 str(request.get("message") or ""), max_recall_results, **session_of(request))
    except Exception:  # recall trouble must never cost the agent its turn
        memories = []
    fallback = getattr(memories, "fallback", None)  # engine.ports.Recalled: why recall was by text alone
    if fallback:
        return {"type": "ingest_result", "memories": list(memories),
                "warnings": [f"recalled by text alone: {fallback}"]}
    return {"type": "ingest_result", "memories": list(memories)}


INTERACTION_MAX_CHARS = 2000


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return " ".join(str(b.get("text", "")).strip() for b in content
                        if isinstance(b, dict) and b.get("type") == "text" and b.get("text")).strip()
    return ""


def interaction_text(messages: list[dict], max_chars: int = INTERACTION_MAX_CHARS) -> str:
    """The turn as one memory: the last user message and the assistant's text after it ("" when there is none).
    Tool calls and results are left out: they are bulky and the assistant's answer says what came of them."""
    msgs = [m for m in messages if isinstance(m, dict)]
    last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user" and _text_of(m)), default=None)
    if last_user is None:
        return ""
    said = _text_of(msgs[last_user])
    answer = " ".join(t for t in (_text_of(m) for m in msgs[last_user + 1:] if m.get("role") == "assistant") if t)
    text = f"User: {said}" + (f"\nAssistant: {answer}" if answer else "")
    return text[:max_chars]


def after_turn(request: dict, memory: MemoryStore) -> dict:
    """LibreFang's agent loop remembers every interaction in its memory substrate at the end of a turn
    (`remember_interaction`, before any after_turn hook runs), so the default recall finds earlier turns. Here the
    turn is stored in the memory store; a failing store never costs the turn."""
    text = interaction_text(request.get("messages") or [])
    if not text:
        return {"type": "ok", "memories_stored": 0}
    try:
        memory.remember(str(request.get("agent_id") or ""), request.get("peer_id"), text, scope="interaction",
                        source="default", **session_of(request))
    except Exception:
        log.warning("remembering the turn of agent %r failed", request.get("agent_id"), exc_info=True)
        return {"type": "ok", "memories_stored": 0}
    return {"type": "ok", "memories_stored": 1}


def estimate_tokens(messages: list[dict], system_prompt: str = "") -> int:
    chars = len(system_prompt)
    for m in messages:
        content = m.get("content")
        chars += len(content) if isinstance(content, str) else len(json.dumps(content, ensure_ascii=False))
    return chars // CHARS_PER_TOKEN + 1


def _tool_use_ids(message: dict) -> set[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return set()
    return {b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id")}


def _tool_result_ids(message: dict) -> set[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return set()
    return {b.get("tool_use_id") for b in content
            if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id")}


def _keep_last_unpinned(messages: list[dict], keep: int) -> list[dict]:
    """Keep pinned messages and the last `keep` unpinned ones, without splitting a tool_use from its result."""
    unpinned = [i for i, m in enumerate(messages) if not m.get("pinned")]
    kept = set(unpinned[-keep:]) if keep > 0 else set()
    kept |= {i for i, m in enumerate(messages) if m.get("pinned")}
    changed = True
    while changed:  # pull in partners of kept halves of tool pairs
        changed = False
        uses = {tid: i for i, m in enumerate(messages) for tid in _tool_use_ids(m)}
        for i in sorted(kept):
            for tid in _tool_result_ids(messages[i]):
                j = uses.get(tid)
                if j is not None and j not in kept:
                    kept.add(j)
                    changed = True
    return [m for i, m in enumerate(messages) if i in kept]


def _drop_orphan_results(messages: list[dict]) -> list[dict]:
    present = set().union(*(_tool_use_ids(m) for m in messages)) if messages else set()
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and _tool_result_ids(m) - present:
            blocks = [b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_result"
                                                 and b.get("tool_use_id") not in present)]
            if not blocks:
                continue
            m = {**m, "content": blocks}
        out.append(m)
    return out


def _truncate_tool_results(messages: list[dict], limit: int) -> list[dict]:
    out = []
    last = len(messages) - 1
    for idx, m in enumerate(messages):
        content = m.get("content")
        if idx != last and isinstance(content, list):
            blocks = []
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_result" and isinstance(b.get("content"), str) \
                        and len(b["content"]) > limit:
                    b = {**b, "content": b["content"][:limit] + f"\n…[truncated {len(b['content']) - limit} chars]"}
                blocks.append(b)
            m = {**m, "content": blocks}
        out.append(m)
    return out


def assemble(request: dict) -> dict:
    """LibreFang's overflow cascade: nothing below 70 % of the window; keep last 10 unpinned, then 4; truncate old
    tool results to 2 K chars. tool_use/tool_result pairs stay intact; pinned messages are never dropped."""
    messages = [m for m in (request.get("messages") or []) if isinstance(m, dict)]
    window = int(request.get("context_window_tokens") or 200_000)
    system_prompt = str(request.get("system_prompt") or "")
    budget = window * 0.70
    stage = "none"
    if estimate_tokens(messages, system_prompt) > budget:
        for keep, name in ((10, "auto_compaction"), (4, "overflow_compaction")):
            messages = _drop_orphan_results(_keep_last_unpinned(messages, keep))
            stage = name
            if estimate_tokens(messages, system_prompt) <= budget:
                break
        else:
            messages = _truncate_tool_results(messages, TOOL_RESULT_TRUNCATE_CHARS)
            stage = "tool_result_truncation"
            if estimate_tokens(messages, system_prompt) > budget:
                stage = "final_error"
    return {"type": "assemble_result", "messages": messages, "recovery_stage": stage}


def should_compress(used_tokens: int, window: int) -> bool:
    return window > 0 and used_tokens >= 0.8 * window


def token_pressure(messages: list[dict], window: int) -> dict:
    max_tokens = window or 100_000
    used = estimate_tokens(messages)
    pressure = min(1.0, used / max_tokens)
    rec = "critical" if pressure >= 0.9 else "aggressive" if pressure >= 0.8 else "moderate" if pressure >= 0.6 \
        else "light"
    return {"used_tokens": used, "max_tokens": max_tokens, "pressure": round(pressure, 4), "recommendation": rec}


def render_for_summary(messages: list[dict]) -> str:
    lines = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for b in content:
                if not isinstance(b, dict):
                    continue
                kind = b.get("type")
                if kind == "text":
                    parts.append(str(b.get("text", "")))
                elif kind == "tool_use":
                    parts.append(f"[tool_use {b.get('name')}: {json.dumps(b.get('input'), ensure_ascii=False)[:300]}]")
                elif kind == "tool_result":
                    parts.append(f"[tool_result: {str(b.get('content'))[:300]}]")
            content = " ".join(parts)
        lines.append(f"{m.get('role', 'user')}: {content}")
    return "\n".join(lines)


def compact(request: dict, summarizer: Summarizer | None = None, keep_recent: int = 10) -> dict:
    """Summarise all but the last `keep_recent` unpinned messages: by the LLM when configured, else extractively."""
    messages = [m for m in (request.get("messages") or []) if isinstance(m, dict)]
    kept = _drop_orphan_results(_keep_last_unpinned(messages, keep_recent))
    kept_ids = {id(m) for m in kept}
    removed = [m for m in messages if id(m) not in kept_ids]
    summary, used_fallback = "", True
    if removed and summarizer is not None:
        try:
            summary = llm_summary(removed, summarizer)
            used_fallback = not summary
        except Exception:
            summary = ""
    if removed and not summary:
        summary = extractive_summary(removed)
    return {"type": "compact_result", "messages": kept, "summary": summary,
            "compacted_count": len(removed), "used_fallback": used_fallback}


MAX_CHUNK_CHARS = 80_000  # LibreFang's compactor default
MAX_SUMMARY_TOKENS = 1024


def llm_summary(messages: list[dict], summarizer: Summarizer, max_chunk_chars: int = MAX_CHUNK_CHARS) -> str:
    """One LLM call when the rendered messages fit in a chunk; otherwise a summary per chunk, then one merge call
    (LibreFang's adaptive chunked stage). Raises whatever the endpoint raises; "" when it answers nothing."""
    text = render_for_summary(messages)
    if len(text) <= max_chunk_chars:
        return summarizer.summarize(text, MAX_SUMMARY_TOKENS).strip()
    chunks: list[str] = []
    current = ""
    for line in text.split("\n"):
        while len(line) > max_chunk_chars:  # one enormous message: split it too
            if current:
                chunks.append(current)
                current = ""
            chunks.append(line[:max_chunk_chars])
            line = line[max_chunk_chars:]
        if current and len(current) + 1 + len(line) > max_chunk_chars:
            chunks.append(current)
            current = line
        else:
            current = f"{current}\n{line}" if current else line
    if current:
        chunks.append(current)
    parts = [summarizer.summarize(chunk, MAX_SUMMARY_TOKENS).strip() for chunk in chunks]
    parts = [p for p in parts if p]
    if not parts:
        return ""
    merged = "\n\n".join(f"Part {i + 1}: {p}" for i, p in enumerate(parts))
    if len(merged) > max_chunk_chars:
        return merged[:max_chunk_chars]
    return summarizer.summarize(merged, MAX_SUMMARY_TOKENS,
                                "Merge these partial summaries of one conversation into a single summary. "
                                "Keep facts, decisions, open tasks and names.").strip() or merged


def extractive_summary(messages: list[dict], max_chars: int = 1500) -> str:
    """Deterministic: the first sentence of each removed message, role-labelled, capped."""
    out: list[str] = []
    for line in render_for_summary(messages).splitlines():
        first = line.split(". ")[0].strip()
        if first:
            out.append(first[:200])
    text = " | ".join(out)
    return text[:max_chars]


def ok() -> dict[str, Any]:
    return {"type": "ok"}
