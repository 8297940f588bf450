#!/usr/bin/env python3
"""Every LibreFang context-engine hook of this plugin: the request (one JSON object on stdin, its `type` naming the
hook) is POSTed to the service's `/api/context-engine/hooks/<hook>`, and the service's answer is printed as one JSON
line on stdout. Python's standard library only: LibreFang runs it with the system python.

The service unreachable, or answering an error, after retries within LIBREFANG_BRIDGE_DEADLINE: the hook answers
what leaves LibreFang's own engine in charge (no memories, an empty message list, which LibreFang replaces with
its default trimming or compaction, `skip` for a tool result, `ok` otherwise), says why on stderr, and exits 0,
so the agent's turn goes on as if the plugin were not installed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

HOOKS = {"ingest", "after_turn", "bootstrap", "assemble", "compact", "prepare_subagent", "merge_subagent",
         "transform_tool_result", "on_event"}
DEFAULTS = {"ingest": {"type": "ingest_result", "memories": []},
            "assemble": {"type": "assemble_result", "messages": []},
            "compact": {"type": "compact_result", "messages": []},
            "transform_tool_result": {"type": "skip"}}
RETRIED = {503, 502, 504}  # the service (or its job bus) restarting: worth another try within the deadline


class Unanswered(Exception):
    """The service gave no usable answer."""


def setting(name: str, default: str) -> str:
    return os.environ.get(name, "").strip() or default


def default_answer(hook: str) -> dict:
    return DEFAULTS.get(hook, {"type": "ok"})


def post(url: str, token: str, body: bytes, timeout: float) -> tuple[int, bytes, str | None]:
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), None
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Retry-After")


def wait_before_retry(retry_after: str | None, attempt: int) -> float:
    try:
        return max(0.0, float(retry_after)) if retry_after else 0.25 * 2 ** attempt
    except ValueError:
        return 0.25 * 2 ** attempt


def forward(hook: str, request: dict, deadline: float) -> dict:
    """The service's answer to the hook, retried through 502/503/504 and connection failures until the deadline."""
    url = setting("LIBREFANG_BRIDGE_URL", "http://127.0.0.1:4545").rstrip("/") + "/api/context-engine/hooks/" + hook
    body = json.dumps({k: v for k, v in request.items() if k != "type"}).encode()
    end = time.monotonic() + deadline
    attempt, why = 0, "no attempt"
    while (left := end - time.monotonic()) > 0:
        try:
            status, raw, retry_after = post(url, setting("LIBREFANG_BRIDGE_TOKEN", ""), body, left)
        except (OSError, urllib.error.URLError) as error:  # refused, reset, timed out
            status, raw, retry_after, why = 0, b"", None, f"unreachable: {error}"
        if status in (200, 202):
            return answer(hook, status, raw)
        if status:
            why = f"HTTP {status}: {raw[:300].decode(errors='replace')}"
        if status and status not in RETRIED:
            break
        time.sleep(min(wait_before_retry(retry_after, attempt), max(0.0, end - time.monotonic())))
        attempt += 1
    raise Unanswered(why)


def answer(hook: str, status: int, raw: bytes) -> dict:
    if status == 202:  # after_turn / on_event: stored, a worker processes it
        return {"type": "ok"}
    reply = json.loads(raw)
    if not isinstance(reply, dict):
        raise Unanswered(f"the service answered {type(reply).__name__}, not an object")
    reply.setdefault("type", default_answer(hook)["type"])
    return reply


def main() -> int:
    try:
        request = json.loads(sys.stdin.read() or "{}")
    except ValueError as error:
        print(f"librefang-bridge: the request is not JSON: {error}", file=sys.stderr)
        return 1
    hook = request.get("type") if isinstance(request, dict) else None
    if hook not in HOOKS:
        print(f"librefang-bridge: unknown hook type {hook!r}", file=sys.stderr)
        return 1
    deadline = float(setting("LIBREFANG_BRIDGE_DEADLINE", "10"))
    try:
        reply = forward(hook, request, deadline)
    except (Unanswered, ValueError) as problem:
        print(f"librefang-bridge: {hook}: the service did not answer ({problem}); LibreFang's default applies",
              file=sys.stderr)
        reply = default_answer(hook)
    print(json.dumps(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main())
