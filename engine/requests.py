"""Hook request shapes: what each hook's stdin JSON looks like (docs' fields plus the real code's extras)."""

from __future__ import annotations

from typing import Any

from engine import hooks as H

DEFAULT_AFTER_TURN_MAX_CHARS = 500


def normalise(hook: str, request: dict[str, Any], *, after_turn_max_chars: int | None = None,
              context_window_tokens: int = 200_000) -> dict[str, Any]:
    """The request exactly as a plugin receives it. Unknown extra fields from the agent are passed through."""
    req = dict(request) if isinstance(request, dict) else {}
    if hook == H.ON_EVENT:
        return {"event": req.get("event", req)}
    req["type"] = hook
    if hook == H.INGEST:
        req["agent_id"] = _text(req.get("agent_id"))
        req["message"] = _text(req.get("message"))
        req.setdefault("peer_id", None)
    elif hook in (H.ASSEMBLE, H.COMPACT, H.AFTER_TURN):
        req.setdefault("agent_id", "")
        messages = req.get("messages")
        req["messages"] = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
        if hook != H.AFTER_TURN:
            req["context_window_tokens"] = _positive_int(req.get("context_window_tokens"), context_window_tokens)
        if hook == H.ASSEMBLE:
            req.setdefault("system_prompt", "")
        if hook == H.COMPACT:
            from engine.default_engine import token_pressure

            req.setdefault("model", "")
            req.setdefault("token_pressure", token_pressure(req["messages"], int(req["context_window_tokens"])))
        if hook == H.AFTER_TURN:
            limit = DEFAULT_AFTER_TURN_MAX_CHARS if after_turn_max_chars is None else after_turn_max_chars
            if limit:
                req["messages"] = [truncate_message(m, limit) for m in req["messages"]]
    elif hook == H.BOOTSTRAP:
        req["context_window_tokens"] = _positive_int(req.get("context_window_tokens"), context_window_tokens)
        req.setdefault("stable_prefix_mode", False)
        req.setdefault("max_recall_results", 5)
    elif hook in (H.PREPARE_SUBAGENT, H.MERGE_SUBAGENT):
        req.setdefault("parent_id", "")
        req.setdefault("child_id", "")
    elif hook == H.TRANSFORM_TOOL_RESULT:
        # Both contracts: the code's (input/content) and the docs' (args/result).
        if "content" not in req and "result" in req:
            req["content"] = req["result"]
        if "result" not in req and "content" in req:
            req["result"] = req["content"]
        if "input" not in req and "args" in req:
            req["input"] = req["args"]
        if "args" not in req and "input" in req:
            req["args"] = req["input"]
        req.setdefault("agent_id", "")
        req.setdefault("tool_name", "")
        req.setdefault("tool_use_id", "")
        req.setdefault("input", {})
        req.setdefault("args", req["input"])
        req.setdefault("content", "")
        req.setdefault("result", req["content"])
        req.setdefault("is_error", False)
        req.setdefault("status", "error" if req["is_error"] else "success")
    return req


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _positive_int(value: Any, default: int) -> int:
    """Agents send numbers; anything else (missing, text, negative, bool) becomes the configured default."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return int(value)


def truncate_message(message: Any, limit: int) -> Any:
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, str) and len(content) > limit:
        return {**message, "content": content[:limit]}
    if isinstance(content, list):
        blocks = []
        for b in content:
            if isinstance(b, dict):
                for key in ("text", "content", "thinking"):
                    if isinstance(b.get(key), str) and len(b[key]) > limit:
                        b = {**b, key: b[key][:limit]}
            blocks.append(b)
        return {**message, "content": blocks}
    return message
